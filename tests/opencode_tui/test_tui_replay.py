"""Replay: the fixture run directories through the same widgets, asserting on messages and widget state.

Tests key on event content (kinds, stages, counts), never on ids, so the fixtures can be replaced by
real recorded runs of the same names.
"""

from __future__ import annotations

import json

from core.artifacts import RunDirReader
from core.events import CleanupObserved, FailureRecorded, ModelCall, ToolCall
from opencode_tui.app import OpenCodeTUI
from opencode_tui.messages import Copied, EventsReceived, ReplayLoaded, ShellStateChanged
from opencode_tui.screens.help import HelpScreen
from opencode_tui.screens.modals import NOT_RECORDED, FailureScreen, ModelCallScreen
from opencode_tui.screens.run import RunScreen
from opencode_tui.screens.runs import RunsScreen
from opencode_tui.state import CLEANUP_ORDER
from opencode_tui.widgets.cleanup import CleanupPanel
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.terminal import TerminalView
from opencode_tui.widgets.timeline import Timeline

SIZE = (160, 45)


def _events(run_dir):
    return list(RunDirReader(run_dir).events())


def _cell_texts(table) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_oom_run_shows_failure_calls_and_cleanup(fixture_runs, replay_loaded):
    run = fixture_runs / "oom"
    events = _events(run)
    messages: list = []
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen) and screen.mode == "replay"
        # messages: every event arrived through EventsReceived(source="replay"), then ReplayLoaded
        batches = [m for m in messages if isinstance(m, EventsReceived)]
        assert batches and {m.source for m in batches} == {"replay"}
        assert sum(len(m.events) for m in batches) == len(events)
        loaded = [m for m in messages if isinstance(m, ReplayLoaded)]
        assert len(loaded) == 1 and loaded[0].events == len(events) and loaded[0].bad_lines == 0

        failures = screen.query_one(FailuresTable)
        rows = _cell_texts(failures)
        assert len(rows) == sum(isinstance(e, FailureRecorded) for e in events) == 1
        kind, stage, cls, action, evidence = rows[0]
        assert (kind, stage, cls, action) == ("provider_oom_killed", "agent", "model", "count_as_zero")
        assert "docker.state" in evidence

        calls = screen.query_one(ModelCallsTable)
        assert calls.row_count == len({e.call_id for e in events if isinstance(e, ModelCall)})

        cleanup = screen.query_one(CleanupPanel).step_states(screen.state)
        expected = {}
        for e in events:
            if isinstance(e, CleanupObserved):
                expected[str(e.step)] = str(e.state)
        assert cleanup == {str(s): expected.get(str(s), "pending") for s in CLEANUP_ORDER}
        assert cleanup["receipt"] == "failed" and cleanup["sandbox_released"] == "ok"

        stats = screen.state
        assert stats.compaction_count == 1
        assert stats.tool_counts == {"write": 1, "bash": 1}
        assert stats.outcome is not None and stats.outcome.action == "count_as_zero"

        # the terminal pane rebuilt what a person saw: the failing command as a prompt line, its output
        lines = screen.terminal.rendered.plain(0, screen.terminal.rendered.count)
        assert any(line.startswith("$ ") and "sort_all.py" in line for line in lines)
        assert "Killed" in lines
        assert any(line.startswith("✎ write") for line in lines)

        # the failure detail modal
        failures.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FailureScreen)
        detail = app.screen.render_detail().plain
        for needle in (
            "provider_oom_killed",
            "count_as_zero",
            "docker.state",
            "OOMKilled",
            "caused by",
            "ConnectionResetError",
            "scope",
            "observed at",
            "memory_limit_bytes",
        ):
            assert needle in detail, needle
        await pilot.press("y")
        copied = [m for m in messages if isinstance(m, Copied)]
        assert copied and copied[-1].what == "failure"
        assert json.loads(copied[-1].text)["failure"]["kind"] == "provider_oom_killed"
        assert app.clipboard == copied[-1].text
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)


