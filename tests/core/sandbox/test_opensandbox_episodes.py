"""Sample tasks end to end with ``--provider opensandbox``: the real OpenCode binary, the scripted model,
the real ``opensandbox-server`` (fixture), and our execd stand-in inside the sandboxes (the real execd is
not obtainable on this machine; see ``tests/fixtures/execd_standin``).

One sandbox at a time (host networking: every sandbox's daemon binds the same port), so the batch
runs with ``jobs=1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.events import (
    Event,
    EventBus,
    FailureRecorded,
    FailureRecovered,
    OutcomeDecided,
    SandboxReady,
    VerificationFinished,
)
from opencode_tui_core.sandbox.base import LABEL_OWNER, Recovery
from opencode_tui_core.tasks import load_task
from tests.core.sandbox.conftest import OPENSANDBOX_KEY_ENV, opensandbox_agent_config

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.opensandbox, pytest.mark.timeout(600)]
SAMPLES = Path(__file__).resolve().parents[3] / "sample_tasks"
PROXY_HOST = "127.0.0.2"


@pytest.fixture(scope="module")
def os_batch(opensandbox_server: Any, tmp_path_factory: pytest.TempPathFactory, test_run_id: str) -> Any:
    owner = f"os-{test_run_id}"
    runs = tmp_path_factory.mktemp("runs-opensandbox")
    # The recording proxy on another loopback address than the default: the sandboxes reach it by the
    # configured address (as sandboxes in other pods would reach a worker pod's IP), with the token.
    config = opensandbox_agent_config(opensandbox_server).model_copy(deep=True)
    config.model.proxy_host = PROXY_HOST
    config = AgentConfig.model_validate(config.model_dump())
    tasks = [load_task(SAMPLES / name) for name in ("hello-file", "oom")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(OPENSANDBOX_KEY_ENV, opensandbox_server.api_key)
        mp.setenv("OPENCODE_TUI_OWNER", owner)
        summary = asyncio.run(run_batch(tasks, config, runs_dir=runs, jobs=1))
    leftovers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL_OWNER}={owner}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.split()
    if leftovers:
        subprocess.run(["docker", "rm", "-f", *leftovers], capture_output=True, timeout=60, check=False)
    return {r.task_id: r for r in summary.results}, leftovers


def test_hello_file_scores_with_opensandbox(os_batch: Any) -> None:
    results, _ = os_batch
    r = results["hello-file"]
    assert (r.provider, r.action, r.reward, r.failure_kind) == ("opensandbox", "scored", 1.0, None)
    assert r.cleanup_confirmed is True
    # OpenSandbox does not declare the warm capability: no sandbox was prepared ahead (here one would
    # have taken the execd stand-in's one host port from the running sandbox: sandbox_not_ready).
    assert not any(x.warm for x in results.values())
    reader = RunDirReader(Path(r.run_dir))
    ready = [e for e in reader.events() if isinstance(e, SandboxReady)]
    assert ready and ready[0].provider == "opensandbox" and ready[0].owned is True
    calls = list(reader.model_calls())
    assert calls and all(c.status == 200 for c in calls)
    # OpenCode in the sandbox addressed the proxy where model.proxy_host put it, with its token.
    heads = [{k.lower(): v for k, v in c.request_headers.items()} for c in calls]
    assert {h.get("host", "").rsplit(":", 1)[0] for h in heads} == {PROXY_HOST}, heads[0]
    assert {h.get("authorization") for h in heads} == {"[REDACTED]"}


def test_oom_sample_runs_and_an_in_command_oom_stays_unconfirmed(os_batch: Any) -> None:
    """The agent's memory hog is OOM-killed inside a sandbox that keeps running: server 1.1.1 reports
    nothing about it (Docker sets OOMKilled only when the container stops), so no OOM is claimed.

    Which process the kernel kills is its choice: usually the hog (then the episode finishes and verifies
    normally), sometimes OpenCode itself (then OpenCode's exit by SIGKILL, with no report, stays an
    unknown-cause nonzero exit). Either way the cause is never guessed as an OOM.
    """
    results, _ = os_batch
    r = results["oom"]
    assert r.provider == "opensandbox"
    assert r.failure_kind != "provider_oom_killed"
    assert (r.action, r.reward, r.failure_kind) in {
        ("scored", 1.0, None),
        ("keep_unknown", None, "agent_nonzero_exit"),
    }
    assert r.cleanup_confirmed is True


def test_no_sandbox_left_behind(os_batch: Any) -> None:
    _, leftovers = os_batch
    assert leftovers == []


def test_a_recovered_stream_loss_is_an_event_in_events_jsonl_never_the_outcome(
    opensandbox_server: Any, standin_harness: Any, tmp_path: Path, test_run_id: str
) -> None:
    """The verifier's output stream stalls and drops after execd named the command (the stand-in's
    ``stall_stream`` fault, injected as soon as the sandbox is ready): the provider follows the
    execution id and reads the verifier's exit. The loss reaches events.jsonl as one
    ``FailureRecovered`` (followed by execution id); no failure is recorded and the episode scores."""
    control = standin_harness.StandinControl(f"http://127.0.0.1:{opensandbox_server.execd_port}")
    bus = EventBus()
    injected: list[Event] = []

    def inject_when_ready(event: Event) -> None:
        if isinstance(event, SandboxReady) and not injected:
            control.inject({"fault": "stall_stream", "match": "$(cat hello.txt)", "seconds": 1})
            injected.append(event)

    bus.subscribe(inject_when_ready)
    task = load_task(SAMPLES / "hello-file")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(OPENSANDBOX_KEY_ENV, opensandbox_server.api_key)
        mp.setenv("OPENCODE_TUI_OWNER", f"os-rec-{test_run_id}")
        result = asyncio.run(
            Episode(task, opensandbox_agent_config(opensandbox_server), runs_dir=tmp_path, bus=bus).run()
        )
    assert injected, "the sandbox never became ready"
    events = list(RunDirReader(Path(result.run_dir)).events())
    recovered = [e for e in events if isinstance(e, FailureRecovered)]
    assert len(recovered) == 1, recovered
    assert recovered[0].failure.kind == "command_stream_lost"
    assert recovered[0].recovery is Recovery.FOLLOWED_EXECUTION_ID
    # the stage it happened in (the verifier's stream), not the provider's guess ``agent``
    assert recovered[0].failure.stage.value == "verification"
    assert [e for e in events if isinstance(e, FailureRecorded)] == []
    [verification] = [e for e in events if isinstance(e, VerificationFinished)]
    assert (verification.exit_code, verification.passed) == (0, True)
    outcome = [e for e in events if isinstance(e, OutcomeDecided)][-1]
    assert (outcome.action, outcome.reward, outcome.failure_kind) == ("scored", 1.0, None)
    assert (result.action, result.reward, result.failure_kind) == ("scored", 1.0, None)
    assert result.cleanup_confirmed is True


def test_a_shells_dropped_socket_is_an_event_in_events_jsonl(
    opensandbox_server: Any, standin_harness: Any, tmp_path: Path, test_run_id: str
) -> None:
    """A person's shell in the sandbox while the agent runs a command; its socket drops after the
    first output byte (the stand-in's ``close_pty`` fault) and re-attaches. That observation reaches
    events.jsonl as ``FailureRecovered`` (re-attached, stage agent), not only the provider's memory."""
    control = standin_harness.StandinControl(f"http://127.0.0.1:{opensandbox_server.execd_port}")
    task_dir = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task_dir)
    trajectory = yaml.safe_load((task_dir / "trajectory.yaml").read_text())
    wait = {"name": "bash", "arguments": {"command": "sleep 20", "description": "Wait"}}
    trajectory["steps"].insert(-1, {"tool_calls": [wait]})
    (task_dir / "trajectory.yaml").write_text(yaml.safe_dump(trajectory))
    seen: list[bytes] = []

    recovered: list[FailureRecovered] = []

    async def use_a_shell(episode: Episode) -> None:
        control.inject({"fault": "close_pty", "after_bytes": 1})
        shell = await episode.open_shell()
        try:
            # the prompt's first byte drops the socket; wait for the re-attach before typing
            deadline = asyncio.get_running_loop().time() + 30
            while not recovered:
                assert asyncio.get_running_loop().time() < deadline, "the terminal never re-attached"
                # Drain output while polling: the re-attach may come with no further output to read.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(shell.read(), 0.5)
            await shell.write(b"echo be''fore\n")
            buf = b""
            while b"before" not in buf:
                chunk = await asyncio.wait_for(shell.read(), 15)
                if not chunk:
                    break
                buf += chunk
            seen.append(buf)
        finally:
            await shell.close()

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(OPENSANDBOX_KEY_ENV, opensandbox_server.api_key)
        mp.setenv("OPENCODE_TUI_OWNER", f"os-pty-{test_run_id}")
        episode = Episode(
            load_task(task_dir), opensandbox_agent_config(opensandbox_server), runs_dir=tmp_path
        )
        started: list[asyncio.Task[None]] = []

        def on_event(event: Event) -> None:
            if isinstance(event, FailureRecovered):
                recovered.append(event)
            running = getattr(event, "status", None) == "running" and getattr(event, "tool", None) == "bash"
            if running and "sleep 20" in str(getattr(event, "input", "")) and not started:
                started.append(asyncio.get_running_loop().create_task(use_a_shell(episode)))

        episode.bus.subscribe(on_event)

        async def main() -> Any:
            result = await episode.run()
            if started:
                await asyncio.gather(*started, return_exceptions=True)
            return result

        result = asyncio.run(main())
    assert started and seen and b"before" in seen[0], seen
    events = list(RunDirReader(Path(result.run_dir)).events())
    reattached = [e for e in events if isinstance(e, FailureRecovered) and e.recovery is Recovery.REATTACHED]
    assert len(reattached) == 1, [e for e in events if isinstance(e, FailureRecovered)]
    assert reattached[0].failure.kind == "sandbox_pty_failed"
    assert reattached[0].failure.stage.value == "agent"
    assert result.cleanup_confirmed is True
