"""Pilot tests: reruns and forks (issue 28) in the runs browser and the diff, on run directories made
by the real commands (tests/fixtures/lineage-runs: a run of fix-bug, its ``fork --at 2`` and its
``rerun``)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from textual.widgets import Input, Label, Static

from opencode_tui.app import OpenCodeTUI
from opencode_tui.lineage_child import child_episode
from opencode_tui.lineage_request import LineageRequest
from opencode_tui.plain_text import diff_lines
from opencode_tui.screens.diff import DiffScreen, StepsTable
from opencode_tui.screens.fork import ForkScreen
from opencode_tui.screens.replay import ReplayRunScreen
from opencode_tui.screens.runs import RunsList, RunsScreen
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.timeline import Timeline
from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.diff import diff_runs
from opencode_tui_core.events import ModelCall
from tests.opencode_tui.conftest import loaded, wait_for

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
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
        assert lines[FORK].lstrip().startswith("└f@2 …") and "bf919c-a1 " in lines[FORK]
        assert lines[RERUN].lstrip().startswith("├ ↳r …") and "38144a-a1 " in lines[RERUN]
        assert "↳" not in lines[PARENT]
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=(230, 45)) as pilot:  # room for the full mark
        await pilot.pause()
        lines = _lines(app.screen)
        assert lines[FORK].lstrip().startswith("└ ↳ fork@2 ") and FORK in lines[FORK]
        assert lines[RERUN].lstrip().startswith("├ ↳ rerun ") and RERUN in lines[RERUN]


def _names(screen: RunsScreen) -> list[str]:
    lst = screen.query_one(RunsList)
    return [lst.get_row_at(i)[0] for i in range(lst.row_count)]


async def test_children_are_listed_under_their_parent_whatever_the_sort(runs, tmp_path):
    """Newest first the children (started after their parent) would come above it; by task, outcome or
    date ascending they would be apart from it among other runs: the family stays together, the parent
    first, the children in the sort's order; a child whose parent is filtered out stands alone."""
    # another run of the task, between the parent and its children, and one of another task
    for name, src in (
        ("fix-bug-20261202-095625-aaaaaa-a1", PARENT),
        ("hello-file-20261202-095700-bbbbbb-a1", PARENT),
    ):
        shutil.copytree(FAMILY / src, runs / name)
        info = json.loads((runs / name / "run.json").read_text())
        info["run_id"] = name
        info["task_id"] = name.rsplit("-", 4)[0]
        (runs / name / "run.json").write_text(json.dumps(info))
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        assert _names(screen) == [
            "hello-file-20261202-095700-bbbbbb-a1",
            "fix-bug-20261202-095625-aaaaaa-a1",
            PARENT,
            RERUN,  # newest first among the children too
            FORK,
        ]
        for _ in range(4):  # task, outcome, kind, provider
            await pilot.press("s")
            await wait_for(pilot, lambda: screen._loading is None, what="the sort")
            names = _names(screen)
            i = names.index(PARENT)
            assert set(names[i + 1 : i + 3]) == {FORK, RERUN}, (screen.index.sort_key, names)
        await pilot.press("S")  # reversed: the children still below their parent
        await pilot.pause()
        names = _names(screen)
        assert set(names[names.index(PARENT) + 1 :][:2]) == {RERUN, FORK}, names
        screen.set_filter("date:09:56:44")  # the rerun alone: its parent is not shown, so it is a root
        await pilot.pause()
        assert _names(screen) == [RERUN]
        assert _lines(screen)[RERUN].lstrip().startswith("↳r ")


