"""The OpenSandbox provider against the REAL ``opensandbox-server`` (1.1.1, started by a fixture on
127.0.0.1 with an API key, Docker host networking and a temp state dir).

The daemon inside each sandbox is our **execd stand-in** (``tests/fixtures/execd_standin``): the real
execd is a Go binary that is not obtainable on this machine (no registry, no package ships it). The
stand-in follows the published execd API, records every request with its wall-clock time, counts
command submissions, and injects faults on request (drop a command's status, close the stream
mid-command, answer 502 before starting, stall). Everything else – sandbox lifecycle, container
state, the OOM killer, the server's diagnostics – is real.

Host networking means every sandbox's execd binds the same port: these tests hold one sandbox at a
time.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest

from opencode_tui_core.failures import (
    CommandDetails,
    Delivery,
    GenericDetails,
    HttpDetails,
    OomDetails,
    decide,
)
from opencode_tui_core.sandbox.base import (
    LABEL_OWNER,
    LABEL_RUN,
    ExpectedRefusal,
    Recovery,
    SandboxError,
    SandboxState,
)
from opencode_tui_core.sandbox.oom import oom_confirmed
from opencode_tui_core.sandbox.opensandbox.oom_rules import SOURCE_OS_DIAGNOSTICS, SOURCE_OS_LIFECYCLE
from opencode_tui_core.sandbox.opensandbox.provider import OpenSandboxProvider, OpenSandboxSandbox

pytestmark = [pytest.mark.docker, pytest.mark.opensandbox, pytest.mark.timeout(120)]

# The sandbox's main process: idle until /tmp/go exists, then allocate until the OOM killer ends it.
OOM_MAIN = [
    "python3",
    "-c",
    "import os, time\n"
    "while not os.path.exists('/tmp/go'):\n    time.sleep(0.05)\n"
    "blocks = []\n"
    "while True:\n    blocks.append(bytearray(16 << 20))\n",
]
SMALL_MEMORY = 128 << 20


class Journal:
    """Every HTTP request the provider makes (httpx event hook): wall-clock time, method, path."""

    def __init__(self) -> None:
        self.entries: list[tuple[float, str, str]] = []

    async def hook(self, request: httpx.Request) -> None:
        self.entries.append((time.time(), request.method, request.url.path))

    def paths(self, needle: str, since: float = 0.0) -> list[tuple[float, str, str]]:
        return [e for e in self.entries if needle in e[2] and e[0] >= since]


@pytest.fixture
def standin(standin_harness: Any, opensandbox_server: Any) -> Iterator[Any]:
    """The stand-in's controls (faults, request log, submission count) at the execd port."""
    control = standin_harness.StandinControl(f"http://127.0.0.1:{opensandbox_server.execd_port}")
    yield control
    try:
        control.clear()
    except httpx.HTTPError:
        pass  # the sandbox (and its daemon) is already gone


@pytest.fixture
async def os_env(
    opensandbox_server: Any,
    opensandbox_settings_factory: Callable[..., Any],
    spec_factory: Callable[..., Any],
    test_run_id: str,
) -> AsyncIterator[Any]:
    """Make providers (each with a request journal) and owned sandboxes; release everything."""
    made: list[OpenSandboxProvider] = []
    sandboxes: list[OpenSandboxSandbox] = []

    class Env:
        server = opensandbox_server
        journal = Journal()
        run_id = test_run_id
        spec = staticmethod(spec_factory)
        settings = staticmethod(opensandbox_settings_factory)

        def provider(
            self,
            main_argv: list[str] | None = None,
            hooks: Sequence[Callable[[httpx.Request], Awaitable[None]]] = (),
            **settings: Any,
        ) -> OpenSandboxProvider:
            p = OpenSandboxProvider(
                opensandbox_settings_factory(**settings),
                api_key=opensandbox_server.api_key,
                main_argv=main_argv,
                event_hooks={"request": [self.journal.hook, *hooks]},
            )
            made.append(p)
            return p

        async def sandbox(
            self, provider: OpenSandboxProvider | None = None, **spec: Any
        ) -> OpenSandboxSandbox:
            sb = await (provider or self.provider()).create(spec_factory(**spec))
            sandboxes.append(sb)
            return sb

        def api(self, method: str, path: str) -> httpx.Response:
            return httpx.request(
                method,
                f"{opensandbox_server.url}/v1{path}",
                headers={"OPEN-SANDBOX-API-KEY": opensandbox_server.api_key},
                timeout=30,
            )

    try:
        yield Env()
    finally:
        for sb in sandboxes:
            try:
                await sb.release()
            except SandboxError:
                pass
        for p in made:
            await p.aclose()


