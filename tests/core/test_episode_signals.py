"""Every exit path is a close: a real SIGINT, SIGTERM or SIGHUP delivered to this process in each phase
of a real episode (real OpenCode, the scripted model, Docker and bubblewrap sandboxes) ends with a
positive cleanup proof, a record naming the phase and the signal, the signal's exit code, and nothing
left behind. The batch runs exactly as ``opencode-tui run --batch`` does: ``run_batch`` under
``closing_signals``; the signal is sent with ``os.kill`` when the episode's event stream shows it has
reached the phase.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.batch import BatchControl, run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.events import Event, Phase, PhaseChanged, ToolCall
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.failures import Outcome
from opencode_tui_core.outcome import exit_code
from opencode_tui_core.signals import closing_signals
from opencode_tui_core.tasks import load_task
from tests.leftovers import left_behind

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"

# A trajectory whose agent is mid-command for a while, and a verifier that takes a moment: every phase
# lasts long enough to be hit.
SLOW_AGENT = [
    {"tool_calls": [{"name": "write", "arguments": {"filePath": "{workdir}/hello.txt", "content": "hi\n"}}]},
    {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 30", "description": "Wait"}}]},
    {"text": "done"},
]

PHASES = ["seed", "install", "agent", "closing", "transcript", "verification", "release"]
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


def _task(tmp_path: Path, slow_agent: bool) -> Path:
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task)
    data = yaml.safe_load((task / "task.yaml").read_text())
    data["verify"] = {"command": "sleep 3; test -f hello.txt", "timeout": 30}
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    if slow_agent:
        (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": SLOW_AGENT}))
    return task


def _reached(phase: str, event: Event) -> bool:
    if phase == "agent":  # the harness is running a command: the supervisor owns a live process tree
        return isinstance(event, ToolCall) and event.status == "running" and event.tool == "bash"
    return isinstance(event, PhaseChanged) and event.phase == Phase(phase)


def run_with_signal(tmp_path: Path, provider: str, phase: str, sig: signal.Signals, times: int = 1):
    task = load_task(_task(tmp_path, slow_agent=phase == "agent"))
    config = AgentConfig.model_validate({"sandbox": {"provider": provider}, "policy": {"max_attempts": 1}})
    control = BatchControl()
    sent: list[str] = []

    def watch(episode) -> None:
        def on_event(event: Event) -> None:
            if not sent and _reached(phase, event):
                sent.append(phase)
                for _ in range(times):
                    os.kill(os.getpid(), sig)

        episode.bus.subscribe(on_event)

    async def main():
        with closing_signals(control.cancel):
            return await run_batch(
                [task], config, runs_dir=tmp_path / "runs", on_episode=watch, control=control
            )

    summary = asyncio.run(main())
    assert sent == [phase], "the episode never reached the phase"
    [result] = summary.results
    return summary, result


def _provider(request, name: str) -> str:
    if name == "docker":
        request.getfixturevalue("docker_base_image")
    return name


CASES = [
    pytest.param(
        provider,
        phase,
        SIGNALS[(i + j) % 3],
        marks=getattr(pytest.mark, mark),
        id=f"{provider}-{phase}-{SIGNALS[(i + j) % 3].name}",
    )
    for j, (provider, mark) in enumerate([("docker", "docker"), ("local", "bwrap")])
    for i, phase in enumerate(PHASES)
]


@pytest.mark.parametrize(("provider", "phase", "sig"), CASES)
def test_signal_in_each_phase_closes_with_confirmed_cleanup(request, tmp_path, provider, phase, sig):
    provider = _provider(request, provider)
    summary, result = run_with_signal(tmp_path, provider, phase, sig)
    assert exit_code((r.exit_code for r in summary.results), cancelled_by=summary.cancelled_by) == (
        ExitCode.for_cancel(sig.name)
    )
    assert result.exit_code == ExitCode.for_cancel(sig.name)
    assert (result.action, result.failure_kind, result.cancelled_by) == (
        Outcome.STOP,
        "run_cancelled",
        sig.name,
    )
    assert result.cleanup_confirmed is True, result.summary
    info = RunDirReader(Path(result.run_dir)).info()
    assert info.outcome is not None and info.outcome.action == Outcome.STOP
    assert info.counts["cleanup_confirmed"] is True
    [cancel] = [
        e
        for e in RunDirReader(Path(result.run_dir)).events()
        if e.type == "failure" and e.failure.kind == "run_cancelled"
    ]
    assert sig.name in cancel.failure.message and phase in cancel.failure.message
    assert cancel.failure.stage == phase
    if phase in ("agent", "closing", "transcript", "verification", "release"):
        assert result.cleanup_proof == "receipt"
        assert (Path(result.run_dir) / RunFiles.OPENCODE_EXPORT).exists(), "transcript snapshot missing"
    else:
        assert result.cleanup_proof == "nothing_launched"
    # A grade taken in a cancelled run is never reported.
    assert result.reward is None
    assert left_behind(provider, result) == []


@pytest.mark.parametrize(
    "provider",
    [pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)],
)
def test_second_signal_hurries_and_still_records(request, tmp_path, provider):
    provider = _provider(request, provider)
    _, result = run_with_signal(tmp_path, provider, "agent", signal.SIGTERM, times=2)
    assert result.exit_code == ExitCode.TERMINATED
    assert (result.action, result.failure_kind) == (Outcome.STOP, "run_cancelled")
    info = RunDirReader(Path(result.run_dir)).info()
    assert info.outcome is not None and info.counts["cancelled_by"] == "SIGTERM"
    assert result.cleanup_confirmed is True and result.cleanup_proof in ("receipt", "destroyed")
    assert len((tmp_path / "runs" / "results.jsonl").read_text().splitlines()) == 1
    assert left_behind(provider, result) == []


@pytest.mark.bwrap
def test_batch_signal_closes_running_episodes_together_and_records_queued_as_not_started(tmp_path):
    """Three tasks, two at a time: SIGTERM while both run → both close (confirmed) concurrently, the
    queued third is recorded as not started, and nothing is left."""
    tasks = []
    for i in range(3):
        d = tmp_path / f"t{i}"
        d.mkdir()
        tasks.append(load_task(_task(d, slow_agent=True)))
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}, "policy": {"max_attempts": 1}})
    control = BatchControl()
    busy: set[str] = set()
    sent: list[float] = []

    def watch(episode) -> None:
        def on_event(event: Event) -> None:
            if _reached("agent", event):
                busy.add(episode.run_id)
                if len(busy) == 2 and not sent:
                    sent.append(time.monotonic())
                    os.kill(os.getpid(), signal.SIGTERM)

        episode.bus.subscribe(on_event)

    async def main():
        with closing_signals(control.cancel):
            return await run_batch(
                tasks, config, runs_dir=tmp_path / "runs", jobs=2, on_episode=watch, control=control
            )

    summary = asyncio.run(main())
    closed_in = time.monotonic() - sent[0]
    started = [r for r in summary.results if r.started]
    queued = [r for r in summary.results if not r.started]
    assert len(started) == 2 and len(queued) == 1
    assert all(r.cleanup_confirmed and r.cleanup_proof == "receipt" for r in started)
    assert all(r.cancelled_by == "SIGTERM" and r.exit_code == ExitCode.TERMINATED for r in summary.results)
    assert queued[0].summary == "not started: the batch was cancelled by SIGTERM"
    # Closed side by side: well within one close budget, not two in a row.
    assert closed_in < config.budgets.close_s
    assert exit_code((r.exit_code for r in summary.results), cancelled_by=summary.cancelled_by) == 143
    lines = (tmp_path / "runs" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3
    for r in started:
        assert left_behind("local", r) == []
