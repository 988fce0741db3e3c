"""The views a person reached for and did not find (issue 26): a tool call in full (the step view), a
person's shell played in the replay, a subagent's model calls marked, the diff's tool outputs side by side,
and the runs browser's health, batch and kept columns with its diff against the previous attempt.

Over real recorded run directories: ``tests/fixtures/more-runs/human-shell`` (scripts/record-fixture-shell-run:
a shell opened while the agent ran, ``touch done.txt`` typed, a failing ``ls`` first), ``delegate`` and
``delegate-kept`` (scripts/record-fixture-runs; the second kept its sandbox, swept afterwards) and the other
recorded runs. What each test expects is read from those files, so re-recording keeps them valid.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_tui.app import OpenCodeTUI
from opencode_tui.plain_text import diff_lines
from opencode_tui.screens.diff import DiffScreen, OutputsScreen
from opencode_tui.screens.modals import ModelCallScreen
from opencode_tui.screens.runs import RunsList, RunsScreen
from opencode_tui.screens.shell_replay import ShellReplayScreen, typed_lines
from opencode_tui.screens.step import StepScreen
from opencode_tui.widgets.model_calls import SUBAGENT_MARK, ModelCallsTable
from opencode_tui.widgets.timeline import Timeline
from opencode_tui_core.artifacts import RunDirReader, read_cast
from opencode_tui_core.diff import diff_runs, episode_steps
from opencode_tui_core.events import ModelCall, OpenCodeEvent, ShellOpened, ToolCall
from opencode_tui_core.tally import ROOT_SESSION_EVENT, Tally

MORE = Path(__file__).resolve().parents[1] / "fixtures" / "more-runs"
HUMAN_SHELL = MORE / "human-shell"
DELEGATE = MORE / "delegate"
DELEGATE_KEPT = MORE / "delegate-kept"
SIZE = (160, 45)


def _events(run: Path) -> list:
    return list(RunDirReader(run).events())


def _root_session(run: Path) -> str:
    [ev] = [e for e in _events(run) if isinstance(e, OpenCodeEvent) and e.event_type == ROOT_SESSION_EVENT]
    return ev.payload["properties"]["sessionID"]


# ---- core: the facts the views show ------------------------------------------------------------


def test_a_subagents_calls_are_those_of_another_session():
    """The delegate run: the serve runner names the episode's session; the calls that name another one
    (the ``task`` tool's child session, whose session.created names the episode's as its parent) are the
    subagent's, and the tally, the steps and nothing else say so."""
    events = _events(DELEGATE)
    root = _root_session(DELEGATE)
    calls = [e for e in events if isinstance(e, ModelCall)]
    children = {
        e.payload["properties"]["info"]["id"]
        for e in events
        if isinstance(e, OpenCodeEvent)
        and e.event_type == "session.created"
        and e.payload["properties"]["info"].get("parentID") == root
    }
    assert children, "the recorded delegate run has no child session"
    by_subagent = {c.call_id for c in calls if c.session_id in children}
    assert by_subagent and len(by_subagent) < len(calls)
    tally = Tally()
    for e in events:
        tally.count(e)
    assert tally.root_session == root
    assert {c.call_id for c in tally.model_calls if tally.subagent_call(c)} == by_subagent
    steps = episode_steps(events)
    assert {s.call_id for s in steps if s.subagent} == by_subagent - {
        c.call_id for c in calls if c.kind == "title"
    }
    assert all("(subagent)" in s.label() for s in steps if s.subagent)
    # a run recorded before the header was read names no session: nothing is marked, nothing guessed
    hello = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "hello-file"
    assert not any(s.subagent for s in episode_steps(_events(hello)))


def test_a_steps_output_exit_status_and_asking_call():
    events = _events(HUMAN_SHELL)
    tools = [e for e in events if isinstance(e, ToolCall)]
    last = {t.call_id: t for t in tools}
    calls = {e.message_id: e.call_id for e in events if isinstance(e, ModelCall) and e.message_id}
    steps = [s for s in episode_steps(events) if s.kind == "tool_call"]
    assert [s.call_id for s in steps] == list(last)
    for s in steps:
        t = last[s.call_id]
        assert (s.output, s.exit_code, s.asked_by) == (t.output, t.exit_code, calls[t.message_id])
    assert [s.exit_code for s in steps] == [2, 0]  # `ls missing.txt` failed, the echo did not


