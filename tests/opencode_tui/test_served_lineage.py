"""A replay's ``R`` and ``F`` in a served session (``opencode-tui serve``: one app per browser session):
the child runs live inside that app, as the runs browser's ``r`` does there, and comes back to the
browser with the parent and the child marked; read-only still refuses. Real engine, local provider, on
the recorded family of tests/fixtures/lineage-runs (the parent's task copied to where its record says)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from opencode_tui import read_only
from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.fork import ForkScreen
from opencode_tui.screens.live import LiveRunScreen
from opencode_tui.screens.replay import ReplayRunScreen
from opencode_tui.screens.runs import RunsList, RunsScreen
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui_core.artifacts import RunDirReader
from tests.opencode_tui.conftest import loaded, wait_for
from tests.opencode_tui.test_tui_lineage import FAMILY, PARENT, SAMPLES

SIZE = (160, 45)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    out = tmp_path / "runs"
    out.mkdir()
    shutil.copytree(FAMILY / PARENT, out / PARENT)
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "fix-bug", task)
    info = json.loads((out / PARENT / "run.json").read_text())
    info["task_dir"] = str(task)
    (out / PARENT / "run.json").write_text(json.dumps(info))
    return out


async def _open_parent(pilot) -> ReplayRunScreen:
    app = pilot.app
    assert isinstance(app.screen, RunsScreen)
    await pilot.press("enter")
    await loaded(pilot)
    screen = app.screen
    assert isinstance(screen, ReplayRunScreen)
    table = screen.query_one(ModelCallsTable)
    await wait_for(pilot, lambda: len(table.calls) == 6, what="the six model calls in the table")
    table.focus()
    second = [i for i, c in enumerate(table.calls) if c.kind == "agent"][1]
    table.move_cursor(row=second, animate=False)
    await pilot.pause()
    return screen


@pytest.mark.bwrap
async def test_F_in_a_served_session_forks_inside_the_app_and_comes_back(runs: Path, monkeypatch) -> None:
    monkeypatch.delenv(read_only.ENV, raising=False)
    monkeypatch.setenv(read_only.SERVED_ENV, "1")
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await _open_parent(pilot)
        await pilot.press("F")
        await pilot.pause()
        assert isinstance(app.screen, ForkScreen)
        await pilot.press("tab", "tab", *"look again", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, LiveRunScreen), 60, "the fork live in this app")
        assert app.lineage_request is None and app.is_running  # no second app was asked for
        episode = app.control
        assert episode is not None
        await wait_for(pilot, lambda: episode._result is not None, 180, "the fork to end")
        await pilot.press("escape")  # back to the browser once it has ended
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen), 30, "the runs browser")
        result = episode._result
        assert result is not None and result.cleanup_confirmed, result
        lst = app.screen.query_one(RunsList)
        names = [lst.get_row_at(i)[0] for i in range(lst.row_count)]
        assert Path(result.run_dir).name in names and PARENT in names
    info = RunDirReader(Path(result.run_dir)).info()
    assert info is not None and info.lineage == "fork" and info.fork_step == 2
    assert info.parent is not None and info.parent.run_id == PARENT
    assert info.replay is not None and info.replay.said == "look again"


async def test_R_in_a_read_only_session_is_refused(runs: Path, monkeypatch) -> None:
    monkeypatch.setenv(read_only.ENV, "1")
    monkeypatch.setenv(read_only.SERVED_ENV, "1")
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_parent(pilot)
        await pilot.press("R")
        await pilot.pause()
        assert app.screen is screen and app.control is None and app.lineage_request is None
        assert any("read-only" in str(n.message) for n in app._notifications)
