"""Pilot tests: reruns and forks (issue 28) in the runs browser and the diff, on run directories made
by the real commands (tests/fixtures/lineage-runs: a run of fix-bug, its ``fork --at 2`` and its
``rerun``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.diff import diff_runs
from opencode_tui.app import OpenCodeTUI
from opencode_tui.plain_text import diff_lines
from opencode_tui.screens.diff import DiffScreen, StepsTable
from opencode_tui.screens.runs import RunsList, RunsScreen

FAMILY = Path(__file__).resolve().parents[1] / "fixtures" / "lineage-runs"
PARENT = "fix-bug-20261202-095618-65ebfb-a1"
FORK = "fix-bug-20261202-095632-bf919c-a1"  # fork --at 2
RERUN = "fix-bug-20261202-095644-38144a-a1"
SIZE = (160, 45)


@pytest.fixture
def runs(tmp_path) -> Path:
    out = tmp_path / "runs"
    out.mkdir()
    for name in (PARENT, FORK, RERUN):
        shutil.copytree(FAMILY / name, out / name)
    return out


def _lines(screen: RunsScreen) -> dict[str, str]:
    """Each run's line as drawn, by run name."""
    lst = screen.query_one(RunsList)
    out = {}
    for y in range(1, lst.row_count + 1):
        text = "".join(seg.text for seg in lst.render_line(y))
        name = lst.get_row_at(y - 1)[0]
        out[name] = text
    return out


async def test_children_are_marked_with_their_lineage(runs):
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        lines = _lines(app.screen)
        # the name's end (its hash and attempt) stays: the mark is short where the column is
        assert lines[FORK].lstrip().startswith("↳f@2 …") and "bf919c-a1 " in lines[FORK]
        assert lines[RERUN].lstrip().startswith("↳r …") and "38144a-a1 " in lines[RERUN]
        assert "↳" not in lines[PARENT]
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=(230, 45)) as pilot:  # room for the full mark
        await pilot.pause()
        lines = _lines(app.screen)
        assert lines[FORK].lstrip().startswith("↳ fork@2 ") and FORK in lines[FORK]
        assert lines[RERUN].lstrip().startswith("↳ rerun ") and RERUN in lines[RERUN]


async def _diff_of(pilot, app, row_name: str) -> DiffScreen:
    screen = app.screen
    lst = screen.query_one(RunsList)
    row = [lst.get_row_at(i)[0] for i in range(lst.row_count)].index(row_name)
    lst.move_cursor(row)
    await pilot.press("d")
    diff = app.screen
    assert isinstance(diff, DiffScreen)
    for _ in range(500):
        if diff.loaded:
            break
        await pilot.pause(0.01)
    assert diff.diff is not None, diff.error
    return diff


async def test_d_on_a_fork_diffs_it_with_its_parent_aligned_at_the_fork_point(runs):
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        diff = await _diff_of(pilot, app, FORK)
        assert (diff.run_a.name, diff.run_b.name) == (PARENT, FORK)
        d = diff.diff
        assert d is not None and d.lineage is not None
        # fork --at 2: two agent calls and the tool calls they asked for (steps 1-4) came from the record
        assert d.lineage.kind == "fork" and d.lineage.replayed_agent_calls == 2
        assert [r.replayed for r in d.steps] == [True] * 4 + [False] * (len(d.steps) - 4)
        table = diff.query_one(StepsTable)
        marks = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert marks[:4] == ["↺1", "↺2", "↺3", "↺4"] and marks[4] == "5"
        assert "replayed from A: 4" in str(table.border_title)
        await pilot.pause()
        drift = str(diff.query_one("#diff-drift").render())
        assert "B is a fork of A at step 2: steps 1-4 replayed" in drift and "live from step 5" in drift


async def test_d_on_a_rerun_diffs_it_with_its_parent_every_step_replayed(runs):
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        diff = await _diff_of(pilot, app, RERUN)
        assert (diff.run_a.name, diff.run_b.name) == (PARENT, RERUN)
        d = diff.diff
        assert d is not None and d.lineage is not None and d.lineage.kind == "rerun"
        assert d.first_divergence is None and all(r.replayed for r in d.steps)


async def test_d_on_a_run_without_a_parent_and_nothing_marked_says_what_to_do(runs):
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        lst = app.screen.query_one(RunsList)
        lst.move_cursor([lst.get_row_at(i)[0] for i in range(lst.row_count)].index(PARENT))
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        assert any("diffs it with its parent" in str(n.message) for n in app._notifications)


async def test_d_on_a_fork_whose_parent_is_gone_says_so(runs, tmp_path):
    shutil.rmtree(runs / PARENT)
    info = json.loads((runs / FORK / "run.json").read_text())
    info["parent"]["run_dir"] = str(tmp_path / "gone" / PARENT)  # not where it was made either
    (runs / FORK / "run.json").write_text(json.dumps(info))
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        lst = app.screen.query_one(RunsList)
        lst.move_cursor([lst.get_row_at(i)[0] for i in range(lst.row_count)].index(FORK))
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        assert any("not in" in str(n.message) for n in app._notifications)


def test_plain_diff_says_which_steps_were_replayed(runs):
    lines = diff_lines(diff_runs(runs / PARENT, runs / FORK))
    assert any(ln.startswith("B is a fork of A at step 2: steps 1-4 replayed") for ln in lines)
    steps = [ln.split()[0] for ln in lines if ln[:1] in " >!" and ln[1:2].isdigit()]
    assert steps[:5] == ["1=", "2=", "3=", "4=", "5"]
    # unrelated runs (A is no parent of B): no lineage
    assert diff_runs(runs / FORK, runs / RERUN).lineage is None
    assert diff_runs(runs / RERUN, runs / PARENT).lineage is None


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
def test_snapshot_browser_with_a_family(runs, snap_compare, size, monkeypatch):
    async def setup(pilot):
        await pilot.pause()

    # the run directories' own names and times, and a relative runs directory: the same everywhere
    monkeypatch.chdir(runs.parent)
    assert snap_compare(OpenCodeTUI(runs_dir=Path(runs.name)), terminal_size=size, run_before=setup)
