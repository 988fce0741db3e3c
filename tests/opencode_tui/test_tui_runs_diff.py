"""Pilot tests: the runs browser (sort, filter, marks, diff, re-run), the diff screen and the health
warnings in the run screen, on real recorded run directories (tests/fixtures/runs and more-runs, from
scripts/record-fixture-runs) and, for the re-run, a real episode on the local provider."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from opencode_tui import format as fmt
from opencode_tui.app import OpenCodeTUI
from opencode_tui.cli import main
from opencode_tui.screens.diff import DiffScreen, StepsTable
from opencode_tui.screens.run import RunScreen
from opencode_tui.screens.runs import RunsList, RunsScreen
from opencode_tui.screens.warning_detail import WarningDetailScreen
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.progress import WarningsBar
from opencode_tui_core.admission import rerun_inputs
from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.events import HealthWarning
from opencode_tui_core.tasks import load_task

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
RECORDED = {
    "hello-file": FIXTURES / "runs" / "hello-file",
    "oom": FIXTURES / "runs" / "oom",
    "exit-137": FIXTURES / "more-runs" / "exit-137",
    "compaction-storm": FIXTURES / "more-runs" / "compaction-storm",
}
SIZE = (160, 45)


@pytest.fixture
def runs(tmp_path) -> Path:
    """The four recorded runs under their run ids (the names the engine gives), in one runs directory."""
    out = tmp_path / "runs"
    out.mkdir()
    for src in RECORDED.values():
        shutil.copytree(src, out / RunDirReader(src).info().run_id)
    return out


def _rows(screen: RunsScreen) -> list[list[str]]:
    lst = screen.query_one(RunsList)
    return [lst.get_row_at(i) for i in range(lst.row_count)]


async def _settle(pilot, screen: RunsScreen) -> None:
    for _ in range(500):
        if screen._loading is None and not screen.index.needs_all_infos:
            break
        await pilot.pause(0.01)
    await pilot.pause()


async def test_sort_and_filter(runs):
    infos = {p.name: RunDirReader(p).info() for p in runs.iterdir()}
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        # newest first by default, from the names alone
        by_date = sorted(infos, key=lambda n: infos[n].started_at, reverse=True)
        assert [r[0] for r in _rows(screen)] == by_date
        assert sum(e.loaded for e in screen.index.entries) == len(infos)  # all four are on screen
        await pilot.press("s")  # task
        await _settle(pilot, screen)
        assert [r[1] for r in _rows(screen)] == sorted(i.task_id for i in infos.values())
        await pilot.press("s")  # outcome
        await _settle(pilot, screen)
        outcomes = [r[2] for r in _rows(screen)]
        assert outcomes == sorted(outcomes) and set(outcomes) == {"count_as_zero", "scored"}
        await pilot.press("S")  # reversed
        await _settle(pilot, screen)
        assert [r[2] for r in _rows(screen)] == sorted(outcomes, reverse=True)
        # a filter by failure kind, typed in the filter box
        await pilot.press("slash")
        await pilot.press(*"kind:oom", "enter")
        await _settle(pilot, screen)
        assert [r[1] for r in _rows(screen)] == ["oom"]
        assert "1 of 4" in str(screen.query_one("#runs-title").render())
        screen.set_filter("outcome:scored provider:docker")
        await _settle(pilot, screen)
        assert sorted(r[1] for r in _rows(screen)) == ["compaction-storm", "exit-137", "hello-file"]
        screen.set_filter("date:2026-12-01")
        await _settle(pilot, screen)
        assert sorted(r[1] for r in _rows(screen)) == sorted(
            i.task_id for i in infos.values() if i.started_at.strftime("%Y-%m-%d") == "2026-12-01"
        )
        screen.set_filter("date<2026-12")  # a range: the runs started before December
        await _settle(pilot, screen)
        assert sorted(r[1] for r in _rows(screen)) == sorted(
            i.task_id for i in infos.values() if i.started_at.strftime("%Y-%m") < "2026-12"
        )
        screen.set_filter("date>=2026-11-29 date<=2026-11-29")
        await _settle(pilot, screen)
        assert {r[1] for r in _rows(screen)} == {"hello-file", "oom"}
        await pilot.press("escape")  # clears the filter
        await _settle(pilot, screen)
        assert len(_rows(screen)) == 4
        # the columns kept: cleanup confirmed and human
        row = next(r for r in _rows(screen) if r[1] == "oom")
        assert row[7] == "✓ receipt" and row[8] == "" and row[9] == "docker"


async def test_runs_browser_fits_80_columns(runs):
    """At 80 columns the list does not scroll sideways: the start and the reward stay (without them two
    attempts of a task look the same), with cleanup, health and kept in their narrow forms (a confirmed
    cleanup is ✓); batch, provider, duration and human (the outcome says it) are dropped."""
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        lst = app.screen.query_one(RunsList)
        assert lst.virtual_size.width <= lst.scrollable_content_region.width
        assert lst.max_scroll_x == 0
        shown = lst.render_lines(lst.scrollable_content_region.reset_offset)
        header, first = shown[0].text, shown[1].text
        for title in ("run", "task", "outcome", "rew", "failure", "started", "cln", "⚠", "kept"):
            assert title in header, header
        for dropped in ("prov", "hum", "batch", "dur"):
            assert dropped not in header, header
        infos = {RunDirReader(p).info().run_id: RunDirReader(p).info() for p in runs.iterdir()}
        top = infos[lst.get_row_at(0)[0]]
        assert top.started_at.strftime("%m-%d %H:%M") in first and "✓" in first, first
        reward = top.outcome.reward if top.outcome else None
        assert (fmt.DASH if reward is None else f"{reward:g}") in first, first
        assert first.split()[0].endswith(top.run_id[-8:]), first  # the name's end: what tells runs apart
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=(160, 45)) as pilot:  # wide: every column, full titles
        await pilot.pause()
        lst = app.screen.query_one(RunsList)
        header = lst.render_lines(lst.scrollable_content_region.reset_offset)[0].text
        for title in ("reward", "started (UTC)", "cleanup", "human", "provider", "health", "batch", "kept"):
            assert title in header, header


async def test_mark_two_runs_and_diff(runs, wait):
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        tasks = [r[1] for r in _rows(screen)]
        lst = screen.query_one(RunsList)
        await pilot.press("d")  # nothing marked: a hint, no screen
        assert isinstance(app.screen, RunsScreen)
        lst.move_cursor(tasks.index("oom"))
        await pilot.press("space")
        lst.move_cursor(tasks.index("exit-137"))
        await pilot.press("space")
        assert "marked 2/2" in str(screen.query_one("#runs-title").render())
        await pilot.press("d")
        await wait(pilot, lambda: isinstance(app.screen, DiffScreen), what="the diff screen")
        diff = app.screen
        assert isinstance(diff, DiffScreen)
        await wait(pilot, lambda: diff.loaded, what="the diff, built in a worker thread")
        await pilot.pause()
        assert diff.error is None and diff.diff is not None
        assert diff.diff.a.task_id == "oom" and diff.diff.b.task_id == "exit-137"
        table = diff.query_one(StepsTable)
        assert table.row_count == len(diff.diff.steps) == 5
        assert table.cursor_row == diff.diff.first_divergence == 1
        assert str(table.get_row_at(1)[0]).startswith("▶")
        assert "task task_id: oom → exit-137" in str(diff.query_one("#diff-drift").render())
        deltas = str(diff.query_one("#diff-deltas").render())
        assert "outcome count_as_zero → scored" in deltas and "reward 0 → 1" in deltas
        await pilot.press("home", "f")  # back to the first divergence
        assert table.cursor_row == 1
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)


def test_diff_command_json(capsys):
    assert main(["diff", str(RECORDED["oom"]), str(RECORDED["exit-137"]), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["first_divergence"] == 1
    assert [r["a"]["name"] for r in d["steps"]] == ["agent", "bash", "agent", "write", "agent"]
    assert {x["key"]: x["b"] for x in d["deltas"]}["outcome"] == "scored"
    assert main(["diff", str(RECORDED["oom"]), "/nonexistent/run", "--json"]) == 2


async def test_diff_command_tui_side_by_side(wait):
    app = OpenCodeTUI(diff=(RECORDED["hello-file"], RECORDED["compaction-storm"]))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, DiffScreen)
        await wait(pilot, lambda: screen.loaded, what="the diff, built in a worker thread")
        await pilot.pause()
        first = screen.diff.first_divergence
        assert first is not None
        row = screen.diff.steps[first]
        # hello-file writes first, the storm reads first: where they part
        assert (row.a.name, row.b.name) == ("write", "read")
        deltas = str(screen.query_one("#diff-deltas").render())
        assert "compactions 0 → 4" in deltas and "health.compaction_storm 0 → 4" in deltas


async def test_health_warnings_in_the_run_screen(replay_loaded):
    """The recorded compaction-storm run: the warnings line, the Failures/warnings rows, the timeline
    markers and the jump key."""
    run = RECORDED["compaction-storm"]
    warnings = [e for e in RunDirReader(run).events() if isinstance(e, HealthWarning)]
    assert len(warnings) == 4
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        line = str(screen.query_one(WarningsBar).render())
        assert f"health compaction_storm {warnings[-1].message[:40]}" in line
        table = screen.query_one(FailuresTable)
        kinds = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert kinds == ["compaction_storm"] * 4
        assert [str(table.get_row_at(i)[3]) for i in range(table.row_count)] == ["warning"] * 4
        assert len(screen.markers["health"]) == 4
        screen.query_one("#timeline").focus()
        await pilot.press("home", "w")
        await pilot.pause()
        assert screen.cursor == screen.markers["health"][0]
        # Enter on a health row opens its detail (test_tui_first_use.py follows it to its model call)
        table.focus()
        table.move_cursor(row=0)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, WarningDetailScreen) and app.screen.record == warnings[0]


@pytest.mark.slow
@pytest.mark.bwrap
async def test_rerun_a_run_as_recorded(tmp_path):
    """A real hello-file episode on the local provider, then `r` on it in the browser: the app ends with
    the request, and the recorded task and config run again (a second real episode) with the same
    config."""
    runs = tmp_path / "runs"
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}, "runs_dir": str(runs)})
    first = (await run_batch([load_task(SAMPLES / "hello-file")], config, runs_dir=runs)).results[0]
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
    assert app.rerun_request == Path(first.run_dir)
    info = RunDirReader(app.rerun_request).info()
    again_config, task = rerun_inputs(info, app.rerun_request)
    assert again_config.model_dump(mode="json") == info.config
    assert task.id == "hello-file" and str(task.root) == info.task_dir
    # what `rerun` hands the live TUI: an Episode in the same runs directory
    second = await Episode(task, again_config, runs_dir=app.rerun_request.parent).run()
    assert second.action == "scored" and second.run_dir != first.run_dir
    assert RunDirReader(Path(second.run_dir)).info().config == info.config


async def test_rerun_refuses_a_run_without_its_task(runs):
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        # every recorded fixture names a task directory on the recording machine; make one vanish
        entry = screen.index.entry(0)
        info = entry.info()
        info.task_dir = str(Path("/nonexistent") / info.task_id)
        (entry.path / "run.json").write_text(info.model_dump_json())
        entry._info = info
        await pilot.press("r")
        await pilot.pause()
        assert app.rerun_request is None and isinstance(app.screen, RunsScreen)
        assert any("cannot be re-run" in str(n.message) for n in app._notifications)


def test_browser_lists_many_runs_lazily(tmp_path, monkeypatch):
    """Only the rows on screen read their run.json (above FAMILIES_AT_ONCE runs; the rest are read after
    the first screen, in a thread, to place reruns and forks under their parents: held off here, tested
    in test_tui_lineage)."""
    import opencode_tui.screens.runs as runs_screen

    assert runs_screen.FAMILIES_AT_ONCE < 300
    monkeypatch.setattr(runs_screen, "FAMILIES_AFTER_S", 3600)
    src = RECORDED["hello-file"]
    info = RunDirReader(src).info()
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in range(300):
        d = runs / f"hello-file-20260101-{i // 60:02d}{i % 60:02d}00-{i:06x}-a1"
        d.mkdir()
        (d / "events.jsonl").write_text("")
        (d / "run.json").write_text(info.model_copy(update={"run_id": d.name}).model_dump_json())

    async def go() -> None:
        app = OpenCodeTUI(runs_dir=runs)
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.pause()
            screen = app.screen
            read = sum(e.loaded for e in screen.index.entries)
            assert 0 < read <= 30
            assert screen.query_one(RunsList).get_row_at(0)[0].startswith("hello-file-20260101-0459")
            await pilot.press("end")
            await pilot.pause()
            assert sum(e.loaded for e in screen.index.entries) <= 2 * 30

    asyncio.run(go())


@pytest.mark.slow
@pytest.mark.bwrap
async def test_health_warning_shows_live_while_the_agent_runs(tmp_path, wait):
    """A real compaction-storm episode (local provider, the real OpenCode, the scripted model) in the live
    TUI: the warnings line names the storm while the episode is still in its agent phase."""
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    episode = Episode(load_task(SAMPLES / "compaction-storm"), config, runs_dir=tmp_path / "runs")
    app = OpenCodeTUI(control=episode, run_episode=episode.run)
    seen_in: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, RunScreen)
        bar = screen.query_one(WarningsBar)
        for _ in range(6000):  # 60 s at most
            state = screen.state
            if "health compaction_storm" in str(bar.render()) and not seen_in:
                seen_in.append(str(state.phase.phase) if state.phase else "?")
            if state.finished:
                break
            await pilot.pause(0.01)
        await wait(pilot, lambda: app.episode_done, timeout=60, what="the episode to end")
        assert screen.state.outcome is not None and screen.state.outcome.action == "scored"
        assert len(screen.state.health) == 4
        table = screen.query_one(FailuresTable)
        assert table.row_count == 4
    assert seen_in == ["agent"]


def test_runs_json_has_health_and_cleanup(capsys):
    assert main(["runs", "--runs-dir", str(FIXTURES / "more-runs"), "--json"]) == 0
    rows = {r["task_id"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["compaction-storm"]["health"] == {"compaction_storm": 4}
    assert rows["exit-137"]["health"] == {}
    assert rows["exit-137"]["cleanup_confirmed"] is True and rows["exit-137"]["human_intervened"] is False


@pytest.mark.docker
def test_rerun_is_admitted_like_run(tmp_path, capsys):
    """`r` hands the run to `rerun`, which checks it like `run` does before anything starts: a recorded
    image that no longer exists on the Docker engine is refused (exit 2), no run directory is made."""
    from opencode_tui.run_command import rerun

    runs = tmp_path / "runs"
    run = runs / "exit-137-20261201-030547-3b7285-a1"
    shutil.copytree(RECORDED["exit-137"], run)
    info = RunDirReader(run).info()
    info.config["sandbox"]["image"] = "opencode-tui/not-built:never"
    info.task_dir = str(SAMPLES / "exit-137")
    (run / "run.json").write_text(info.model_dump_json())
    assert rerun(run) == 2
    assert "opencode-tui/not-built:never" in capsys.readouterr().err
    assert [p.name for p in runs.iterdir()] == [run.name]