def test_a_shells_cast_keeps_what_was_typed_and_the_resizes():
    [opened] = [e for e in _events(HUMAN_SHELL) if isinstance(e, ShellOpened)]
    cast = RunDirReader(HUMAN_SHELL).shell_cast(opened)
    assert cast is not None and cast == read_cast(HUMAN_SHELL / opened.cast)
    assert cast.size == (100, 30) and [(c, r) for _, c, r in cast.resizes] == [(120, 32)]
    typed = [text for _, text in typed_lines(cast)]
    assert "touch done.txt" in typed and typed[-1] == "exit"
    assert cast.end >= cast.duration > 0


# ---- the step view -------------------------------------------------------------------------------


async def _replay(pilot, replay_loaded):
    await replay_loaded(pilot)
    return pilot.app.screen


async def test_enter_in_the_terminal_opens_the_latest_tool_call(replay_loaded, wait):
    tools = [e for e in _events(HUMAN_SHELL) if isinstance(e, ToolCall)]
    latest = tools[-1]
    app = OpenCodeTUI(run_dir=HUMAN_SHELL)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _replay(pilot, replay_loaded)
        screen.terminal.focus()
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, StepScreen), what="the step view")
        step = app.screen.step
        assert (step.call_id, step.output, step.exit_code) == (latest.call_id, latest.output, 0)
        summary = str(app.screen.query_one("#step-summary").render())
        assert "0 (completed)" in summary and step.asked_by in summary
        assert latest.input["command"] in app.screen.query_one("#step-command").text
        assert app.screen.query_one("#step-output").text == latest.output
        await pilot.press("m")  # the model call that asked for it
        await wait(pilot, lambda: isinstance(app.screen, ModelCallScreen), what="the model call")
        assert app.screen.call.call_id == step.asked_by
        assert app.screen.call.message_id == latest.message_id
        await pilot.press("escape")
        # the timeline's cursor just after the first command ended: the terminal shows up to there, and
        # Enter opens that command (in full: its exit status is known)
        first = next(
            i
            for i, e in enumerate(_events(HUMAN_SHELL))
            if isinstance(e, ToolCall) and e.status == "completed"
        )
        screen.seek(first)
        await pilot.pause()
        screen.terminal.focus()
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, StepScreen), what="the step view")
        assert app.screen.step.call_id == tools[0].call_id and app.screen.step.exit_code == 2


async def test_enter_on_the_timeline_opens_a_failed_commands_step(replay_loaded, wait):
    app = OpenCodeTUI(run_dir=HUMAN_SHELL)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _replay(pilot, replay_loaded)
        timeline = screen.query_one(Timeline)
        timeline.focus()
        await pilot.press("home", "o")  # the first tool call
        await wait(pilot, lambda: screen.cursor == screen.markers["tool_call"][0], what="the jump")
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, StepScreen), what="the step view")
        step = app.screen.step
        assert step.args["command"] == "ls missing.txt" and step.exit_code == 2
        assert "No such file" in (step.output or "")
        assert "2 (completed)" in str(app.screen.query_one("#step-summary").render())


# ---- a person's shell ----------------------------------------------------------------------------


