"""The batch screen's model over a real recorded batch's results: rows per attempt, retries as
attempts of one task, resumed and never-started rows, the totals and the pace."""

from __future__ import annotations

import json
from pathlib import Path

from opencode_tui.batch_board import BatchBoard
from opencode_tui_core.episode import EpisodeResult
from opencode_tui_core.events import (
    CleanupObserved,
    CleanupStep,
    HealthWarning,
    Phase,
    PhaseChanged,
    StepState,
)
from opencode_tui_core.failure_groups import group_failures

BATCH = Path(__file__).resolve().parents[1] / "fixtures" / "batch"


def _results() -> list[EpisodeResult]:
    return [
        EpisodeResult.model_validate({k: v for k, v in json.loads(line).items() if k != "task_key"})
        for line in (BATCH / "results.jsonl").read_text().splitlines()
    ]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rows_follow_the_engine_retries_stay_with_their_task() -> None:
    results = _results()
    clock = Clock()
    board = BatchBoard([r.task_id for r in results], 3, clock=clock)
    flaky = next(r for r in results if r.task_id == "model-flaky-500")
    assert flaky.attempt == 3 and len(flaky.previous_attempts) == 2
    rows = [board.start(flaky.task_id, k, f"flaky-a{k}") for k in (1, 2, 3)]
    assert [r.task_id for r in board.rows][:3] == ["model-flaky-500"] * 3  # adjacent, in order
    # Each retry ended the attempt before it: one running row per task.
    assert [r.phase for r in rows] == ["retried", "retried", "admission"]
    assert board.totals()["running"] == 1 and board.totals()["queued"] == len(results) - 1
    board.count(rows[2], PhaseChanged(phase=Phase.AGENT))
    board.count(rows[2], HealthWarning(kind="retry_storm", message="x"))
    board.count(rows[2], CleanupObserved(step=CleanupStep.SANDBOX_RELEASED, state=StepState.RUNNING))
    assert rows[2].phase == "agent" and rows[2].health == 1 and rows[2].cleanup == "pending"
    clock.now = 60.0
    board.finished(flaky.model_copy(update={"run_id": "flaky-a3"}))
    assert [r.phase for r in rows] == ["retried", "retried", "done"]
    assert rows[2].cleanup == "confirmed" and rows[2].outcome == "mark_evaluation_error"
    t = board.totals()
    assert t["failed_infra"] == 1 and t["running"] == 0 and t["done"] == 1
    assert board.rate_per_min() == 1.0 and board.eta_s() == (len(results) - 1) * 60


def test_resumed_and_never_started_rows_say_so_and_groups_are_the_results() -> None:
    results = _results()
    board = BatchBoard([r.task_id for r in results] + ["queued-one"], 3)
    hello = next(r for r in results if r.task_id == "hello-file")
    board.finished(hello.model_copy(update={"resumed": True}))
    row = next(r for r in board.rows if r.task_id == "hello-file")
    assert row.outcome == "resumed" and row.phase == "resumed" and row.cleanup == ""
    assert board.totals()["resumed"] == 1 and board.rate_per_min() is None  # resumed ones ran earlier
    never = hello.model_copy(
        update={"task_id": "queued-one", "run_id": "", "started": False, "failure_kind": "run_cancelled"}
    )
    board.finished(never)
    row = board.rows[-1]
    assert row.task_id == "queued-one" and row.outcome == "not started" and row.started_at is None
    for r in results:
        if r.task_id != "hello-file":
            board.start(r.task_id, r.attempt, r.run_id)
            board.finished(r)
    groups = {g.kind: g for g in board.groups()}
    assert set(groups) == {"run_cancelled", "model_server_error", "provider_oom_killed", "agent_timeout"}
    assert groups["run_cancelled"].task_ids == ["queued-one"] and groups["run_cancelled"].run_ids == [""]
    recorded = {g.kind: g.run_ids for g in group_failures(results)}
    assert {k: g.run_ids for k, g in groups.items() if k != "run_cancelled"} == recorded


def test_a_remote_batchs_rows_carry_their_node_and_fit_every_width() -> None:
    """Rows of a Ray batch: made by the executor's hooks (started, phase, node), the node shown in a
    column of its own at every width the screen supports, the line still fitting (with the scroll bar)."""
    from opencode_tui.screens.batch import COLUMNS, columns_for

    clock = iter(range(1000))
    board = BatchBoard(["a", "b"], 2, batch_id="b1", clock=lambda: float(next(clock)), remote=True)
    row = board.start("a", 1, "a-a1", "local")
    board.placed("a-a1", "f" * 56, "10.0.12.34")
    board.phase("a-a1", "agent")
    board.phase("nobody", "agent")  # (an attempt the board never saw: ignored)
    assert (row.node, row.node_id, row.phase) == ("10.0.12.34", "f" * 56, "agent")
    assert board.rows[1].node == "" and board.rows[1].queued
    handed = board.start("b", 1, "b-a1", "local")
    handed.phase = "submitted"  # (BatchTUI.started_elsewhere): no worker has taken it yet
    assert (board.totals()["running"], board.totals()["queued"]) == (1, 1)
    for width in (80, 100, 120, 140, 160, 200):
        local, remote = columns_for(width), columns_for(width, remote=True)
        assert "node" not in [c.key for c in local]
        keys = [c.key for c in remote]
        assert keys[:2] == ["task", "node"] and "provider" not in keys, (width, keys)
        assert sum(c.width + 1 for c in remote) + 1 <= width - 2, width  # room for the scroll bar
        dropped = {"provider"} | ({"calls"} if width < 160 else set())
        expected = [k for k in (c.key for c in local) if k not in dropped]
        assert keys == [expected[0], "node", *expected[1:]], (width, keys)
    assert len(COLUMNS) == len(columns_for(200, remote=True))  # provider out, node in