async def test_families_in_a_large_runs_directory_are_placed_after_the_first_screen(runs, monkeypatch):
    """Above FAMILIES_AT_ONCE run directories the first screen reads no run.json (the children are
    not known yet); a thread reads them and then places the children, the cursor staying on its run."""
    import opencode_tui.screens.runs as runs_screen

    monkeypatch.setattr(runs_screen, "FAMILIES_AT_ONCE", 2)
    monkeypatch.setattr(runs_screen, "FAMILIES_AFTER_S", 3600)  # placed when the test says
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        lst = screen.query_one(RunsList)
        assert _names(screen) == [RERUN, FORK, PARENT]  # newest first, not placed yet
        lst.move_cursor(2)  # the parent (oldest)
        screen._place_families()
        await wait_for(
            pilot, lambda: _names(screen) == [PARENT, RERUN, FORK], what="the family placed", timeout=10
        )
        assert lst.cursor_row == 0 and screen.index.entry(0).name == PARENT  # type: ignore[union-attr]


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


# -- R and F on a replay: the request, then the child live (real engine, local provider) --------------


@pytest.fixture
def forkable(runs, tmp_path) -> Path:
    """The parent with its task at hand: a copy of fix-bug (the content it ran, so the same hash)."""
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "fix-bug", task)
    info = json.loads((runs / PARENT / "run.json").read_text())
    info["task_dir"] = str(task)
    (runs / PARENT / "run.json").write_text(json.dumps(info))
    return runs / PARENT


async def _replay_with_agent_call(pilot, n: int) -> ReplayRunScreen:
    await loaded(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, ReplayRunScreen)
    table = screen.query_one(ModelCallsTable)
    await wait_for(pilot, lambda: len(table.calls) == 6, what="the six model calls in the table")
    table.focus()
    rows = [i for i, c in enumerate(table.calls) if c.kind == "agent"]
    table.move_cursor(row=rows[n - 1], animate=False)
    await pilot.pause()
    return screen


async def test_R_on_a_replay_asks_for_a_rerun(forkable):
    app = OpenCodeTUI(run_dir=forkable)
    async with app.run_test(size=SIZE) as pilot:
        await _replay_with_agent_call(pilot, 1)
        await pilot.press("R")
        await pilot.pause()
    assert app.lineage_request == LineageRequest(run_dir=forkable, lineage="rerun")


async def test_F_on_a_model_call_forks_there_live_with_cleanup_confirmed(forkable):
    app = OpenCodeTUI(run_dir=forkable)
    async with app.run_test(size=SIZE) as pilot:
        await _replay_with_agent_call(pilot, 2)
        await pilot.press("F")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ForkScreen)
        assert modal.request.at == 2 and modal.steps == 5
        await pilot.press(*"say hi")  # into the URL box, then taken out: the recorded model
        for _ in range(6):
            await pilot.press("backspace")
        await pilot.press("tab", "tab", *"look again", "enter")
        await pilot.pause()
    request = app.lineage_request
    assert request == LineageRequest(run_dir=forkable, lineage="fork", at=2, say="look again")
    # what the command does with it on exit: the fork, live in the TUI
    # (its admission checks run their own event loop, as on the command line: off this one)
    episode, _config = await asyncio.to_thread(child_episode, request.args())
    live = OpenCodeTUI(control=episode, run_episode=episode.run)
    async with live.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: episode._result is not None, timeout=180, what="the fork to end")
    result = episode._result
    assert result is not None and result.cleanup_confirmed, result
    info = RunDirReader(Path(result.run_dir)).info()
    assert info.lineage == "fork" and info.fork_step == 2 and info.parent.run_id == PARENT
    assert info.replay.replayed >= 2 and info.replay.said == "look again"


async def test_F_where_no_fork_is_possible_says_why(forkable):
    app = OpenCodeTUI(run_dir=forkable)
    async with app.run_test(size=SIZE) as pilot:
        await _replay_with_agent_call(pilot, 5)  # the last agent call: nothing live after it
        await pilot.press("F")
        await pilot.pause()
        assert isinstance(app.screen, ReplayRunScreen) and app.lineage_request is None
        assert any("agent step 1 to 4" in str(n.message) for n in app._notifications)