async def test_enter_on_a_shell_marker_plays_the_shell_typed_keys_included(replay_loaded, wait):
    [opened] = [e for e in _events(HUMAN_SHELL) if isinstance(e, ShellOpened)]
    cast = read_cast(HUMAN_SHELL / opened.cast)
    assert cast is not None
    app = OpenCodeTUI(run_dir=HUMAN_SHELL)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _replay(pilot, replay_loaded)
        screen.query_one(Timeline).focus()
        await pilot.press("home", "h")  # the shell marker
        await wait(pilot, lambda: screen.cursor == screen.markers["shell"][0], what="the jump")
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, ShellReplayScreen), what="the shell")
        shell = app.screen
        term = shell.query_one("#shell-replay-output")
        typed = str(shell.query_one("#shell-replay-typed").render())
        assert "touch done.txt" in typed and "ls -l done.txt" in typed
        assert "DONE-42" in term.visible_text() or any("DONE-42" in t for _, t in cast.frames)
        assert shell.clock == cast.end  # opened on the whole session
        title = str(shell.query_one("#shell-replay-title").render())
        assert "marks the sample" in title and "100×30 → 120×32" in title
        await pilot.press("home")  # back to the start: nothing shown, nothing typed yet
        assert shell.frame == 0 and "›" not in str(shell.query_one("#shell-replay-typed").render())
        await pilot.press("f", "p")  # play it, fast, from there
        await wait(pilot, lambda: not shell.playing and shell.clock == cast.end, timeout=10, what="the play")
        assert shell.frame == len(cast.frames)
        assert str(shell.query_one("#shell-replay-typed").render()).count("›") == len(typed_lines(cast))
        await pilot.press("escape")
        assert app.screen is screen
        await pilot.press("S")  # the same shell from the run screen's key
        await wait(pilot, lambda: isinstance(app.screen, ShellReplayScreen), what="the shell (S)")


async def test_a_run_without_shells_says_so(fixture_runs, replay_loaded):
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=SIZE) as pilot:
        screen = await _replay(pilot, replay_loaded)
        await pilot.press("S")
        await pilot.pause()
        assert app.screen is screen
        assert any("No shell was opened" in n.message for n in app._notifications)


# ---- a subagent's calls --------------------------------------------------------------------------


async def test_the_calls_table_and_timeline_mark_a_subagents_calls(replay_loaded):
    events = _events(DELEGATE)
    root = _root_session(DELEGATE)
    calls = [e for e in events if isinstance(e, ModelCall)]
    subagent = [c.call_id for c in calls if c.session_id and c.session_id != root]
    app = OpenCodeTUI(run_dir=DELEGATE)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _replay(pilot, replay_loaded)
        table = screen.query_one(ModelCallsTable)
        kinds = {c.call_id: str(table.get_row(c.call_id)[1]) for c in table.calls}
        assert [k for k, v in kinds.items() if v.startswith(SUBAGENT_MARK)] == subagent
        assert f"{len(subagent)} by a subagent" in str(table.border_subtitle)
        marked = [screen.index.event_at(i).call_id for i in screen.markers["subagent"]]
        assert marked == subagent
        table.set_filter("subagent")
        assert [c.call_id for c in table.calls] == subagent
        screen.query_one(Timeline).focus()
        await pilot.press("home", "a")  # the next subagent call
        await pilot.pause()
        assert screen.cursor == screen.markers["subagent"][0]


# ---- the diff's tool outputs ---------------------------------------------------------------------


def test_plain_diff_shows_the_tool_outputs_side_by_side():
    diff = diff_runs(HUMAN_SHELL, MORE / "exit-137")
    lines = diff_lines(diff)
    at = lines.index("Tool outputs (A │ B) at each step:")
    row = diff.first_divergence
    assert row is not None and lines[at + 1].startswith(f">{row + 1} ")
    a_out = diff.steps[row].a.output.splitlines()[0]
    b_out = diff.steps[row].b.output.splitlines()[0]
    assert any(a_out in line and b_out in line and "│" in line for line in lines[at:]), lines[at:]
    # the command, as a script sees it (not a terminal: plain text on stdout)
    r = subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", "diff", str(HUMAN_SHELL), str(MORE / "exit-137")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "Tool outputs (A │ B) at each step:" in r.stdout and "exit 2" in r.stdout


async def test_enter_on_a_diff_step_shows_both_outputs_in_full(wait):
    app = OpenCodeTUI(diff=(HUMAN_SHELL, MORE / "exit-137"))
    async with app.run_test(size=SIZE) as pilot:
        await wait(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.loaded, what="the diff")
        diff = app.screen.diff
        row = diff.steps[diff.first_divergence]
        await wait(pilot, lambda: str(app.screen.query_one("#diff-step").render()), what="the step box")
        box = str(app.screen.query_one("#diff-step").render())
        assert row.a.output.splitlines()[0] in box and row.b.output.splitlines()[0] in box
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(app.screen, OutputsScreen), what="the outputs")
        a = app.screen.query_one("#diff-output-a").text
        b = app.screen.query_one("#diff-output-b").text
        assert row.a.output in a and row.b.output in b
        assert "$ ls missing.txt" in a