def _containers(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.split()


def _deltas(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int]:
    return after["submissions"] - before["submissions"], after["started"] - before["started"]


# ------------------------------------------------------------------------------------- round trip


async def test_create_exec_file_delete_round_trip(os_env: Any, standin: Any) -> None:
    provider = os_env.provider()
    provider.owner = "someone@host.example"  # '@' is not allowed in a label value: sanitised
    sb = await os_env.sandbox(provider, env={"GREETING": "hi"}, labels={"opencode-tui.task": "round-trip"})
    record = await sb.lifecycle()
    assert record["status"]["state"] == "Running"
    assert record["metadata"][LABEL_RUN] == os_env.run_id
    assert record["metadata"][LABEL_OWNER] == "someone_host.example"
    assert record["metadata"]["opencode-tui.task"] == "round-trip"
    assert (await sb.status()).state is SandboxState.RUNNING

    result = await sb.exec(
        ["sh", "-c", 'echo "$GREETING $X"; pwd; echo e >&2; exit 5'], env={"X": "there"}, timeout=30
    )
    assert (result.observed, result.exit_code) == (True, 5)
    assert result.stdout == b"hi there\n/app\n" and result.stderr == b"e\n"
    assert sb.remote_ids[result.execution_id]  # execd's own execution id is kept

    await sb.upload_file("/app/data/blob.bin", b"\x00\x01binary\xff" * 1000, mode=0o640)
    assert await sb.download_file("/app/data/blob.bin") == b"\x00\x01binary\xff" * 1000
    assert (await sb.exec(["stat", "-c", "%a", "/app/data/blob.bin"], timeout=30)).text() == "640\n"
    expires = await sb.renew(1800)
    assert expires.timestamp() > time.time() + 1700
    port = os_env.server.execd_port
    endpoint, _headers = await sb.endpoint(port)
    assert endpoint == f"127.0.0.1:{port}"

    # The server's API key goes to the server only, never to the daemon inside the sandbox.
    assert standin.requests() and not any(r["server_key"] for r in standin.requests())

    sid = sb.sandbox_id
    await sb.release()
    await sb.release()  # idempotent
    assert os_env.api("GET", f"/sandboxes/{sid}").status_code == 404
    assert _containers(f"opensandbox.io/id={sid}") == []


# ------------------------------------------------------------------------------------------- OOM


async def test_real_oom_of_the_main_process_without_a_structured_report_is_a_lost_sandbox(
    os_env: Any,
) -> None:
    """The main process is OOM-killed while a command runs. Server 1.1.1 reports it as
    Failed / CONTAINER_EXITED_ERROR (no OOM code), and its diagnostics text is not read for an OOM
    by default: the failure is the sandbox's loss, the OOM stays unclaimed, and no diagnostics
    request is made."""
    provider = os_env.provider(main_argv=OOM_MAIN)
    sb = await os_env.sandbox(provider, memory_bytes=SMALL_MEMORY)
    since = time.time()
    start = time.monotonic()
    with pytest.raises(SandboxError) as info:
        await sb.exec(["sh", "-c", "echo started; touch /tmp/go; sleep 60"], timeout=20)
    assert time.monotonic() - start < 20
    failure = info.value.failure
    assert failure is not None and failure.kind == "sandbox_lost"
    assert oom_confirmed(failure.evidence, scope=sb.sandbox_id) is None
    lifecycle = [e for e in failure.evidence if e.source == SOURCE_OS_LIFECYCLE]
    assert lifecycle and lifecycle[-1].data["state"] == "Failed"
    assert (
        lifecycle[-1].data["reason"] == "CONTAINER_EXITED_ERROR"
        and lifecycle[-1].data["oom_reported"] is False
    )
    assert os_env.journal.paths("/diagnostics/", since=since) == []
    # The public inspect() still shows the events report to people; it confirms nothing by default.
    evidence = await sb.inspect()
    report = next(e for e in evidence if e.data.get("endpoint") == "diagnostics/events")
    assert report.data["OOMKilled"] is True and report.data["admitted"] is False
    assert oom_confirmed(evidence, scope=sb.sandbox_id) is None
    assert [e for e in evidence if e.data.get("endpoint") == "diagnostics/inspect"] == []


async def test_real_oom_of_the_main_process_is_confirmed_from_the_server_report_when_opted_in(
    os_env: Any,
) -> None:
    """With ``oom_from_diagnostics`` on: the stream drops, the lifecycle turns Failed, and the OOM is
    confirmed from the server's own diagnostics within the deadline."""
    provider = os_env.provider(main_argv=OOM_MAIN, oom_from_diagnostics=True)
    sb = await os_env.sandbox(provider, memory_bytes=SMALL_MEMORY)
    start = time.monotonic()
    with pytest.raises(SandboxError) as info:
        await sb.exec(["sh", "-c", "echo started; touch /tmp/go; sleep 60"], timeout=20)
    elapsed = time.monotonic() - start
    assert elapsed < 20, f"diagnosis overran the execution's hard cap: {elapsed:.1f}s"

    failure = info.value.failure
    assert failure is not None and failure.kind == "provider_oom_killed"
    assert isinstance(failure.details, OomDetails) and failure.details.container_id == sb.sandbox_id
    assert failure.details.memory_limit_bytes == SMALL_MEMORY
    assert failure.cause is not None  # the original error (the broken stream / unreachable daemon)
    # An OOM keeps its own precedence: whatever status the poll that noticed it got (a 502 from the
    # server's proxy to a dead daemon) stays in the cause, never in the policy's status table.
    assert failure.http_status is None
    assert decide(failure).rule == "provider_oom_killed@agent" and decide(failure).action == "count_as_zero"
    piece = oom_confirmed(failure.evidence, scope=sb.sandbox_id)
    assert piece is not None and piece.source == SOURCE_OS_DIAGNOSTICS
    assert piece.data["endpoint"] == "diagnostics/events" and piece.data["subject"] == sb.sandbox_id
    lifecycle = [e for e in failure.evidence if e.source == SOURCE_OS_LIFECYCLE]
    assert lifecycle and lifecycle[-1].data["state"] == "Failed"
    # Server 1.1.1 does not name the OOM in the status ("exited with code 137"): not evidence alone.
    assert lifecycle[-1].data["oom_reported"] is False and "137" in lifecycle[-1].data["message"]
    assert [f.kind for f in sb.failures][:1] == ["command_stream_lost"]
    assert (await sb.status()).state is SandboxState.FAILED


async def test_a_refused_submission_still_reads_the_lifecycle_for_an_oom(os_env: Any, standin: Any) -> None:
    """The daemon refuses a submission (409, injected by the stand-in) just as the sandbox's main
    process starts exhausting its memory (the stand-in creates the file it waits for: the OOM is
    real). A 4xx is not the end of it: the lifecycle is read, and the failure is the OOM."""
    provider = os_env.provider(main_argv=OOM_MAIN, oom_from_diagnostics=True)
    sb = await os_env.sandbox(provider, memory_bytes=SMALL_MEMORY)
    standin.inject({"fault": "refuse_status", "match": "refused", "status": 409, "touch": "/tmp/go"})
    with pytest.raises(SandboxError) as info:
        await sb.exec(["sh", "-c", "true # refused"], timeout=20)
    failure = info.value.failure
    assert failure is not None and failure.kind == "provider_oom_killed", failure
    assert failure.cause is not None and "409" in failure.cause.message  # the refusal stays the cause
    assert failure.http_status is None  # an OOM is decided by its kind, not by the refusal's status
    assert oom_confirmed(failure.evidence, scope=sb.sandbox_id) is not None


async def test_exit_137_without_an_oom_report_stays_unconfirmed(os_env: Any) -> None:
    sb = await os_env.sandbox(memory_bytes=SMALL_MEMORY)
    killed = await sb.exec(["sh", "-c", "sh -c 'kill -9 $$'; exit $?"], timeout=30)
    assert (killed.observed, killed.exit_code) == (True, 137)
    # A command the kernel really OOM-kills inside a still-running sandbox: exit 137 only.
    hog = await sb.exec(
        ["sh", "-c", "python3 -c 'b = [bytearray(16 << 20) for _ in range(64)]'; exit $?"], timeout=60
    )
    assert (hog.observed, hog.exit_code) == (True, 137)
    evidence = await sb.inspect()
    assert oom_confirmed(evidence, scope=sb.sandbox_id) is None
    assert {e.source for e in evidence} == {SOURCE_OS_LIFECYCLE, SOURCE_OS_DIAGNOSTICS}
    assert all(e.scope == sb.sandbox_id for e in evidence)
    assert (await sb.status()).state is SandboxState.RUNNING
    assert sb.failures == []


# The sandbox's main process: idle until /tmp/go exists, then exit 3 (an ordinary failure, no OOM).
FAILING_MAIN = ["sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; exit 3"]


@pytest.mark.parametrize(
    "rewrite, kind",
    [
        ({"message": "npm ERR! JavaScript heap out of memory"}, "sandbox_lost"),
        ({"message": "Sandbox container was OOM killed (out of memory)"}, "sandbox_lost"),
        ({"reason": "OOMKilled"}, "provider_oom_killed"),
    ],
    ids=["npm-message", "oom-words-message", "oomkilled-code"],
)
async def test_lifecycle_oom_comes_from_the_reason_code_never_the_message(
    os_env: Any, standin_harness: Any, rewrite: dict[str, str], kind: str
) -> None:
    """The sandbox's main process really dies while a command runs, and the real server reports it
    Failed. Server 1.1.1 cannot put OOM words in its status message nor an OOM reason code, so a
    loopback proxy in front of it rewrites just that field of the terminal status (the one fake,
    see ``LifecycleRewriter``). A message saying "out of memory" is not an OOM; the structured
    ``OOMKilled`` reason code in the terminal state is."""
    rewriter = standin_harness.LifecycleRewriter(os_env.server.url, rewrite)
    try:
        provider = os_env.provider(main_argv=FAILING_MAIN, url=rewriter.url)
        sb = await os_env.sandbox(provider)
        with pytest.raises(SandboxError) as info:
            await sb.exec(["sh", "-c", "echo started; touch /tmp/go; sleep 60"], timeout=20)
        failure = info.value.failure
        assert failure is not None and failure.kind == kind, failure.message
        assert rewriter.rewritten >= 1
        lifecycle = [e for e in failure.evidence if e.source == SOURCE_OS_LIFECYCLE]
        assert lifecycle[-1].data["state"] == "Failed"
        for field, value in rewrite.items():
            assert lifecycle[-1].data[field] == value  # the provider saw the rewritten status
        confirmed = oom_confirmed(failure.evidence, scope=sb.sandbox_id)
        if kind == "provider_oom_killed":
            assert confirmed is lifecycle[-1] and confirmed.data["oom_reason_code"] == "OOMKilled"
            assert isinstance(failure.details, OomDetails) and failure.details.container_id == sb.sandbox_id
        else:
            assert confirmed is None and lifecycle[-1].data["oom_reported"] is False
        await sb.release()
    finally:
        rewriter.close()


# ------------------------------------------------------------------------------- command delivery


async def test_stream_dropped_mid_command_recovers_by_execution_id_without_resubmitting(
    os_env: Any, standin: Any
) -> None:
    sb = await os_env.sandbox()
    reported: list[tuple[str, Recovery]] = []
    sb.on_recovered = lambda failure, how: reported.append((failure.kind, how))
    standin.inject({"fault": "close_stream", "match": "drop-me", "after_bytes": 1})
    before = standin.state()
    seen: list[bytes] = []
    result = await sb.exec(
        ["sh", "-c", "echo first; sleep 1; echo second >&2; echo third; exit 7 # drop-me"],
        timeout=30,
        on_output=lambda chunk: seen.append(chunk.data),
    )
    assert (result.observed, result.exit_code) == (True, 7)
    assert result.stdout.startswith(b"first\n")
    assert b"second" in result.stdout and b"third" in result.stdout  # from the command's combined log
    assert b"".join(seen) == result.stdout + result.stderr
    assert _deltas(before, standin.state()) == (1, 1), "the command was resubmitted"
    remote = sb.remote_ids[result.execution_id]
    assert [r for r in standin.requests("status") if remote in r["path"]]
    [lost] = sb.failures
    assert lost.kind == "command_stream_lost"
    assert isinstance(lost.details, CommandDetails)
    assert (lost.details.delivery, lost.details.execution_id, lost.details.submissions) == (
        Delivery.DELIVERED,
        remote,
        1,
    )
    assert reported == [("command_stream_lost", Recovery.FOLLOWED_EXECUTION_ID)]  # to the event stream


async def test_502_before_start_is_resubmitted_and_policy_override_changes_only_the_action(
    os_env: Any, standin: Any
) -> None:
    sb = await os_env.sandbox()
    reported: list[tuple[str, Recovery]] = []
    sb.on_recovered = lambda failure, how: reported.append((failure.kind, how))
    standin.inject({"fault": "reject_502", "match": "five-oh-two"})
    before = standin.state()
    result = await sb.exec(["sh", "-c", "echo ok # five-oh-two"], timeout=30)
    assert result.ok and result.stdout == b"ok\n"
    assert _deltas(before, standin.state()) == (2, 1)  # resubmitted once, started once
    [first] = sb.failures
    assert (first.kind, first.http_status) == ("provider_unavailable", 502)
    assert isinstance(first.details, CommandDetails) and first.details.delivery is Delivery.NOT_SENT
    assert reported == [("provider_unavailable", Recovery.RESUBMITTED)]

    # The same sandbox through a provider whose policy fails on a submission 502 instead.
    strict = os_env.provider(
        policy={"http_status": {"submit:502": "fail"}, "evidence_polling": {"budget_s": 0.5}}
    )
    borrowed = await strict.connect(sb.sandbox_id)
    standin.inject({"fault": "reject_502", "match": "five-oh-two"})
    before = standin.state()
    with pytest.raises(SandboxError) as info:
        await borrowed.exec(["sh", "-c", "echo ok # five-oh-two"], timeout=30)
    assert _deltas(before, standin.state()) == (1, 0)  # not resubmitted
    failure = info.value.failure
    assert failure is not None
    assert (failure.kind, failure.http_status) == (first.kind, first.http_status)  # same classification
    assert isinstance(failure.details, CommandDetails) and failure.details.delivery is Delivery.NOT_SENT

    # Status recovery disabled: a dropped stream is not followed, yet it is still classified the same.
    no_recovery = os_env.provider(
        policy={"status_recovery": {"enabled": False}, "evidence_polling": {"budget_s": 0}}
    )
    third = await no_recovery.connect(sb.sandbox_id)
    standin.inject({"fault": "close_stream", "match": "no-follow"})
    status_before = len(standin.requests("status"))
    with pytest.raises(SandboxError) as info:
        await third.exec(["sh", "-c", "echo a; sleep 0.5; echo b # no-follow"], timeout=30)
    assert info.value.failure is not None and info.value.failure.kind == "command_status_lost"
    assert [f.kind for f in third.failures] == ["command_stream_lost"]
    assert len(standin.requests("status")) == status_before
    await borrowed.release()
    await third.release()
    assert (await sb.status()).state is SandboxState.RUNNING  # borrowed release never deletes


async def test_hard_cap_keeps_the_outcome_unknown_and_starts_no_diagnosis_after_it(
    os_env: Any, standin: Any
) -> None:
    sb = await os_env.sandbox()
    reported: list[tuple[str, Recovery]] = []
    sb.on_recovered = lambda failure, how: reported.append((failure.kind, how))
    standin.inject(
        {"fault": "close_stream", "match": "capped", "after_bytes": 1},
        {"fault": "stall_status", "match": "capped", "seconds": 20},
    )
    start_wall, start = time.time(), time.monotonic()
    result = await sb.exec(["sh", "-c", "echo x; sleep 30 # capped"], timeout=3)
    cap_wall = start_wall + 3.0
    assert time.monotonic() - start < 3.0 + 2.0  # the cap, and slack for a busy machine
    assert (result.exit_code, result.observed, result.deadline_expired) == (None, False, True)
    await asyncio.sleep(2.0)  # anything started late would show up now

    daemon = [r for r in standin.requests() if r["t"] >= start_wall]
    assert [r["op"] for r in daemon][:2] == ["submit", "status"]
    late = [r for r in daemon if r["t"] > cap_wall + 0.05]
    assert late == [], f"requests reached the daemon after the hard cap: {late}"
    ours = os_env.journal.paths("/", since=start_wall)
    assert [e for e in ours if e[0] > cap_wall + 0.05] == []
    kinds = [f.kind for f in sb.failures]
    assert kinds == ["command_stream_lost", "command_hard_cap_expired"]
    # The stream loss was not recovered (the cap came first): only the hard cap is reported.
    assert reported == [("command_hard_cap_expired", Recovery.RETURNED_UNOBSERVED)]
    assert sb.failures[-1].cause is not None
    assert isinstance(sb.failures[-1].details, CommandDetails) and sb.failures[-1].details.exit_code is None


async def test_opted_in_diagnosis_stays_inside_the_hard_cap(os_env: Any, standin: Any) -> None:
    """With ``oom_from_diagnostics`` on, the status is lost while the sandbox keeps running: the
    diagnosis reads the lifecycle, makes its one initial report round and watches the lifecycle,
    but starts nothing once the execution's hard cap has passed (its watch budget is longer)."""
    provider = os_env.provider(oom_from_diagnostics=True, policy={"evidence_polling": {"budget_s": 60}})
    sb = await os_env.sandbox(provider)
    standin.inject(
        {"fault": "close_stream", "match": "watched", "after_bytes": 1},
        {"fault": "drop_status", "match": "watched", "times": 10},
    )
    start_wall, start = time.time(), time.monotonic()
    with pytest.raises(SandboxError) as info:
        await sb.exec(["sh", "-c", "echo x; sleep 30 # watched"], timeout=4)
    assert time.monotonic() - start < 4.0 + 2.0
    await asyncio.sleep(1.5)  # anything started late would show up now
    ours = os_env.journal.paths("/", since=start_wall)
    assert [e for e in ours if e[0] > start_wall + 4.0 + 0.05] == [], "a request started after the cap"
    reports = os_env.journal.paths("/diagnostics/", since=start_wall)
    assert len(reports) == 1, reports  # the initial round; the sandbox never turned terminal
    assert len(os_env.journal.paths(f"/sandboxes/{sb.sandbox_id}", since=start_wall)) >= 3  # it watched
    failure = info.value.failure
    assert failure is not None and failure.kind == "command_status_lost"
    assert oom_confirmed(failure.evidence, scope=sb.sandbox_id) is None
    assert any(e.data.get("admitted") is True for e in failure.evidence if e.source == SOURCE_OS_DIAGNOSTICS)


async def test_a_diagnosis_cut_by_the_hard_cap_still_reports_the_lost_status(
    os_env: Any, standin: Any
) -> None:
    """A loaded machine: the event loop stalls inside the diagnosis's lifecycle read until past the
    exec's hard cap, so the cap and the diagnosis's own deadline come due in the same turn of the
    loop. The status was lost before the cap, so the loss is what is reported (with the evidence
    seen so far), not an unobserved timeout. The stall is a blocking sleep in an httpx request hook:
    the loop itself stops, as it does when the machine is busy."""
    cap = 4.0
    armed: list[str] = []  # the sandbox id, once created: creating it reads the lifecycle too
    stalled: list[float] = []

    async def stall_the_loop(request: httpx.Request) -> None:
        lifecycle = armed and request.method == "GET" and request.url.path.endswith(f"/sandboxes/{armed[0]}")
        if lifecycle and not stalled:
            stalled.append(time.monotonic())
            time.sleep(max(start + cap + 0.3 - time.monotonic(), 0.0))  # blocks the loop past the cap

    provider = os_env.provider(hooks=[stall_the_loop], policy={"evidence_polling": {"budget_s": 60}})
    sb = await os_env.sandbox(provider)
    armed.append(sb.sandbox_id)
    standin.inject(
        {"fault": "close_stream", "match": "cut-short", "after_bytes": 1},
        {"fault": "drop_status", "match": "cut-short", "times": 10},
    )
    start = time.monotonic()
    with pytest.raises(SandboxError) as info:
        await sb.exec(["sh", "-c", "echo x; sleep 30 # cut-short"], timeout=cap)
    assert stalled, "the diagnosis never read the lifecycle"
    assert time.monotonic() - start < cap + 2.0
    failure = info.value.failure
    assert failure is not None and failure.kind == "command_status_lost", failure
    assert failure.message.endswith("(diagnosis deadline reached)"), failure.message
    assert [f.kind for f in sb.failures][:1] == ["command_stream_lost"]
    assert "command_hard_cap_expired" not in [f.kind for f in sb.failures]


async def test_late_terminal_transition_gets_exactly_one_final_inspect(os_env: Any, standin: Any) -> None:
    """The status is lost while the sandbox still runs (initial report: no OOM); its main process is
    OOM-killed a moment later, and the terminal lifecycle earns one final report that confirms it."""
    provider = os_env.provider(
        main_argv=OOM_MAIN, oom_from_diagnostics=True, policy={"evidence_polling": {"budget_s": 15}}
    )
    sb = await os_env.sandbox(provider, memory_bytes=SMALL_MEMORY)
    standin.inject(
        {"fault": "close_stream", "match": "late-oom", "after_bytes": 1},
        {"fault": "drop_status", "match": "late-oom", "times": 10},
    )
    since = time.time()
    with pytest.raises(SandboxError) as info:
        await sb.exec(["sh", "-c", "echo go; sleep 1.5; touch /tmp/go; sleep 60 # late-oom"], timeout=30)
    failure = info.value.failure
    assert failure is not None and failure.kind == "provider_oom_killed"
    reports = os_env.journal.paths("/diagnostics/", since=since)
    assert len(reports) == 2, reports  # initial (non-terminal) + one final
    lifecycle = [e for e in failure.evidence if e.source == SOURCE_OS_LIFECYCLE]
    first_failed = next(e for e in lifecycle if e.data["state"] == "Failed")
    assert lifecycle[0].data["state"] == "Running"
    after_terminal = [r for r in reports if r[0] >= first_failed.observed_at.timestamp() - 0.01]
    assert len(after_terminal) == 1
    reports_seen = [e for e in failure.evidence if e.source == SOURCE_OS_DIAGNOSTICS]
    assert [e.data["OOMKilled"] for e in reports_seen] == [False, True]


# ------------------------------------------------------------------------------ readiness, refusal


async def test_readiness_failure_deletes_the_half_created_sandbox(os_env: Any) -> None:
    provider = os_env.provider()
    with pytest.raises(SandboxError) as info:
        await provider.create(os_env.spec(env={"EXECD_STANDIN_MODE": "mute"}, ready_timeout_s=2.0))
    failure = info.value.failure
    assert failure is not None and failure.kind == "sandbox_not_ready"
    assert isinstance(failure.details, GenericDetails)
    sid = failure.details.data["sandbox_id"]
    assert failure.details.data["deleted"] is True
    assert os_env.api("GET", f"/sandboxes/{sid}").status_code == 404
    assert _containers(f"opensandbox.io/id={sid}") == []
    logs = [e for e in failure.evidence if e.data.get("endpoint") == "diagnostics/logs"]
    assert logs and "mute mode" in logs[0].data["content_excerpt"]


async def test_expected_refusal_is_control_flow_without_a_failure_event(os_env: Any, standin: Any) -> None:
    sb = await os_env.sandbox()
    standin.inject({"fault": "refuse_root", "match": "as-root"})
    before = standin.state()
    with pytest.raises(ExpectedRefusal) as info:
        await sb.exec(["sh", "-c", "id -u # as-root"], uid=0, timeout=30)
    assert info.value.failure is None and info.value.code == "ROOT_NOT_ALLOWED"
    assert info.value.http_status == 403
    assert _deltas(before, standin.state()) == (1, 0)  # refused before anything started
    assert sb.failures == []

    # The configured default user: a confirmed refusal falls back to the image's user, silently.
    fallback = os_env.provider(command_uid=0)
    borrowed = await fallback.connect(sb.sandbox_id)
    standin.inject({"fault": "refuse_root", "match": "as-root"})
    before = standin.state()
    result = await borrowed.exec(["sh", "-c", "id -u # as-root"], timeout=30)
    assert result.ok and result.text() == "0\n"
    assert _deltas(before, standin.state()) == (2, 1)
    assert borrowed.failures == []
    await borrowed.release()


# ------------------------------------------------------------------------ allocation and lifecycle


async def test_allocation_failures_are_typed(os_env: Any) -> None:
    provider = os_env.provider()
    with pytest.raises(SandboxError) as info:
        await provider.create(os_env.spec(image="opencode-tui/does-not-exist:never"))
    failure = info.value.failure
    assert failure is not None and failure.kind == "provider_image_missing"
    assert failure.http_status is not None and failure.cause is not None
    assert isinstance(failure.details, HttpDetails) and failure.details.method == "POST"

    with pytest.raises(SandboxError) as info:
        await provider.create(os_env.spec(labels={"not a valid key!": "x"}))
    failure = info.value.failure
    assert failure is not None and (failure.kind, failure.http_status) == ("sandbox_allocation_failed", 400)

    wrong_key = OpenSandboxProvider(os_env.settings(), api_key="wrong")
    with pytest.raises(SandboxError) as info:
        await wrong_key.create(os_env.spec())
    failure = info.value.failure
    assert failure is not None and (failure.kind, failure.http_status) == ("provider_auth_failed", 401)
    await wrong_key.aclose()

    nobody = OpenSandboxProvider(os_env.settings(url="http://127.0.0.1:9"), api_key="k")
    with pytest.raises(SandboxError) as info:
        await nobody.create(os_env.spec())
    failure = info.value.failure
    assert failure is not None and failure.kind == "provider_unavailable" and failure.http_status is None
    assert "is the OpenSandbox server running" in failure.message
    await nobody.aclose()
    assert _containers(f"{LABEL_RUN}={os_env.run_id}") == []


async def test_sandbox_deleted_behind_our_back_is_lost_for_exec_and_pty(os_env: Any) -> None:
    sb = await os_env.sandbox()
    reported: list[tuple[str, Recovery]] = []
    sb.on_recovered = lambda failure, how: reported.append((failure.kind, how))
    pty = await sb.pty(["bash", "--norc", "--noprofile", "-i"])
    assert os_env.api("DELETE", f"/sandboxes/{sb.sandbox_id}").status_code == 204
    with pytest.raises(SandboxError) as info:
        await sb.exec(["true"], timeout=15)
    failure = info.value.failure
    assert failure is not None and failure.kind == "sandbox_lost"
    assert any(e.source == SOURCE_OS_LIFECYCLE and e.data["exists"] is False for e in failure.evidence)
    assert (await sb.status()).state is SandboxState.GONE
    for _ in range(100):  # the terminal ends: some buffered output, then b""
        if await asyncio.wait_for(pty.read(), 15) == b"":
            break
    assert pty.failure is not None and pty.failure.kind == "sandbox_lost"
    assert pty.failure in sb.failures
    # the broken terminal is reported too (an event in events.jsonl), diagnosed as the sandbox's loss
    assert ("sandbox_lost", Recovery.TERMINAL_ENDED) in reported
    await sb.release()  # already gone: still fine


async def test_pty_reattaches_once_when_its_socket_drops(os_env: Any, standin: Any) -> None:
    """The drop and the re-attach are an observation reported to ``on_recovered`` (the episode puts
    it in events.jsonl as ``FailureRecovered``), not only kept in the provider's memory."""
    sb = await os_env.sandbox()
    reported: list[tuple[str, Recovery, dict[str, Any]]] = []
    sb.on_recovered = lambda failure, how: reported.append((failure.kind, how, failure.details.data))
    pty = await sb.pty(["bash", "--norc", "--noprofile", "-i"])
    try:
        standin.inject({"fault": "close_pty", "after_bytes": 1})
        await pty.write(b"echo be''fore\n")
        buf = b""
        deadline = time.monotonic() + 15
        while b"before" not in buf:
            assert time.monotonic() < deadline, buf
            chunk = await asyncio.wait_for(pty.read(), 15)
            assert chunk, f"the terminal ended instead of re-attaching: {pty.failure}"
            buf += chunk
        for _ in range(100):  # the drop may come right after the frame that held "before"
            if len(standin.requests("pty_ws")) >= 2:
                break
            await asyncio.sleep(0.05)
        attaches = standin.requests("pty_ws")
        assert len(attaches) == 2, attaches  # the first socket dropped; exactly one re-attach
        assert "since=0" not in attaches[1]["path"]  # it resumed from where the first one stopped
        await pty.write(b"echo af''ter\n")
        while b"after" not in buf:
            buf += await asyncio.wait_for(pty.read(), 15)
        assert pty.failure is None
        [(kind, how, data)] = reported
        assert (kind, how, data["session_id"]) == ("sandbox_pty_failed", Recovery.REATTACHED, pty.session_id)
        assert f"since={data['output_offset']}" in attaches[1]["path"]  # the offset it resumed from
    finally:
        await pty.close()


async def test_sweep_removes_leftovers_by_owner_label(os_env: Any) -> None:
    provider = os_env.provider()
    provider.owner = f"sweep-{os_env.run_id}"
    sb = await provider.create(os_env.spec())
    try:
        listed = await provider.sweep(dry_run=True, owner=provider.owner)
        assert listed == [sb.sandbox_id]
        assert await provider.sweep(dry_run=True, owner="nobody-at-all") == []
        assert await provider.sweep(owner=provider.owner) == [sb.sandbox_id]
        assert os_env.api("GET", f"/sandboxes/{sb.sandbox_id}").status_code == 404
    finally:
        await sb.release()


@pytest.mark.parametrize("answer", [None, 503], ids=["dropped", "503-after-create"])
async def test_pty_create_is_never_sent_again_once_it_may_have_reached_the_daemon(
    os_env: Any, standin: Any, answer: int | None
) -> None:
    """The daemon starts the terminal and then drops the connection (or answers 503): the request
    was delivered. Both are failures the policy would retry for an idempotent read (provider
    unavailable, 503); ``POST /pty`` is sent exactly once and fails clearly instead."""
    sb = await os_env.sandbox()
    standin.inject(
        {"fault": "pty_create_lost", "match": "lost-pty", **({"status": answer} if answer else {})}
    )
    before = len(standin.requests("pty_create"))
    with pytest.raises(SandboxError) as info:
        await sb.pty(["sh", "-c", "sleep 30 # lost-pty"])
    assert len(standin.requests("pty_create")) - before == 1, "POST /pty was sent again"
    failure = info.value.failure
    assert failure is not None and failure.kind == "sandbox_pty_failed"
    assert failure.operation == "pty.open" and failure.cause is not None
    assert failure.http_status == answer
    assert "may have reached the daemon" in failure.message and "not requested again" in failure.message
    assert isinstance(failure.details, HttpDetails) and failure.details.method == "POST"
    # A terminal opened afterwards works (the daemon is fine; only that one answer was lost).
    pty = await sb.pty(["sh", "-c", "echo fine"])
    try:
        out = b""
        while b"fine" not in out:
            chunk = await asyncio.wait_for(pty.read(), 15)
            assert chunk, out
            out += chunk
    finally:
        await pty.close()