@pytest.mark.parametrize("size", [(80, 24), (160, 45)])
def test_snapshot_fork_modal(forkable, snap_compare, size, monkeypatch):
    async def setup(pilot):
        await _replay_with_agent_call(pilot, 2)
        await pilot.press("F")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ForkScreen), what="the fork modal")
        # the URL box's cursor blinks: shown steadily, the picture does not depend on when it is taken
        for box in pilot.app.screen.query(Input):
            box.cursor_blink = False
        await pilot.pause()

    monkeypatch.chdir(forkable.parent.parent)
    app = OpenCodeTUI(run_dir=Path(forkable.parent.name) / forkable.name)
    assert snap_compare(app, terminal_size=size, run_before=setup)


async def test_F_on_the_timeline_forks_at_the_last_agent_call_before_the_cursor(forkable):
    app = OpenCodeTUI(run_dir=forkable)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _replay_with_agent_call(pilot, 1)  # the table's selection is not what counts
        agent = [
            i
            for i in range(screen.total)
            if isinstance(ev := screen.index.event_at(i), ModelCall) and ev.kind == "agent"
        ]
        screen.seek(agent[2] - 1)  # after the second agent call, before the third
        screen.query_one(Timeline).focus()
        await pilot.pause()
        await pilot.press("F")
        await wait_for(pilot, lambda: isinstance(app.screen, ForkScreen), what="the fork modal")
        assert app.screen.request.at == 2
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, ReplayRunScreen) and app.lineage_request is None


# -- F at a step whose recorded stream was cut ---------------------------------------------------------


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory) -> Path:
    """A real fix-bug run (local provider, the real OpenCode) whose model dropped the connection
    mid-stream at its first request and at the edit step's (the scripted model's ``drop``); OpenCode
    asked again each time. Agent calls: 1 (cut), 2, 3, 4 (cut), 5, 6, 7."""
    import yaml

    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.episode import Episode
    from opencode_tui_core.tasks import load_task

    base = tmp_path_factory.mktemp("cut-run")
    task = base / "task"
    shutil.copytree(SAMPLES / "fix-bug", task)
    data = yaml.safe_load((task / "trajectory.yaml").read_text())
    data["steps"][0]["fault"] = {"drop": True}
    data["steps"][2]["fault"] = {"drop": True}
    (task / "trajectory.yaml").write_text(yaml.safe_dump(data))
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}, "policy": {"max_attempts": 1}})
    result = asyncio.run(Episode(load_task(task), config, runs_dir=base / "runs").run())
    assert result.reward == 1.0, result.summary
    return Path(result.run_dir)


async def _select_agent_call(pilot, n: int, total: int) -> ReplayRunScreen:
    await loaded(pilot)
    screen = pilot.app.screen
    assert isinstance(screen, ReplayRunScreen)
    table = screen.query_one(ModelCallsTable)
    await wait_for(
        pilot,
        lambda: sum(c.kind == "agent" for c in table.calls) == total,
        what=f"the {total} agent calls in the table",
    )
    table.focus()
    rows = [i for i, c in enumerate(table.calls) if c.kind == "agent"]
    table.move_cursor(row=rows[n - 1], animate=False)
    await pilot.pause()
    return screen