# ---- the runs browser ----------------------------------------------------------------------------


@pytest.fixture
def attempts(tmp_path) -> Path:
    """Two attempts of the delegate task (the later kept its sandbox) and the compaction storm (4 health
    warnings), under their run ids."""
    out = tmp_path / "runs"
    out.mkdir()
    for src in (DELEGATE, DELEGATE_KEPT, MORE / "compaction-storm"):
        shutil.copytree(src, out / RunDirReader(src).info().run_id)
    return out


async def test_runs_browser_health_batch_kept_and_diff_with_the_previous_attempt(attempts, wait):
    infos = {RunDirReader(p).info().run_id: RunDirReader(p).info() for p in attempts.iterdir()}
    older, newer = sorted((i for i in infos.values() if i.task_id == "delegate"), key=lambda i: i.started_at)
    app = OpenCodeTUI(runs_dir=attempts)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        lst = screen.query_one(RunsList)
        rows = {lst.get_row_at(i)[0]: lst.get_row_at(i) for i in range(lst.row_count)}
        for run_id, info in infos.items():
            health = sum((info.counts.get("health") or {}).values())
            assert rows[run_id][10] == (f"⚠{health}" if health else "")
            assert rows[run_id][11] == (info.batch_id or "")
            assert rows[run_id][12] == ("kept" if info.sandbox_kept else "")
        assert rows[newer.run_id][12] == "kept" and rows[older.run_id][12] == ""
        order = [lst.get_row_at(i)[0] for i in range(lst.row_count)]
        lst.move_cursor(order.index(older.run_id))
        await pilot.press("D")  # nothing earlier of this task: said, no screen
        await pilot.pause()
        assert app.screen is screen
        assert any("No earlier run of delegate" in n.message for n in app._notifications)
        lst.move_cursor(order.index(newer.run_id))
        await pilot.press("D")
        await wait(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.loaded, what="the diff")
        assert (app.screen.run_a.name, app.screen.run_b.name) == (older.run_id, newer.run_id)
        assert app.screen.diff.first_divergence is None  # the same steps: the scripted model
        assert any(d.key == "sandbox.keep_sandbox" for d in app.screen.diff.drift)
        await pilot.press("escape")
        assert app.screen is screen


async def test_a_missing_shell_recording_is_said(tmp_path, replay_loaded, wait):
    """The events name shells/shell-1.cast but the file is gone (a copied run directory): the shell view
    says so instead of playing nothing."""
    run = tmp_path / "human-shell"
    shutil.copytree(HUMAN_SHELL, run)
    shutil.rmtree(run / "shells")
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await _replay(pilot, replay_loaded)
        await pilot.press("S")
        await wait(pilot, lambda: isinstance(app.screen, ShellReplayScreen), what="the shell")
        text = app.screen.query_one("#shell-replay-output").visible_text()
        assert "shells/shell-1.cast is missing" in text
        await pilot.press("p")  # nothing to play: no error
        assert not app.screen.playing


async def test_enter_on_an_event_that_opens_nothing_says_what_does(replay_loaded):
    app = OpenCodeTUI(run_dir=HUMAN_SHELL)
    async with app.run_test(size=SIZE) as pilot:
        screen = await _replay(pilot, replay_loaded)
        screen.query_one(Timeline).focus()
        await pilot.press("home", "enter")  # the first event: the episode's start
        await pilot.pause()
        assert app.screen is screen
        assert any("Enter opens a tool call" in n.message for n in app._notifications)


def test_plain_runs_table_has_health_batch_and_kept(attempts):
    r = subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", "runs", "--runs-dir", str(attempts)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split()[-3:] == ["health", "batch", "kept"]
    for p in attempts.iterdir():
        info = RunDirReader(p).info()
        [row] = [line for line in rows if line.startswith(info.run_id)]
        health = sum((info.counts.get("health") or {}).values())
        assert (f"{health} warning" in row) == bool(health)
        assert (info.batch_id or "") in row
        assert row.endswith("kept") == info.sandbox_kept
