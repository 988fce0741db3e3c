"""Docker-only behaviour: container settings, borrowed containers, real OOM evidence, sweep."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import docker.errors
import pytest

from opencode_tui_core.failures import Delivery, Evidence, FailureStage
from opencode_tui_core.sandbox.base import (
    LABEL_OWNER,
    LABEL_RUN,
    NetworkPolicy,
    SandboxClosedError,
    SandboxError,
    SandboxSpec,
    SandboxState,
)
from opencode_tui_core.sandbox.docker.provider import DockerProvider, DockerSandbox, default_owner
from opencode_tui_core.sandbox.oom import oom_confirmed

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]

BASE_IMAGE = "opencode-tui/base:bookworm"
MiB = 1 << 20
# The main process waits for /tmp/go, then allocates far beyond a 64 MiB limit.
MAIN_HOG = (
    "import os, time\n"
    "while not os.path.exists('/tmp/go'):\n"
    "    time.sleep(0.05)\n"
    "hog = bytearray(512 << 20)\n"
    "time.sleep(600)\n"
)

Factory = Callable[..., Awaitable[DockerSandbox]]


@pytest.fixture
async def create(docker_client: Any, spec_factory: Callable[..., SandboxSpec]) -> AsyncIterator[Factory]:
    """Create owned docker sandboxes (optionally through a custom provider); all released at the end."""
    created: list[DockerSandbox] = []

    async def make(provider: DockerProvider | None = None, **overrides: Any) -> DockerSandbox:
        sandbox = await (provider or DockerProvider()).create(spec_factory(**overrides))
        created.append(sandbox)
        return sandbox

    try:
        yield make
    finally:
        for sandbox in created:
            await sandbox.release()


@pytest.fixture
def sdk_containers(docker_client: Any, test_run_id: str) -> Iterator[Callable[..., Any]]:
    """Start containers directly with the SDK (labelled with the test run); removed at the end."""
    started: list[Any] = []

    def run(labels: dict[str, str] | None = None) -> Any:
        container = docker_client.containers.run(
            BASE_IMAGE,
            ["sleep", "infinity"],
            detach=True,
            network_mode="none",
            init=True,
            labels={LABEL_RUN: test_run_id, **(labels or {})},
        )
        started.append(container)
        return container

    try:
        yield run
    finally:
        for container in started:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


async def _poll(fn: Callable[[], Awaitable[Any]], until: Callable[[Any], bool], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await fn()
        if until(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.2)


# ---------------------------------------------------------------------------------------- create


async def test_owned_container_settings(create: Factory, docker_client: Any, test_run_id: str) -> None:
    sb = await create(
        memory_bytes=128 * MiB, cpus=0.5, env={"FOO": "bar"}, labels={"opencode-tui.test": "settings"}
    )
    attrs = docker_client.api.inspect_container(sb.sandbox_id)
    labels = attrs["Config"]["Labels"]
    assert labels[LABEL_RUN] == test_run_id
    assert labels[LABEL_OWNER] == default_owner()
    assert labels["opencode-tui.test"] == "settings"
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == host["MemorySwap"] == 128 * MiB
    assert host["NanoCpus"] == 500_000_000
    assert host["Init"] is True
    assert "FOO=bar" in attrs["Config"]["Env"]

    probe = await sb.exec(
        ["sh", "-c", 'test -d /app && pwd && echo "$FOO" && cat /proc/1/cmdline'], timeout=30
    )
    assert probe.ok
    lines = probe.text().splitlines()
    assert lines[:2] == ["/app", "bar"]
    assert "docker-init" in lines[2]

    status = await sb.status()
    assert status.state is SandboxState.RUNNING
    assert status.owned is True and status.provider == "docker"
    assert status.memory_limit_enforced is True
    assert {e.source for e in status.evidence} >= {"docker.state", "docker.events", "cgroup.memory"}
    assert all(e.scope == sb.sandbox_id for e in status.evidence)

    await sb.release()
    with pytest.raises(docker.errors.NotFound):
        docker_client.api.inspect_container(sb.sandbox_id)
    await sb.release()  # idempotent, and a container already gone is fine


async def test_host_network_reaches_host_loopback(create: Factory) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    try:
        port = listener.getsockname()[1]
        sb = await create(network=NetworkPolicy.HOST)
        code = (
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3).close(); print('ok')"
        )
        result = await sb.exec(["python3", "-c", code], timeout=30)
        assert result.ok and result.text() == "ok\n"
    finally:
        listener.close()


async def test_missing_image_is_reported_with_a_build_hint(create: Factory, docker_client: Any) -> None:
    run_id = f"pytest-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxError) as info:
        await create(image="opencode-tui/does-not-exist:nope", run_id=run_id)
    failure = info.value.failure
    assert failure is not None
    assert failure.kind == "provider_image_missing"
    assert failure.stage is FailureStage.SEED
    assert "scripts/build-images" in failure.message
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})


async def test_not_ready_when_the_main_process_ends(create: Factory, docker_client: Any) -> None:
    run_id = f"pytest-notready-{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    with pytest.raises(SandboxError) as info:
        await create(DockerProvider(main_argv=["true"]), run_id=run_id, ready_timeout_s=20)
    assert time.monotonic() - start < 15, "readiness should give up once the container has exited"
    failure = info.value.failure
    assert failure is not None and failure.kind == "sandbox_not_ready"
    assert any(e.source == "docker.state" for e in failure.evidence)
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})


async def test_engine_unreachable(spec_factory: Callable[..., SandboxSpec]) -> None:
    provider = DockerProvider(base_url="unix:///tmp/opencode-tui-no-such-docker.sock")
    with pytest.raises(SandboxError) as info:
        await provider.create(spec_factory())
    assert info.value.failure is not None
    assert info.value.failure.kind == "provider_unavailable"


async def test_exec_in_a_vanished_container_is_not_sent(create: Factory, docker_client: Any) -> None:
    sb = await create()
    docker_client.api.remove_container(sb.sandbox_id, force=True)
    with pytest.raises(SandboxError) as info:
        await sb.exec(["true"], timeout=10)
    failure = info.value.failure
    assert failure is not None and failure.kind == "sandbox_lost"
    assert failure.details is not None and failure.details.delivery is Delivery.NOT_SENT  # type: ignore[union-attr]
    assert (await sb.status()).state is SandboxState.GONE
    with pytest.raises(FileNotFoundError):
        await (await create()).download_tar("/no/such/path")


async def test_large_output_is_streamed_whole_and_kept_as_a_capped_tail(create: Factory) -> None:
    sb = await create()
    streamed = 0

    def count(chunk: Any) -> None:
        nonlocal streamed
        streamed += len(chunk.data)

    size = 10 << 20
    result = await sb.exec(
        ["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' a; printf END"], timeout=60, on_output=count
    )
    assert result.ok
    assert streamed == size + 3
    assert 1 << 20 <= len(result.stdout) < size  # a few MB kept in memory, not everything
    assert result.stdout.endswith(b"aaaEND")  # the tail is what is kept


# -------------------------------------------------------------------------------------- borrowed


async def test_borrowed_release_leaves_the_container_running(
    docker_client: Any, sdk_containers: Callable[..., Any]
) -> None:
    container = sdk_containers()
    sb = await DockerProvider().connect(container.id)
    assert sb.owned is False and sb.sandbox_id == container.id
    assert (await sb.exec(["echo", "borrowed"], timeout=30)).text() == "borrowed\n"
    pty = await sb.pty(["bash", "--norc", "-i"])
    await pty.write(b"echo r''eady\n")
    buf = b""
    while b"ready\r\n" not in buf:
        buf += await asyncio.wait_for(pty.read(), 10)

    await sb.release()
    await sb.release()
    container.reload()
    assert container.status == "running"
    # The terminal we opened is gone; the container's own processes are untouched.
    ps = container.exec_run(["ps", "-eo", "comm="]).output.decode().split()
    assert "bash" not in ps and "sleep" in ps
    with pytest.raises(SandboxClosedError):
        await sb.exec(["true"], timeout=10)


async def test_connect_to_unknown_container() -> None:
    with pytest.raises(SandboxError) as info:
        await DockerProvider().connect("opencode-tui-no-such-container")
    assert info.value.failure is not None and info.value.failure.kind == "sandbox_lost"


# ------------------------------------------------------------------------------------------- OOM


async def test_oom_of_the_main_process_is_confirmed_by_docker_state(create: Factory) -> None:
    sb = await create(DockerProvider(main_argv=["python3", "-c", MAIN_HOG]), memory_bytes=64 * MiB)
    before = datetime.now(UTC)
    await sb.exec(["touch", "/tmp/go"], timeout=30)
    status = await _poll(sb.status, lambda s: s.state is not SandboxState.RUNNING, timeout=30)
    assert status.state is SandboxState.EXITED

    piece = oom_confirmed(status.evidence)
    assert piece is not None, status.evidence
    assert piece.source == "docker.state"
    assert piece.data["OOMKilled"] is True
    assert piece.scope == sb.sandbox_id
    assert piece.observed_at >= before - timedelta(seconds=1)
    assert oom_confirmed(await sb.inspect(), scope=sb.sandbox_id) is not None
    # The engine also reported the event for this container.
    assert any(e.source == "docker.events" and e.data.get("action") == "oom" for e in status.evidence)


async def test_oom_of_an_exec_is_confirmed_and_scoped_kill9_is_not(create: Factory) -> None:
    victim, healthy = await asyncio.gather(create(memory_bytes=64 * MiB), create(memory_bytes=64 * MiB))

    hog = await victim.exec(["python3", "-c", "a = bytearray(512 << 20)"], timeout=60)
    assert hog.observed and hog.exit_code == 137
    killed = await healthy.exec(["bash", "-c", "kill -9 $$"], timeout=30)
    assert killed.observed and killed.exit_code == 137

    victim_evidence = await _poll(victim.inspect, lambda ev: oom_confirmed(ev) is not None, timeout=10)
    piece = oom_confirmed(victim_evidence)
    assert piece is not None, victim_evidence
    assert piece.source in ("docker.events", "cgroup.memory")
    assert piece.scope == victim.sandbox_id
    cgroup = next(e for e in victim_evidence if e.source == "cgroup.memory")
    if cgroup.data.get("available"):
        assert cgroup.data["oom_kill"] > cgroup.data["oom_kill_baseline"] == 0
        assert cgroup.data["limit_in_bytes"] == 64 * MiB
    state = next(e for e in victim_evidence if e.source == "docker.state")
    assert state.data["Running"] is True  # the container survived; only the command was killed
    assert (await victim.exec(["true"], timeout=30)).ok

    # Exit 137 from a plain SIGKILL is not evidence, and neither is another container's OOM.
    healthy_evidence = await healthy.inspect()
    assert oom_confirmed(healthy_evidence) is None
    assert oom_confirmed([*victim_evidence, *healthy_evidence], scope=healthy.sandbox_id) is None
    assert all(e.scope == healthy.sandbox_id for e in healthy_evidence)
    assert not any(e.data.get("action") == "oom" for e in healthy_evidence)
    text_only = Evidence(
        source="exec.output", scope=healthy.sandbox_id, data={"text": "Killed (out of memory)"}
    )
    assert oom_confirmed([text_only]) is None
    unscoped = Evidence(source="docker.state", data={"OOMKilled": True})
    assert oom_confirmed([unscoped]) is None


async def test_docker_events_evidence_is_capped_and_keeps_every_oom_report(
    create: Factory, docker_client: Any
) -> None:
    """Thirty real ``kill`` events (a signal the main process ignores) and a real OOM of an exec: the
    evidence keeps the oom report and the latest others, at most ``EVENTS_KEPT``, and says how many
    it left out (issue 25)."""
    from opencode_tui_core.sandbox.docker.common import EVENTS_KEPT

    sb = await create(memory_bytes=64 * MiB)
    hog = await sb.exec(["python3", "-c", "a = bytearray(512 << 20)"], timeout=60)
    assert hog.exit_code == 137
    container = docker_client.containers.get(sb.sandbox_id)
    for _ in range(30):
        await asyncio.to_thread(container.kill, "SIGWINCH")
    evidence = await _poll(
        sb.inspect,
        lambda ev: any(e.source == "docker.events" and e.data.get("matched", 0) >= 31 for e in ev),
        timeout=15,
    )
    events = [e for e in evidence if e.source == "docker.events"]
    summary, kept = events[0], events[1:]
    assert len(kept) == EVENTS_KEPT and summary.data["omitted"] == summary.data["matched"] - EVENTS_KEPT
    assert any(e.data["action"] == "oom" for e in kept), "the oom report was dropped by the cap"
    assert oom_confirmed(evidence, scope=sb.sandbox_id) is not None


# ----------------------------------------------------------------------------------------- sweep


async def test_sweep_finds_and_removes_labelled_leftovers(
    docker_client: Any, sdk_containers: Callable[..., Any]
) -> None:
    owner = f"pytest-sweep-{uuid.uuid4().hex[:8]}@nowhere"
    leftover = sdk_containers({LABEL_OWNER: owner})
    provider = DockerProvider(owner=owner)

    listed = await provider.sweep(dry_run=True, owner=owner)
    assert listed == [leftover.id]
    leftover.reload()
    assert leftover.status == "running"

    removed = await provider.sweep(owner=owner)
    assert removed == [leftover.id]
    with pytest.raises(docker.errors.NotFound):
        leftover.reload()
    assert await provider.sweep(dry_run=True, owner=owner) == []


# ---------------------------------------------------------------------------- borrowed sessions


async def test_borrowed_session_removes_its_files_and_leaves_the_container(
    docker_client: Any, sdk_containers: Callable[..., Any]
) -> None:
    """A session in a borrowed container: cleanup confirmed, our session dir removed, container kept."""
    from opencode_tui_core.session import SandboxSession

    container = sdk_containers()
    sb = await DockerProvider().connect(container.id)
    session = SandboxSession(sb, "/tmp/.opencode-tui/borrowed", run_timeout_s=30, close_timeout_s=9)
    result = await session.execute(["/bin/sh", "-c", "echo from-harness; sleep 0.2"])
    assert result.exit_code == 0 and b"from-harness" in result.stdout
    receipt = await session.close()
    assert receipt.cleanup_confirmed and receipt.return_code == 0
    container.reload()
    assert container.status == "running"
    left = container.exec_run(["sh", "-c", "ls -a /tmp/.opencode-tui"]).output.decode().split()
    assert left == [".", ".."], left


def _host_supervisor_pid(session_dir: str) -> int | None:
    """The host pid of the python supervisor of ``session_dir`` (container processes are host-visible)."""
    import subprocess

    out = subprocess.run(["pgrep", "-f", f"{session_dir}/supervisor.py"], capture_output=True, text=True)
    for pid in (int(p) for p in out.stdout.split()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--receipt" in argv and b"-c" not in argv[:2]:
            return pid
    return None


def _host_pids_of(pattern: str) -> list[int]:
    import subprocess

    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


async def _until(predicate: Callable[[], Any], what: str, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_borrowed_session_with_unconfirmed_cleanup_keeps_its_files_for_a_later_close(
    docker_client: Any, sdk_containers: Callable[..., Any]
) -> None:
    """A real stall: the supervisor in a borrowed container is SIGSTOPped from the host, so no receipt
    comes. The close is unconfirmed; the release disconnects but keeps the session directory (stop
    file, claim, pid) in the container, which keeps running (before, release removed it, and with
    it any way to confirm later). Once the supervisor runs again, a later close from a new connection
    confirms cleanup from the same directory, then removes it."""
    import contextlib
    import os
    import signal

    from opencode_tui_core.session import CleanupUnconfirmed, SandboxSession

    container = sdk_containers()
    session_dir = f"/tmp/.opencode-tui/borrowed-{uuid.uuid4().hex[:8]}"
    marker = f"1000.{uuid.uuid4().int % 10**9}"
    sb = await DockerProvider().connect(container.id)
    session = SandboxSession(sb, session_dir, run_timeout_s=120, close_timeout_s=3)
    run = asyncio.ensure_future(session.execute(["/bin/sh", "-c", f"sleep {marker}"]))
    pid = await _until(lambda: _host_supervisor_pid(session_dir), "the supervisor")
    await _until(lambda: _host_pids_of(f"sleep {marker}"), "the harness")
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(CleanupUnconfirmed):
            await session.close()  # borrowed: never destroyed, the close stays retryable
        assert session.keeps_session_dir
        await session.release()
        assert session.released
        container.reload()
        assert container.status == "running"
        kept = container.exec_run(["ls", "-a", session_dir]).output.decode().split()
        assert {"stop.request", "launch.claim", "supervisor.pid"} <= set(kept), kept
        assert "cleanup.json" not in kept
        assert _host_pids_of(f"sleep {marker}"), "the harness still runs in the borrowed container"
    finally:
        os.kill(pid, signal.SIGCONT)

    later = SandboxSession.reattach(
        await DockerProvider().connect(container.id), session_dir, close_timeout_s=20
    )
    receipt = await later.close()
    assert receipt.cleanup_confirmed
    assert _host_pids_of(f"sleep {marker}") == []
    left = container.exec_run(["sh", "-c", "ls -a /tmp/.opencode-tui"]).output.decode().split()
    assert left == [".", ".."], left
    container.reload()
    assert container.status == "running"
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(run, 30)
