"""Kernel kills and a full disk seen while the agent runs, end to end: the real OpenCode binary, the
scripted model, real sandboxes and the real faults (the kernel's OOM killer in a memory-limited
sandbox; a 3 GiB ``dd`` into a 1 GiB local disk). The live event, the terminal's lines, the failure's
evidence and the replayed stream are checked against each other; timing relatively, from the events'
own timestamps (absolute timing is for benchmarks)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.events import FailureRecorded, FaultKind, SandboxFault, TerminalOutput, ToolCall
from opencode_tui_core.tasks import load_task

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def _run(provider: str, names: list[str], runs: Path) -> dict[str, list]:
    config = AgentConfig.model_validate({"sandbox": {"provider": provider}})
    summary = asyncio.run(run_batch([load_task(SAMPLES / n) for n in names], config, runs_dir=runs, jobs=1))
    return {r.task_id: list(RunDirReader(Path(r.run_dir)).events()) for r in summary.results}


def _check_oom(events: list) -> None:
    kills = [e for e in events if isinstance(e, SandboxFault) and e.kind is FaultKind.OOM_KILL]
    assert kills, "no live OOM event"
    kill = kills[0]
    bash = [e for e in events if isinstance(e, ToolCall) and e.tool == "bash"]
    running = next(e for e in bash if e.status == "running")
    ended = next(e for e in bash if e.status != "running")
    # Named: the python the agent's command ran, with its pid, during that command.
    assert kill.pid is not None and kill.command and "bytearray" in kill.command, kill
    assert kill.tool_call_id == running.call_id and "bytearray" in (kill.tool_command or "")
    assert running.ts <= kill.ts <= ended.ts
    # Live: emitted (its place in the stream) long before the command ended, not at the close.
    seen_at = next(e.ts for e in events if e.seq > kill.seq)  # the next event's stamp bounds the emit
    assert (seen_at - kill.ts).total_seconds() < 2.0, (kill.ts, seen_at)
    assert kill.seq < ended.seq
    # The terminal says it when it happens, and again at the command's end.
    display = [e for e in events if isinstance(e, TerminalOutput) and e.stream == "display"]
    live_line = next(e for e in display if "OOM-killed" in e.data)
    assert f"pid {kill.pid}" in live_line.data and live_line.seq < ended.seq
    note = [e.data for e in display if e.seq > ended.seq and "had OOM-killed this command" in e.data]
    assert note and f"(pid {kill.pid})" in note[0]
    # The failure names the process, its pid and time.
    failure = next(e for e in events if isinstance(e, FailureRecorded)).failure
    assert failure.kind == "provider_oom_killed"
    assert f"(pid {kill.pid})" in failure.message
    assert any(ev.data.get("pid") == kill.pid for ev in failure.evidence if ev.source == "kernel.log")


@pytest.mark.bwrap
def test_local_oom_and_disk_full_are_seen_live_and_decide_the_outcome(tmp_path: Path) -> None:
    results = _run("local", ["oom", "disk-full"], tmp_path / "runs")
    _check_oom(results["oom"])

    events = results["disk-full"]
    full = [e for e in events if isinstance(e, SandboxFault) and e.kind is FaultKind.DISK_FULL]
    assert len(full) == 1, full
    assert "dd if=/dev/zero" in (full[0].tool_command or "")
    failure = next(e for e in events if isinstance(e, FailureRecorded))
    assert (failure.failure.kind, failure.decision.failure_class, failure.decision.action) == (
        "sandbox_disk_full",
        "model",
        "count_as_zero",
    )
    disk = [ev for ev in failure.failure.evidence if ev.source == "sandbox.disk"]
    assert disk and disk[0].data["limit_bytes"] == 1 << 30 and disk[0].data["full_seen_at"]
    assert any(p["command"].startswith("dd ") for p in disk[0].data["processes"]), disk[0].data["processes"]
    assert any("writable space is full" in e.data for e in events if isinstance(e, TerminalOutput))


@pytest.mark.docker
def test_docker_oom_is_seen_live_with_its_pid(tmp_path: Path) -> None:
    r = subprocess.run(["docker", "image", "inspect", "opencode-tui/base:bookworm"], capture_output=True)
    if r.returncode != 0:
        pytest.skip("docker or the base image is unavailable (scripts/start-dockerd, scripts/build-images)")
    _check_oom(_run("docker", ["oom"], tmp_path / "runs")["oom"])
