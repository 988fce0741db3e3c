"""Shared fixtures for the TUI tests: the recorded run directories, a constructed one, waiting helpers.

``tests/fixtures/runs/{hello-file,oom}`` are real runs recorded by ``scripts/record-fixture-runs``
(Docker provider, the pinned OpenCode, the scripted model). Tests derive what they expect from those
files (events.jsonl, run.json, model_calls.jsonl, terminal.cast), so re-recording keeps them valid.

A few behaviours the recorded runs do not exercise (a cause chain, a failed cleanup receipt, a compaction,
a call whose response was never recorded, a tool error rendered by the TUI itself) are covered by
``constructed_run``: a run directory *constructed* here with the real writer and typed events. It is
written to a temporary directory and never mixed with the recorded fixtures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.calls.records import ModelCallRecord
from opencode_tui_core.control import EpisodeControl
from opencode_tui_core.events import EventBus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_RUNS = FIXTURES / "runs"


@pytest.fixture(scope="session")
def fixture_runs() -> Path:
    """``tests/fixtures/runs``: the recorded run directories (committed files)."""
    for name in ("hello-file", "oom"):
        assert (FIXTURE_RUNS / name / RunFiles.EVENTS).is_file(), (
            f"missing recorded run {name}: re-record with scripts/record-fixture-runs"
        )
    return FIXTURE_RUNS


async def wait_for(
    pilot, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Let the app run until ``predicate()`` holds (fails the test after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)


@pytest.fixture
def wait():
    return wait_for


async def loaded(pilot) -> None:
    """Wait until the replay has read the whole events.jsonl and the screen has settled."""
    from opencode_tui.screens.run import RunScreen

    await wait_for(
        pilot,
        lambda: isinstance(pilot.app.screen, RunScreen) and not pilot.app.screen.replay_loading,
        what="the replay to load",
    )
    await pilot.pause()
    await asyncio.sleep(0)


@pytest.fixture
def replay_loaded():
    return loaded


# ---- a constructed run (not a recording) ----------------------------------------------------------

CONSTRUCTED_T0 = datetime(2025, 5, 14, 9, 30, 0, tzinfo=UTC)
CONSTRUCTED_CONTAINER = "4be1c0ffee9a"
CONSTRUCTED_COMMAND = "python3 sort_all.py"


def write_constructed_run(runs_dir: Path, run_id: str = "constructed-oom") -> Path:
    """A CONSTRUCTED run directory (typed events through ``opencode_tui_core.artifacts.RunDir``), for the cases the
    recorded runs do not have: an OOM whose failure carries a cause chain and ``docker.state`` evidence,
    a bash call that fails (no engine rendering: the TUI renders it), a compaction, a warning, a model
    call whose response was never recorded, a cleanup receipt that never arrived."""
    from opencode_tui_core.artifacts import OutcomeSummary, RunDir, RunInfo
    from opencode_tui_core.events import (
        CleanupObserved,
        CleanupStep,
        Compaction,
        EpisodeStarted,
        EventBus,
        FailureRecorded,
        ModelCall,
        OutcomeDecided,
        Phase,
        PhaseChanged,
        SandboxReady,
        StepState,
        ToolCall,
        Warning_,
    )
    from opencode_tui_core.failures import (
        Evidence,
        FailureCause,
        FailureEvent,
        FailureStage,
        OomDetails,
        decide,
    )

    rd = RunDir.create(runs_dir, run_id)
    bus = EventBus()
    bus.subscribe(rd.append_event)

    def at(seconds: float) -> datetime:
        return CONSTRUCTED_T0 + timedelta(seconds=seconds)

    bus.emit(
        EpisodeStarted(
            ts=at(0),
            run_id=run_id,
            task_id="constructed-task",
            provider="docker",
            opencode_version="1.18.32",
            run_budget_s=600,
            close_budget_s=60,
            model="scripted",
        )
    )
    bus.emit(
        SandboxReady(
            ts=at(1),
            sandbox_id=CONSTRUCTED_CONTAINER,
            provider="docker",
            owned=True,
            network="none",
            memory_limit_enforced=True,
            user="agent (uid 1000, gid 1000)",
            uid=1000,
            gid=1000,
            user_source="image",
        )
    )
    bus.emit(Warning_(ts=at(2), code="ripgrep_unavailable", message="no system rg"))
    bus.emit(PhaseChanged(ts=at(3), phase=Phase.AGENT))
    calls = [
        ("c-ok", 200, None, {"model": "scripted", "messages": []}, "data: {}\n\ndata: [DONE]\n"),
        ("c-lost", None, "connection closed: the client went away", {"model": "scripted"}, None),
    ]
    for i, (call_id, status, error, _req, _resp) in enumerate(calls):
        bus.emit(
            ModelCall(
                ts=at(4 + i),
                call_id=call_id,
                method="POST",
                path="/v1/chat/completions",
                status=status,
                started_at=at(3.5 + i),
                latency_s=0.5 if status else None,
                kind="agent",
                tokens_in=100 if status else None,
                tokens_out=10 if status else None,
                error=error,
            )
        )
    bus.emit(Compaction(ts=at(5.5), count=1, trigger="auto"))
    tool = {"call_id": "t1", "tool": "bash", "input": {"command": CONSTRUCTED_COMMAND}}
    output = "loading data/big.txt\n"
    bus.emit(ToolCall(ts=at(6), status="running", output="", **tool))
    for pct in (12, 64, 91):
        output += f"\x1b[33mmemory {pct}%\x1b[0m\r"
        bus.emit(ToolCall(ts=at(6 + pct / 100), status="running", output=output, **tool))
    bus.emit(ToolCall(ts=at(7.5), status="error", output=output + "\nKilled\n", **tool))
    failure = FailureEvent(
        kind="provider_oom_killed",
        stage=FailureStage.AGENT,
        operation="opencode run (supervised)",
        message=f"the agent container {CONSTRUCTED_CONTAINER} was OOM-killed",
        cause=FailureCause(
            type="opencode_tui_core.sandbox.base.ExecLost",
            message="the execution ended without an observed exit",
            cause=FailureCause(type="ConnectionResetError", message="[Errno 104] Connection reset by peer"),
        ),
        evidence=[
            Evidence(
                source="docker.state",
                scope=f"container {CONSTRUCTED_CONTAINER}",
                observed_at=at(8),
                data={"OOMKilled": True, "ExitCode": 137},
            )
        ],
        details=OomDetails(container_id=CONSTRUCTED_CONTAINER, memory_limit_bytes=536_870_912, exit_code=137),
        occurred_at=at(8),
    )
    decision = decide(failure)
    bus.emit(FailureRecorded(ts=at(8), failure=failure, decision=decision))
    bus.emit(PhaseChanged(ts=at(8.1), phase=Phase.CLOSING))
    cleanup = [
        (CleanupStep.RECEIPT, StepState.FAILED, "no receipt within the close budget"),
        (CleanupStep.DESCENDANTS, StepState.SKIPPED, "container destroyed"),
        (CleanupStep.SANDBOX_RELEASED, StepState.OK, "owned container destroyed (fallback)"),
        (CleanupStep.TRANSCRIPT_SNAPSHOT, StepState.SKIPPED, "the session database went with the container"),
    ]
    for i, (step, state, reason) in enumerate(cleanup):
        bus.emit(CleanupObserved(ts=at(40 + i), step=step, state=state, reason=reason))
    bus.emit(
        OutcomeDecided(
            ts=at(45),
            action=decision.action,
            reward=0.0,
            failure_kind=failure.kind,
            failure_class=decision.failure_class,
            summary="constructed: counted as zero",
            evidence=failure.evidence,
        )
    )
    with (rd.path / RunFiles.MODEL_CALLS).open("w", encoding="utf-8") as f:
        for i, (call_id, status, error, request, response) in enumerate(calls):
            record = ModelCallRecord(
                call_id=call_id,
                method="POST",
                path="/v1/chat/completions",
                status=status,
                started_at=at(3.5 + i),
                error=error,
                request_body=request,
                response_body=response,
            )
            f.write(record.model_dump_json() + "\n")
    rd.write_run_info(
        RunInfo(
            run_id=run_id,
            task_id="constructed-task",
            provider="docker",
            sandbox_id=CONSTRUCTED_CONTAINER,
            sandbox_owned=True,
            started_at=CONSTRUCTED_T0,
            ended_at=at(45),
            phase="done",
            outcome=OutcomeSummary(
                action=str(decision.action),
                reward=0.0,
                failure_kind=failure.kind,
                failure_stage=str(failure.stage),
                failure_class=str(decision.failure_class),
                summary="constructed: counted as zero",
            ),
        )
    )
    rd.close()
    return rd.path


@pytest.fixture
def constructed_run(tmp_path) -> Path:
    return write_constructed_run(tmp_path / "runs")


CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def chromium_browser():
    """Debian's headless chromium driven by Playwright (its own browser download is not used).
    scripts/test installs the package; without it these tests fail, saying so.

    Per test: Playwright's sync API runs an event loop in this thread while it is open, and the async
    tests that may follow on the same worker need the thread's loop free."""
    if not CHROMIUM.exists():
        pytest.fail("no /usr/bin/chromium: apt-get install -y chromium (scripts/test installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


class RecordedEpisode(EpisodeControl):
    """A live episode whose events are a recorded run's, emitted on a real EventBus as the engine would
    (the engine itself would need Docker and minutes per snapshot; what is compared is the screen)."""

    def __init__(self, events: list) -> None:
        self.bus = EventBus()
        self.events = events
        self._done = asyncio.Event()

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    async def cancel(self, by: str = "user") -> None:
        self._done.set()

    @property
    def kept(self) -> bool:
        return False

    @property
    def keep_changeable(self) -> bool:
        return self.running

    def keep_sandbox(self, keep: bool = True) -> None:
        del keep

    async def open_shell(self, cols: int = 80, rows: int = 24):
        raise RuntimeError("no sandbox behind a recorded episode")

    async def wait(self) -> object:
        await self._done.wait()
        return None

    async def play(self) -> None:
        for ev in self.events:
            self.bus.emit(ev)


@pytest.fixture(
    params=[pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)]
)
def provider(request) -> str:
    """docker and local, each only where it can run (the warm sandbox tests)."""
    if request.param == "docker":
        from tests.core.conftest import require_docker_image

        require_docker_image()
    return request.param
