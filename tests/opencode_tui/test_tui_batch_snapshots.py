"""SVG snapshots of the batch screen at 80×24, 120×40 and 200×60: deterministic, from the results of a
real recorded batch (tests/fixtures/batch/results.jsonl) with a frozen clock, plus one attempt still
running (its events as an episode emits them), a retried one and one queued."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from opencode_tui.batch_app import BatchTUI
from opencode_tui.batch_board import BatchBoard
from opencode_tui_core.batch import LocalExecutor
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import EpisodeResult
from opencode_tui_core.events import (
    CleanupObserved,
    CleanupStep,
    EpisodeStarted,
    HealthWarning,
    ModelCall,
    OutcomeDecided,
    Phase,
    PhaseChanged,
    StepState,
)
from opencode_tui_core.failures import Outcome

BATCH = Path(__file__).resolve().parents[1] / "fixtures" / "batch"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recorded_board() -> BatchBoard:
    """The recorded batch as the screen saw it: attempts started and ended at fixed times."""
    results = [
        EpisodeResult.model_validate({k: v for k, v in json.loads(line).items() if k != "task_key"})
        for line in (BATCH / "results.jsonl").read_text().splitlines()
    ]
    clock = Clock()
    tasks = [r.task_id for r in results] + ["long-context", "swe-style"]
    board = BatchBoard(tasks, 3, batch_id=results[0].batch_id or "", clock=clock)
    for r in results:
        for k, earlier in enumerate(r.previous_attempts, start=1):
            row = board.start(r.task_id, k, Path(earlier).name, r.provider)
            clock.now += 7
            board.count(row, PhaseChanged(phase=Phase.AGENT))
            board.count(
                row,
                OutcomeDecided(
                    action=Outcome.RETRY, reward=None, failure_kind=r.failure_kind, summary="retry"
                ),
            )
            board.count(row, CleanupObserved(step=CleanupStep.SANDBOX_RELEASED, state=StepState.OK))
        board.start(r.task_id, r.attempt, r.run_id, r.provider)
        clock.now += 11 + 3 * r.attempt
        board.finished(r)
    running = board.start("long-context", 1, "long-context-20261202-092900-abc123-a1", "local")
    for event in (
        EpisodeStarted(
            run_id=running.run_id,
            task_id="long-context",
            provider="local",
            opencode_version="1.18.32",
            run_budget_s=1800,
            close_budget_s=60,
            model="scripted",
        ),
        PhaseChanged(phase=Phase.AGENT),
        ModelCall(
            call_id="mc-1",
            method="POST",
            path="/v1/chat/completions",
            status=200,
            started_at=datetime(2026, 12, 2, 9, 29, tzinfo=UTC),
            latency_s=1.5,
            kind="agent",
            tokens_in=1200,
            tokens_out=300,
        ),
        HealthWarning(kind="compaction_storm", message="3 compactions in 60 s"),
    ):
        board.count(running, event)
    clock.now += 42
    return board


def app_for(board: BatchBoard) -> BatchTUI:
    return BatchTUI(
        [],
        AgentConfig.model_validate({"sandbox": {"provider": "local"}}),
        BATCH,
        jobs=2,
        attempts=3,
        executor=LocalExecutor(),
        board=board,
        run=False,
    )


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
def test_batch_screen(snap_compare, size):
    async def run_before(pilot) -> None:
        await pilot.pause()

    assert snap_compare(app_for(recorded_board()), terminal_size=size, run_before=run_before)