async def test_model_call_modal_reads_bodies_by_call_id(fixture_runs, replay_loaded):
    run = fixture_runs / "oom"
    records = list(RunDirReader(run).model_calls())
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(ModelCallsTable)
        table.focus()
        # a call with a recorded response
        await pilot.press("enter")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ModelCallScreen)
        await pilot.pause(0.1)
        assert modal.loaded
        record = next(r for r in records if r["call_id"] == modal.call.call_id)
        assert modal.record == record
        # the Call tab copies the event and the whole record (redacted headers included)
        copied = json.loads(modal.copy_text())
        assert copied["call_id"] == record["call_id"] and copied["record"] == record
        assert json.loads(modal.query_one("#request").text) == record["request"]
        assert json.loads(modal.query_one("#response").text) == record["response"]
        await pilot.press("escape")
        # the call whose response was never recorded shows "not recorded"
        last = table.row_count - 1
        missing = [
            i
            for i, c in enumerate(table.calls)
            if "response" not in next((r for r in records if r["call_id"] == c.call_id), {})
        ]
        assert missing, "the oom fixture has a call without a recorded response"
        table.move_cursor(row=missing[0])
        await pilot.press("enter")
        await pilot.pause(0.1)
        modal = app.screen
        assert isinstance(modal, ModelCallScreen)
        await pilot.pause(0.1)
        assert modal.query_one("#response").text == NOT_RECORDED
        assert last >= missing[0]


async def test_model_call_without_any_record_is_tolerated(tmp_path, fixture_runs, replay_loaded):
    import shutil

    run = tmp_path / "no-bodies"
    shutil.copytree(fixture_runs / "hello-file", run)
    (run / "model_calls.jsonl").unlink()
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        app.screen.query_one(ModelCallsTable).focus()
        await pilot.press("enter")
        await pilot.pause(0.2)
        modal = app.screen
        assert isinstance(modal, ModelCallScreen) and modal.loaded and modal.record is None
        assert modal.query_one("#request").text == NOT_RECORDED
        assert NOT_RECORDED in modal.query_one("#call-summary").render().plain


async def test_timeline_steps_and_jumps_to_failures(fixture_runs, replay_loaded):
    run = fixture_runs / "oom"
    events = _events(run)
    failure_at = next(i for i, e in enumerate(events) if isinstance(e, FailureRecorded))
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert screen.cursor is None and screen.total == len(events)
        await pilot.press("n")
        assert screen.cursor == failure_at
        # as of the failure: the outcome is not decided yet, cleanup not started
        assert screen.view_state.outcome is None
        assert screen.view_state.failures and len(screen.query_one(FailuresTable).records) == 1
        assert screen.query_one(CleanupPanel).step_states(screen.view_state)["receipt"] == "pending"
        await pilot.press("left_square_bracket")
        assert screen.cursor == failure_at - 1
        assert screen.query_one(FailuresTable).row_count == 0
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert screen.cursor == failure_at + 1
        # back to the start: nothing happened yet
        screen.query_one(Timeline).focus()
        await pilot.press("home")
        assert screen.cursor == 0
        assert screen.query_one(ModelCallsTable).row_count == 0
        assert screen.terminal.line_count == 0
        # the terminal grows with the cursor
        first_bash = next(i for i, e in enumerate(events) if isinstance(e, ToolCall) and e.tool == "bash")
        screen.seek(first_bash)
        await pilot.pause()
        assert any("sort_all.py" in line for line in screen.terminal._plain(0, screen.terminal.line_count))
        await pilot.press("end")
        assert screen.cursor is None
        assert screen.query_one(ModelCallsTable).row_count == len(
            {e.call_id for e in events if isinstance(e, ModelCall)}
        )


async def test_cast_playback_fast(fixture_runs, replay_loaded, wait):
    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        await pilot.press("f", "p")
        term = screen.query_one(TerminalView)
        assert term.view == "cast" and screen.play_source == "cast"
        await wait(pilot, lambda: not screen.playing, timeout=10, what="the playback to finish")
        text = term._plain(0, term.line_count)
        assert any("sort_all.py" in line for line in text) and "Killed" in text
        # the timeline followed the recording's clock
        assert screen.cursor is not None and screen.cursor > 0
        await pilot.press("escape")
        assert term.view == "rendered" and screen.play_source is None


async def test_raw_view_and_follow_toggle(fixture_runs, replay_loaded):
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        term = app.screen.query_one(TerminalView)
        term.focus()
        await pilot.press("r")
        assert term.view == "raw"
        raw = term._plain(0, term.line_count)
        # OpenCode's JSON lines on stdout are only in the raw view; escapes are made visible
        assert any(line.startswith('{"type": "text"') for line in raw)
        assert any("␛[" in line for line in raw)
        await pilot.press("r")
        assert term.view == "rendered"
        assert term.follow
        await pilot.press("l")
        assert not term.follow and "paused" in term.border_subtitle
        await pilot.press("l")
        assert term.follow


