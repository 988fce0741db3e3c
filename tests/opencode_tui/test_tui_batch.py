"""The batch screen (issue 29) driven by Pilot against a REAL batch: four sample tasks (oom and
model-flaky-500 among them) at --jobs 2 on the local (bubblewrap) provider with the scripted model, run
by the batch engine ``--batch`` uses. Rows go through phases; Enter opens a live attempt, Esc returns;
the groups at the end match the results the engine wrote (results.jsonl)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from textual.widgets import DataTable, OptionList

from opencode_tui.batch_app import BatchTUI
from opencode_tui.screens.batch import BatchScreen, GroupRunsScreen
from opencode_tui.screens.live import LiveRunScreen
from opencode_tui.screens.replay import ReplayRunScreen
from opencode_tui_core.batch import LocalExecutor
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.failure_groups import group_failures
from opencode_tui_core.resume import load_batch
from opencode_tui_core.tasks import load_task

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
TASKS = ["oom", "model-flaky-500", "hello-file", "exit-137"]


def batch_app(tmp_path: Path, tasks: list[str] = TASKS, attempts: int = 2) -> BatchTUI:
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": "local"}, "runs_dir": str(tmp_path / "runs")}
    )
    app: BatchTUI | None = None

    def attach(episode) -> None:
        assert app is not None
        app.attach(episode)

    app = BatchTUI(
        [load_task(SAMPLES / t) for t in tasks],
        config,
        tmp_path / "runs",
        jobs=2,
        attempts=attempts,
        executor=LocalExecutor(attach),
    )
    return app


@pytest.mark.slow
@pytest.mark.bwrap
async def test_batch_screen_runs_the_batch_opens_a_live_attempt_and_groups_match(tmp_path, wait):
    app = batch_app(tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, BatchScreen)
        board = app.board
        assert [r.task_id for r in board.rows] == TASKS  # a row per task from the start
        seen: dict[str, set[str]] = {}

        def note() -> None:
            for r in board.rows:
                seen.setdefault(r.task_id, set()).add(r.phase)

        async def until(pred, what: str, timeout: float = 120.0) -> None:
            def check() -> bool:
                note()
                return pred()

            await wait(pilot, check, timeout=timeout, what=what)

        # Two at a time: two rows leave "queued", the other two wait.
        await until(lambda: board.totals()["running"] == 2, "two attempts running")
        assert board.totals()["queued"] == 2
        # Enter on a running attempt in its agent phase opens its live run screen, from its start.
        await until(lambda: any(r.running and r.phase == "agent" for r in board.rows), "an agent running")
        i = next(i for i, r in enumerate(board.rows) if r.running and r.phase == "agent")
        screen.table.move_cursor(i)
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, LiveRunScreen), what="the live screen")
        live = app.screen
        assert isinstance(live, LiveRunScreen) and live.control is app.control
        assert live.control.run_id == board.rows[i].run_id
        await wait(pilot, lambda: live.state.started is not None, what="the live screen's first events")
        assert live.state.started.task_id == board.rows[i].task_id
        await pilot.press("escape")
        await wait(pilot, lambda: isinstance(app.screen, BatchScreen), what="back on the batch screen")
        assert app.control is None and app.opened is None
        # The batch runs to its end; the rows went through the phases.
        await until(lambda: board.ended, "the batch to end", timeout=300)
        await pilot.pause(0.6)
        for task in TASKS:
            assert {"agent", "done"} <= seen[task], (task, seen[task])
        assert "queued" in seen["hello-file"] and "queued" in seen["exit-137"]  # jobs 2: they waited
        # model-flaky-500 was retried: its two attempts are two rows of one task, adjacent.
        flaky = [r for r in board.rows if r.task_id == "model-flaky-500"]
        assert [r.attempt for r in flaky] == [1, 2] and flaky[0].phase == "retried"
        assert all(r.cleanup == "confirmed" for r in board.rows if r.result is not None)
        # The groups shown are those of the results the engine recorded.
        assert app.summary is not None
        recorded = load_batch(tmp_path / "runs", app.summary.batch_id)
        assert len(recorded) == 4
        shown = [(g.kind, g.stage, g.signature, sorted(g.run_ids)) for g in board.groups()]
        assert shown == [(g.kind, g.stage, g.signature, sorted(g.run_ids)) for g in group_failures(recorded)]
        kinds = {g.kind for g in board.groups()}
        assert {"provider_oom_killed", "model_server_error"} <= kinds
        options = screen.query_one("#batch-groups", OptionList)
        shown_words = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert shown_words == [g.words() for g in group_failures(recorded)]
        assert any("provider_oom_killed at agent" in w for w in shown_words)
        # Enter on a group lists its runs; Enter on one opens it (finished: its replay); Esc, Esc: back.
        oom = next(i for i, g in enumerate(board.groups()) if g.kind == "provider_oom_killed")
        options.focus()
        options.highlighted = oom
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, GroupRunsScreen), what="the group's runs")
        runs_table = app.screen.query_one("#group-runs", DataTable)
        assert runs_table.row_count == 1
        assert runs_table.get_row_at(0)[1] == board.groups()[oom].run_ids[0]
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, ReplayRunScreen), what="the oom run's replay")
        assert app.screen.run_dir is not None and app.screen.run_dir.name == board.groups()[oom].run_ids[0]
        await pilot.press("escape")
        await wait(pilot, lambda: isinstance(app.screen, BatchScreen), what="back from the group's run")
        screen.table.focus()
        totals = str(screen.query_one("#batch-totals").render())
        assert "running 0 · queued 0" in totals and "done" in totals
        # A finished attempt opens as its replay.
        screen.table.move_cursor(0)
        await pilot.press("enter")
        await wait(pilot, lambda: not isinstance(app.screen, BatchScreen), what="the replay")
        await pilot.press("escape")
        await wait(pilot, lambda: isinstance(app.screen, BatchScreen), what="back from the replay")
    # As --batch would exit for these results: model-flaky-500's endpoint failure is an infra failure.
    assert app.exit_code() == ExitCode.INFRA


def _busy(tmp_path: Path, name: str) -> Path:
    task = tmp_path / name
    shutil.copytree(SAMPLES / "hello-file", task)
    steps = [
        {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "echo started; sleep 120", "description": "Wait"}}
            ]
        },
        {"text": "done"},
    ]
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    spec = yaml.safe_load((task / "task.yaml").read_text())
    (task / "task.yaml").write_text(yaml.safe_dump({**spec, "id": name}))
    return task


@pytest.mark.slow
@pytest.mark.bwrap
async def test_cancel_on_the_batch_screen_asks_then_closes_every_running_episode(tmp_path, wait):
    """`c`, answered `n`: nothing happens; `c`, `y`: the batch is cancelled (the running attempts close
    with cleanup confirmed, the queued one never starts) and the screen stays to be read; exit 130."""
    names = ["busy-a", "busy-b", "busy-c"]
    for n in names:
        _busy(tmp_path, n)
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    app: BatchTUI | None = None

    def attach(episode) -> None:
        assert app is not None
        app.attach(episode)

    app = BatchTUI(
        [load_task(tmp_path / n) for n in names],
        config,
        tmp_path / "runs",
        jobs=2,
        attempts=1,
        executor=LocalExecutor(attach),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        board = app.board
        await wait(
            pilot,
            lambda: sum(r.phase == "agent" for r in board.rows) == 2,
            timeout=120,
            what="two attempts in their agent phase",
        )
        await pilot.press("f1")  # the help lists the batch screen's keys
        await wait(pilot, lambda: type(app.screen).__name__ == "HelpScreen", what="the help")
        await pilot.press("escape")
        await wait(pilot, lambda: isinstance(app.screen, BatchScreen), what="back from the help")
        await pilot.press("c")
        await wait(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="the question")
        await pilot.press("n")
        await pilot.pause(0.3)
        assert app.batch.cancelled_by is None and app.batch_running
        await pilot.press("c")
        await wait(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="the question")
        await pilot.press("y")
        await wait(pilot, lambda: board.ended, timeout=120, what="the batch to close")
        await pilot.pause(0.6)
        assert app.is_running  # the end state stays on screen
        assert app.batch.cancelled_by == "user"
        started = [r for r in board.rows if r.result is not None and r.result.started]
        assert len(started) == 2 and all(r.cleanup == "confirmed" for r in started)
        assert all(r.result is not None and r.result.failure_kind == "run_cancelled" for r in board.rows)
        assert [r.outcome for r in board.rows if r.result is not None and not r.result.started] == [
            "not started"
        ]
        assert "done · cancelled by user" in str(app.screen.query_one("#batch-totals").render())
        await pilot.press("q")  # the batch has ended: q leaves at once
    assert app.exit_code() == ExitCode.INTERRUPTED


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_second_batch_screen_on_the_same_runs_shows_the_scored_task_as_resumed(tmp_path, wait):
    first = batch_app(tmp_path, ["hello-file"], attempts=1)
    async with first.run_test(size=(120, 40)) as pilot:
        await wait(pilot, lambda: first.board.ended, timeout=120, what="the first batch")
    assert first.summary is not None and first.summary.scored == 1
    again = batch_app(tmp_path, ["hello-file", "exit-137"], attempts=1)
    async with again.run_test(size=(120, 40)) as pilot:
        await wait(pilot, lambda: again.board.rows[0].phase == "resumed", what="the resumed row")
        row = again.board.rows[0]
        assert row.outcome == "resumed" and row.run_id == first.summary.results[0].run_id
        assert again.board.totals()["resumed"] == 1
        await pilot.pause(0.6)
        assert "resumed 1" in str(again.screen.query_one("#batch-totals").render())
        assert again.screen.table.get_row_at(0)[:3] == ["hello-file", "1/1", "resumed"]
        # Enter on it opens the earlier run's replay (its run directory is still there).
        again.screen.table.move_cursor(0)
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(again.screen, ReplayRunScreen), what="the earlier run's replay")
        await pilot.press("escape")
        await wait(pilot, lambda: again.board.ended, timeout=120, what="the second batch")


@pytest.mark.slow
@pytest.mark.bwrap
async def test_cancel_on_an_opened_attempt_cancels_that_episode_only(tmp_path, wait):
    """`c` on a live attempt opened from the batch screen (answered `y`) closes that episode, cleanup
    confirmed; the batch and its other running attempt go on."""
    names = ["busy-a", "busy-b"]
    for n in names:
        _busy(tmp_path, n)
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    app: BatchTUI | None = None

    def attach(episode) -> None:
        assert app is not None
        app.attach(episode)

    app = BatchTUI(
        [load_task(tmp_path / n) for n in names],
        config,
        tmp_path / "runs",
        jobs=2,
        attempts=1,
        executor=LocalExecutor(attach),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        board = app.board
        await wait(
            pilot,
            lambda: sum(r.phase == "agent" for r in board.rows) == 2,
            timeout=120,
            what="two attempts in their agent phase",
        )
        app.screen.table.move_cursor(0)
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, LiveRunScreen), what="the live screen")
        await pilot.press("c")
        await wait(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", what="the question")
        await pilot.press("y")
        await wait(pilot, lambda: board.rows[0].result is not None, timeout=90, what="busy-a to close")
        assert board.rows[0].result.failure_kind == "run_cancelled"
        assert board.rows[0].cleanup == "confirmed"
        assert board.rows[1].running and app.batch_running and app.batch.cancelled_by is None
        await pilot.press("escape")
        await wait(pilot, lambda: isinstance(app.screen, BatchScreen), what="back on the batch screen")
        await pilot.press("ctrl+c")  # then the rest, the way a batch is cancelled
        await wait(pilot, lambda: board.ended, timeout=90, what="the batch to close")
    assert board.rows[1].cleanup == "confirmed"
