"""SVG snapshots of the views issue 26's fixes changed, at 80×24 and 160×45: the health-warning detail,
the runs browser back from a re-run, and a run whose outcome is the policy's ``retry`` in a run that was
not retried.

Update after an intended change with ``pytest tests/opencode_tui/test_tui_first_use_snapshots.py
--snapshot-update`` and read the SVGs in ``__snapshots__``.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.warning_detail import WarningDetailScreen
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui_core.artifacts import OutcomeSummary, RunDir, RunDirReader, RunInfo
from opencode_tui_core.events import (
    EpisodeStarted,
    EventBus,
    FailureRecorded,
    HealthWarning,
    ModelCall,
    OutcomeDecided,
    Phase,
    PhaseChanged,
)
from opencode_tui_core.failures import FailureEvent, FailureStage, decide
from opencode_tui_core.failures.model import ModelCallDetails

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STORM = FIXTURES / "more-runs" / "compaction-storm"
SIZES = [(80, 24), (160, 45)]
T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)


def _size_id(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


@pytest.mark.parametrize("size", SIZES, ids=_size_id)
def test_health_warning_detail(snap_compare, replay_loaded, size):
    events = list(RunDirReader(STORM).events())
    warning = next(e for e in events if isinstance(e, HealthWarning) and "call_id" in e.data)

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        table = pilot.app.screen.query_one(FailuresTable)
        table.focus()
        table.move_cursor(row=next(i for i, r in enumerate(table.records) if r == warning))
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(pilot.app.screen, WarningDetailScreen)

    assert snap_compare(OpenCodeTUI(run_dir=STORM), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=_size_id)
def test_runs_browser_back_from_a_rerun(snap_compare, fixture_runs, tmp_path, monkeypatch, size):
    runs = tmp_path / "runs"
    original = runs / "hello-file-20261201-010000-aaaaaa-a1"
    again = runs / "hello-file-20261201-020000-bbbbbb-a1"
    shutil.copytree(fixture_runs / "hello-file", original)
    shutil.copytree(fixture_runs / "hello-file", again)
    shutil.copytree(fixture_runs / "oom", runs / "oom-20261130-230000-cccccc-a1")
    monkeypatch.chdir(tmp_path)  # the title shows the runs dir as given

    async def run_before(pilot) -> None:
        await pilot.pause()

    app = OpenCodeTUI(
        runs_dir=Path("runs"),
        rerun_of=(Path("runs") / original.name, Path("runs") / again.name),
        notice="Re-run: scored: reward 1",
    )
    assert snap_compare(app, terminal_size=size, run_before=run_before)


def _retry_run(runs_dir: Path) -> Path:
    """A CONSTRUCTED run (typed events through the real writer) outside a batch whose outcome is the
    policy's ``retry``: the model endpoint answered 500 on every call."""
    run_id = "model-flaky-500-20261201-090000-dddddd-a1"
    rd = RunDir.create(runs_dir, run_id)
    bus = EventBus()
    bus.subscribe(rd.append_event)

    def at(s: float) -> datetime:
        return T0 + timedelta(seconds=s)

    bus.emit(
        EpisodeStarted(
            ts=at(0),
            run_id=run_id,
            task_id="model-flaky-500",
            provider="local",
            opencode_version="1.18.32",
            run_budget_s=600,
            close_budget_s=60,
            model="scripted",
        )
    )
    bus.emit(PhaseChanged(ts=at(1), phase=Phase.AGENT))
    for i in range(3):
        bus.emit(
            ModelCall(
                ts=at(2 + i),
                call_id=f"mc-500-{i}",
                method="POST",
                path="/v1/chat/completions",
                status=500,
                started_at=at(2 + i),
                latency_s=0.01,
                kind="agent",
            )
        )
    failure = FailureEvent(
        kind="model_server_error",
        stage=FailureStage.AGENT,
        operation="model call",
        http_status=500,
        message="the model endpoint answered 500 (3 times)",
        details=ModelCallDetails(call_id="mc-500-2", status=500, attempts=3),
        occurred_at=at(5),
    )
    decision = decide(failure)
    assert decision.action == "retry"
    bus.emit(FailureRecorded(ts=at(5), failure=failure, decision=decision))
    bus.emit(PhaseChanged(ts=at(9), phase=Phase.DONE))
    summary = "model_server_error (agent, class model) → retry"
    bus.emit(
        OutcomeDecided(
            ts=at(9),
            action=decision.action,
            reward=None,
            failure_kind=failure.kind,
            failure_class=decision.failure_class,
            summary=summary,
        )
    )
    rd.write_run_info(
        RunInfo(
            run_id=run_id,
            task_id="model-flaky-500",
            provider="local",
            started_at=T0,
            ended_at=at(9),
            phase="done",
            outcome=OutcomeSummary(
                action=str(decision.action),
                reward=None,
                failure_kind=failure.kind,
                failure_stage=str(failure.stage),
                failure_class=str(decision.failure_class),
                summary=summary,
            ),
        )
    )
    rd.close()
    return rd.path


@pytest.mark.parametrize("size", SIZES, ids=_size_id)
def test_a_retry_outcome_outside_a_batch(snap_compare, replay_loaded, tmp_path, size):
    run = _retry_run(tmp_path / "runs")

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        if pilot.app.screen.compact:
            await pilot.press("5")  # the Failures tab: its action column
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=run), terminal_size=size, run_before=run_before)