@pytest.mark.slow
@pytest.mark.bwrap
async def test_F_at_a_cut_step_says_so_in_the_dialog_and_forks_from_the_last_complete_step(cut_run):
    app = OpenCodeTUI(run_dir=cut_run)
    async with app.run_test(size=SIZE) as pilot:
        await _select_agent_call(pilot, 4, 7)
        await pilot.press("F")
        await wait_for(pilot, lambda: isinstance(app.screen, ForkScreen), what="the fork modal")
        modal = app.screen
        assert isinstance(modal, ForkScreen)
        assert "Fork at step 3 of 7" in str(modal.query_one("#question", Label).render())
        moved = str(modal.query_one("#fork-moved", Static).render())
        assert moved.startswith("⚠ step 4's recorded answer was cut mid-stream (upstream stream broken")
        assert moved.endswith("the fork starts from step 3, the last complete step")
        assert "Agent model calls 1-3 are answered" in str(modal.query_one("#detail", Static).render())
        await pilot.press("escape")
        await pilot.pause()
        # step 1 was cut and nothing comes before it: no dialog, the reason instead
        await _select_agent_call(pilot, 1, 7)
        await pilot.press("F")
        await pilot.pause()
        assert isinstance(app.screen, ReplayRunScreen) and app.lineage_request is None
        said = [str(n.message) for n in app._notifications if "No fork" in str(n.message)]
        assert len(said) == 1 and "step 1's recorded answer was cut mid-stream" in said[0], said
        assert "nothing to fork from" in said[0] and "R reruns the run instead" in said[0]


def test_snapshot_fork_modal_at_a_cut_step(forkable, snap_compare, monkeypatch):
    """The dialog's warning line, laid out at 80x24. The fixture's step 3 is marked as the proxy marks a
    dropped stream (the picture must not depend on a run made here); the real cut is the test above."""
    calls = forkable / "model_calls.jsonl"
    lines = [json.loads(ln) for ln in calls.read_text().splitlines()]
    agent = sorted((c for c in lines if c["kind"] == "agent"), key=lambda c: c["started_at"])
    agent[2]["error"] = "upstream stream broken: ReadError"
    calls.write_text("".join(json.dumps(c) + "\n" for c in lines))

    async def setup(pilot):
        await _replay_with_agent_call(pilot, 3)
        await pilot.press("F")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ForkScreen), what="the fork modal")
        for box in pilot.app.screen.query(Input):
            box.cursor_blink = False
        await pilot.pause()

    monkeypatch.chdir(forkable.parent.parent)
    app = OpenCodeTUI(run_dir=Path(forkable.parent.name) / forkable.name)
    assert snap_compare(app, terminal_size=(80, 24), run_before=setup)


def test_a_fork_of_a_fork_is_placed_two_deep_and_a_loop_of_parents_loses_no_run(runs):
    """Tree marks by depth (the index the browser draws from); a hand-edited loop (each names the
    other as parent) is shown flat, every run kept."""
    from opencode_tui.runs_index import RunsIndex

    grandchild = "fix-bug-20261202-095700-cccccc-a1"
    shutil.copytree(FAMILY / FORK, runs / grandchild)
    info = json.loads((runs / grandchild / "run.json").read_text())
    info["run_id"], info["parent"] = grandchild, {"run_id": FORK, "run_dir": f"/elsewhere/{FORK}"}
    (runs / grandchild / "run.json").write_text(json.dumps(info))
    index = RunsIndex(runs)
    index.scan_families()
    index.apply()
    rows = [(index.tree[r], index.entry(r).name) for r in range(len(index))]  # type: ignore[union-attr]
    assert rows == [("", PARENT), ("├ ", RERUN), ("└ ", FORK), ("  └ ", grandchild)]
    index.reverse = False  # oldest first: the same family, the children in that order
    index.apply()
    rows = [(index.tree[r], index.entry(r).name) for r in range(len(index))]  # type: ignore[union-attr]
    assert rows == [("", PARENT), ("├ ", FORK), ("│ └ ", grandchild), ("└ ", RERUN)]
    info = json.loads((runs / PARENT / "run.json").read_text())
    info["parent"] = {"run_id": RERUN, "run_dir": str(runs / RERUN)}  # the parent's parent: its rerun
    (runs / PARENT / "run.json").write_text(json.dumps(info))
    index = RunsIndex(runs)
    index.scan_families()
    index.apply()
    assert sorted(index.entry(r).name for r in range(len(index))) == sorted(  # type: ignore[union-attr]
        [PARENT, FORK, RERUN, grandchild]
    )