async def test_shell_unavailable_in_replay_and_live_actions_hidden(fixture_runs, replay_loaded):
    messages: list = []
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await replay_loaded(pilot)
        await pilot.press("s")
        assert any(isinstance(m, ShellStateChanged) and m.state == "unavailable" for m in messages)
        assert isinstance(app.screen, RunScreen)
        bindings = app.screen.active_bindings
        assert "c" not in bindings and "k" not in bindings  # cancel/keep are live-only
        await pilot.press("q")  # no episode running: quits at once
        assert app._exit


async def test_help_and_theme_cycle(fixture_runs, replay_loaded):
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        assert "Cleanup" in app.screen.text and "`s`" in app.screen.text
        await pilot.press("escape")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert app.theme == "opencode-dark"
        await pilot.press("t")
        assert app.theme == "opencode-light"
        await pilot.press("t")
        assert app.theme == "opencode-high-contrast"
        await pilot.press("t")
        assert app.theme == "opencode-dark"
        commands = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("Open shell", "Copy", "Next theme", "Theme: opencode-light", "Help", "Quit"):
            assert title in commands


async def test_copy_terminal_and_call(fixture_runs, replay_loaded):
    messages: list = []
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await replay_loaded(pilot)
        await pilot.press("y")
        copied = [m for m in messages if isinstance(m, Copied)]
        assert copied[-1].what == "terminal" and "$ cat hello.txt" in copied[-1].text
        app.screen.query_one(ModelCallsTable).focus()
        await pilot.press("y")
        copied = [m for m in messages if isinstance(m, Copied)]
        assert copied[-1].what == "model call"
        assert json.loads(copied[-1].text)["record"]["request"]["model"] == "scripted"


async def test_runs_browser_lists_and_opens_runs(fixture_runs, replay_loaded):
    app = OpenCodeTUI(runs_dir=fixture_runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        rows = _cell_texts(screen.query_one("#runs"))
        by_run = {row[0]: row for row in rows}
        assert {"hello-file", "oom"} <= set(by_run)
        assert by_run["oom"][2] == "count_as_zero" and by_run["oom"][4] == "provider_oom_killed"
        assert by_run["hello-file"][2] == "scored" and by_run["hello-file"][3] == "1"
        index = [r[0] for r in rows].index("oom")
        screen.query_one("#runs").move_cursor(row=index)
        await pilot.press("enter")
        await replay_loaded(pilot)
        assert isinstance(app.screen, RunScreen) and app.screen.run_dir.name == "oom"
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)


async def test_bad_lines_in_events_jsonl_are_skipped(tmp_path, fixture_runs, replay_loaded):
    import shutil

    run = tmp_path / "torn"
    shutil.copytree(fixture_runs / "hello-file", run)
    with (run / "events.jsonl").open("a") as f:
        f.write('{"type": "from_a_newer_engine", "seq": 999}\n{"type": "terminal", "str')
    messages: list = []
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await replay_loaded(pilot)
        loaded = next(m for m in messages if isinstance(m, ReplayLoaded))
        assert loaded.bad_lines == 2
        assert app.screen.state.outcome is not None


async def test_command_palette_runs_app_actions(fixture_runs, replay_loaded, wait):
    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Theme: opencode-high")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait(pilot, lambda: app.theme == "opencode-high-contrast", what="the palette's theme command")
        await pilot.press("ctrl+p", *"Next failure")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait(
            pilot,
            lambda: isinstance(app.screen, RunScreen) and app.screen.cursor is not None,
            what="the palette's jump to the failure",
        )
        assert isinstance(app.screen.view_state.failures[-1], FailureRecorded)


def test_call_bodies_accept_the_recorders_key_names():
    from opencode_tui.screens.modals import _body

    recorder_style = {
        "call_id": "c",
        "request_body": {"model": "m"},
        "response_body": "data: {}\n\ndata: [DONE]\n",
    }
    assert json.loads(_body(recorder_style, "request")) == {"model": "m"}
    assert _body(recorder_style, "response").startswith("data: {}")
    assert _body({"call_id": "c"}, "response") == NOT_RECORDED
    assert _body(None, "request") == NOT_RECORDED
