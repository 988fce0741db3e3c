"""Replay: the recorded run directories through the same widgets, asserting on messages and widget state.

``tests/fixtures/runs/{hello-file,oom}`` are real recorded runs (``scripts/record-fixture-runs``). What a
test expects is derived from the run's own files (events.jsonl, run.json, model_calls.jsonl,
terminal.cast) wherever possible, with the facts of the recording (e.g. the OOM's kind, class and
evidence sources) stated explicitly. Behaviours the recordings lack are tested on ``constructed_run``
(see conftest), never by editing the recordings.
"""

from __future__ import annotations

import json
import re
import shutil

from opencode_tui import format as fmt
from opencode_tui.app import OpenCodeTUI
from opencode_tui.messages import Copied, EventsReceived, ReplayLoaded, ShellStateChanged
from opencode_tui.screens.help import HelpScreen
from opencode_tui.screens.modals import NOT_RECORDED, FailureScreen, ModelCallScreen, _body
from opencode_tui.screens.run import RunScreen
from opencode_tui.screens.runs import RunsScreen
from opencode_tui.state import CLEANUP_ORDER
from opencode_tui.widgets.cleanup import CleanupPanel
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.header import RunHeader
from opencode_tui.widgets.model_calls import COLUMNS, ModelCallsTable
from opencode_tui.widgets.progress import WarningsBar
from opencode_tui.widgets.stats import StatsPanel
from opencode_tui.widgets.terminal import RENDERED_STREAMS, TerminalView
from opencode_tui.widgets.timeline import Timeline
from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.events import (
    CleanupObserved,
    FailureRecorded,
    FaultKind,
    ModelCall,
    OpenCodeEvent,
    SandboxFault,
    TerminalOutput,
    ToolCall,
    TranscriptStats,
)

SIZE = (160, 45)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _events(run_dir):
    return list(RunDirReader(run_dir).events())


def _cell_texts(table) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def _cleanup_as_of(events, upto: int | None = None) -> dict[str, str]:
    """Each cleanup step's last state in ``events[:upto]`` (pending if never observed)."""
    seen = {str(e.step): str(e.state) for e in events[:upto] if isinstance(e, CleanupObserved)}
    return {str(s): seen.get(str(s), "pending") for s in CLEANUP_ORDER}


def _terminal_lines(events) -> list[str]:
    """What the recording showed on the rendered streams (the engine renders tool calls and text on the
    ``display`` stream), without colours: the lines the rendered terminal view must hold."""
    text = "".join(e.data for e in events if isinstance(e, TerminalOutput) and e.stream in RENDERED_STREAMS)
    lines = ANSI.sub("", text).split("\n")
    return lines[:-1] if lines and not lines[-1] else lines


def _last_text(events) -> str:
    """The agent's last finished text part, from the server stream's part updates."""
    parts = [
        e.payload["properties"]["part"]
        for e in events
        if isinstance(e, OpenCodeEvent) and e.event_type == "message.part.updated"
    ]
    return [p["text"] for p in parts if p["type"] == "text" and (p.get("time") or {}).get("end")][-1]


def _bash_call(events) -> ToolCall:
    return next(e for e in events if isinstance(e, ToolCall) and e.tool == "bash" and e.status != "running")


async def test_oom_run_shows_failure_calls_and_cleanup(fixture_runs, replay_loaded):
    run = fixture_runs / "oom"
    events = _events(run)
    info = RunDirReader(run).info()
    recorded = [e for e in events if isinstance(e, FailureRecorded)]
    # the recording: one OOM, diagnosed from the kernel's OOM events and the container's memory cgroup
    # (the container itself kept running, so there is no docker.state evidence)
    assert len(recorded) == 1
    oom = recorded[0]
    assert (oom.failure.kind, str(oom.failure.stage)) == ("provider_oom_killed", "agent")
    assert (str(oom.decision.failure_class), str(oom.decision.action)) == ("model", "count_as_zero")
    sources = [ev.source for ev in oom.failure.evidence]
    assert set(sources) == {"docker.events", "cgroup.memory"}
    assert {ev.scope for ev in oom.failure.evidence} == {info.sandbox_id}

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
        expected_rows = [
            [
                r.failure.kind,
                str(r.failure.stage),
                str(r.decision.failure_class),
                str(r.decision.action),
                ", ".join(dict.fromkeys(ev.source for ev in r.failure.evidence)),
            ]
            for r in recorded
        ]
        assert _cell_texts(failures) == expected_rows
        evidence = expected_rows[0][4]
        assert evidence == "docker.events, cgroup.memory" and "docker.state" not in evidence

        calls = screen.query_one(ModelCallsTable)
        model_calls = [e for e in events if isinstance(e, ModelCall)]
        assert calls.row_count == len({e.call_id for e in model_calls}) == info.counts["model_calls"]
        assert [c.call_id for c in calls.calls] == [e.call_id for e in model_calls]

        cleanup = screen.query_one(CleanupPanel).step_states(screen.state)
        assert cleanup == _cleanup_as_of(events)
        # the receipt arrived and the sandbox was released
        assert cleanup["receipt"] == "ok" and cleanup["sandbox_released"] == "ok"

        stats = screen.state
        transcript = next(e for e in events if isinstance(e, TranscriptStats))
        tool_events = {e.call_id: e.tool for e in events if isinstance(e, ToolCall)}
        assert stats.tool_counts == transcript.tool_calls == info.counts["tool_calls"]
        assert sorted(stats.tool_counts.items()) == sorted(
            {t: list(tool_events.values()).count(t) for t in set(tool_events.values())}.items()
        )
        assert stats.compaction_count == transcript.compactions == 0
        assert stats.outcome is not None and stats.outcome.action == info.outcome.action == "count_as_zero"
        stats_text = screen.query_one(StatsPanel).render().plain
        assert f"Model calls  {len(model_calls)}" in stats_text
        assert f"{transcript.messages} messages" in stats_text

        # the terminal pane shows what the run showed: the memory hog as a prompt line, then its output,
        # the file the agent wrote, and the agent's last words
        lines = screen.terminal.rendered.plain(0, screen.terminal.rendered.count)
        assert lines == _terminal_lines(events)
        hog = _bash_call(events)
        assert hog.input["command"].startswith("python3 -c ")
        prompt = lines.index(f"$ {hog.input['command']}")
        assert lines[prompt + 1] == hog.output.splitlines()[0]
        assert lines[-1] == _last_text(events)

        # the failure detail modal
        failures.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FailureScreen)
        detail = app.screen.render_detail().plain
        f = oom.failure
        needles = [
            f.kind,
            str(oom.decision.action),
            f"class           {oom.decision.failure_class}",
            f"operation       {f.operation}",
            f.message,
            f"occurred at     {f.occurred_at.isoformat()}",
            "no exception recorded",  # the recorded OOM has no cause chain
            # what decided it, in words (issue 25: never "kind rule", "rule rule")
            f"decided by      kind '{oom.decision.rule}'",
            "oom_kill",
            "memory_limit_bytes",
            str(f.details.memory_limit_bytes),
        ]
        for ev in f.evidence:
            needles += [
                f"source {ev.source}",
                f"scope {ev.scope}",
                f"observed at {ev.observed_at.isoformat()}",
            ]
        for needle in needles:
            assert needle in detail, needle
        assert detail.count("• source ") == len(f.evidence)
        assert " rule rule" not in detail and "kind rule" not in detail
        assert "docker.state" not in detail and "caused by" not in detail
        await pilot.press("y")
        copied = [m for m in messages if isinstance(m, Copied)]
        assert copied and copied[-1].what == "failure"
        data = json.loads(copied[-1].text)
        assert data["failure"]["kind"] == "provider_oom_killed"
        assert [e["source"] for e in data["failure"]["evidence"]] == sources
        assert app.clipboard == copied[-1].text
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)


async def test_constructed_failure_with_cause_chain_failed_receipt_and_tool_error(
    constructed_run, replay_loaded
):
    """CONSTRUCTED run (conftest): what the recordings lack. A cause chain, docker.state evidence, a
    receipt that never arrived, a compaction, a warning, a failing bash call rendered by the TUI itself."""
    events = _events(constructed_run)
    app = OpenCodeTUI(run_dir=constructed_run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert screen.query_one(CleanupPanel).step_states(screen.state) == _cleanup_as_of(events)
        assert screen.state.cleanup and _cleanup_as_of(events)["receipt"] == "failed"
        assert _cleanup_as_of(events)["descendants"] == "skipped"
        assert screen.state.compaction_count == 1
        assert screen.state.tool_errors == 1
        assert "ripgrep_unavailable" in screen.query_one(WarningsBar).render().plain
        # the header names the user the sandbox ran as (SandboxReady)
        assert "user agent (uid 1000, gid 1000)" in screen.query_one(RunHeader).plain
        assert _cell_texts(screen.query_one(FailuresTable))[0][4] == "docker.state"
        # no display rendering recorded: the engine's EventRenderer renders the bash call, progress collapsed
        lines = screen.terminal.rendered.plain(0, screen.terminal.rendered.count)
        assert lines == [
            "$ python3 sort_all.py",
            "loading data/big.txt",
            "memory 91%",
            "Killed",
            "✖ command failed",  # the engine's rendering (opencode_tui_core.runtime.stream.EventRenderer)
        ]
        screen.query_one(FailuresTable).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FailureScreen)
        detail = app.screen.render_detail().plain
        for needle in (
            "source docker.state",
            "scope container 4be1c0ffee9a",
            "OOMKilled",
            "ExecLost: the execution ended without an observed exit",
            "  caused by ConnectionResetError: [Errno 104] Connection reset by peer",
            "memory_limit_bytes",
            "536870912",
        ):
            assert needle in detail, needle
        assert "no exception recorded" not in detail


async def test_model_call_modal_reads_bodies_by_call_id(fixture_runs, replay_loaded, wait):
    run = fixture_runs / "oom"
    events = _events(run)
    records = {r.call_id: r.model_dump(mode="json") for r in RunDirReader(run).model_calls()}
    calls = [e for e in events if isinstance(e, ModelCall)]
    assert set(records) == {c.call_id for c in calls}  # the proxy recorded every call
    # the call whose response asked for the memory hog
    hog = _bash_call(events)
    row = next(i for i, c in enumerate(calls) if c.message_id == hog.message_id)
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(ModelCallsTable)
        table.focus()
        table.move_cursor(row=row)
        await pilot.press("enter")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ModelCallScreen) and modal.call.call_id == calls[row].call_id
        await wait(pilot, lambda: modal.loaded, what="the call's bodies")
        record = records[modal.call.call_id]
        assert modal.record is not None and modal.record.model_dump(mode="json") == record
        # the recorder's key names: request_body (JSON) and response_body (the raw SSE stream)
        assert isinstance(record["request_body"], dict) and isinstance(record["response_body"], str)
        assert json.loads(modal.query_one("#request").text) == record["request_body"]
        response = modal.query_one("#response").text
        assert response == record["response_body"]
        assert response.startswith("data: ") and "data: [DONE]" in response
        assert hog.call_id in response and '"name": "bash"' in response
        summary = modal.query_one("#call-summary").render().plain
        assert "from model_calls.jsonl" in summary and "Recorded by the proxy" in summary
        assert '"finish_reason": "tool_calls"' in summary
        assert "request_body" not in summary and "response_body" not in summary  # bodies have their tabs
        # the Call tab copies the event and the whole record (redacted headers included)
        copied = json.loads(modal.copy_text())
        assert copied["call_id"] == record["call_id"] and copied["record"] == record
        assert copied["record"]["request_headers"]["Authorization"] == "[REDACTED]"
        await pilot.press("right")  # the Request tab copies the request body
        await pilot.pause()
        assert json.loads(modal.copy_text()) == record["request_body"]
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)


async def test_model_call_without_recorded_response_shows_not_recorded(constructed_run, replay_loaded, wait):
    """CONSTRUCTED run: a call whose response never arrived (the client went away)."""
    records = {r.call_id: r.model_dump(mode="json") for r in RunDirReader(constructed_run).model_calls()}
    app = OpenCodeTUI(run_dir=constructed_run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(ModelCallsTable)
        missing = [i for i, c in enumerate(table.calls) if records[c.call_id]["response_body"] is None]
        assert len(missing) == 1
        assert str(table.get_row_at(missing[0])[COLUMNS.index("status")]) == "error"
        table.focus()
        table.move_cursor(row=missing[0])
        await pilot.press("enter")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ModelCallScreen)
        await wait(pilot, lambda: modal.loaded, what="the call's bodies")
        assert modal.query_one("#response").text == NOT_RECORDED
        assert json.loads(modal.query_one("#request").text) == records[modal.call.call_id]["request_body"]
        assert "connection closed" in modal.query_one("#call-summary").render().plain


async def test_model_call_without_any_record_is_tolerated(tmp_path, fixture_runs, replay_loaded, wait):
    run = tmp_path / "no-bodies"
    shutil.copytree(fixture_runs / "hello-file", run)
    (run / RunFiles.MODEL_CALLS).unlink()
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        app.screen.query_one(ModelCallsTable).focus()
        await pilot.press("enter")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ModelCallScreen)
        await wait(pilot, lambda: modal.loaded, what="the lookup")
        assert modal.record is None
        assert modal.query_one("#request").text == NOT_RECORDED
        assert modal.query_one("#response").text == NOT_RECORDED
        assert NOT_RECORDED in modal.query_one("#call-summary").render().plain


async def test_timeline_steps_and_jumps_to_failures(fixture_runs, replay_loaded):
    run = fixture_runs / "oom"
    events = _events(run)
    failure_at = next(i for i, e in enumerate(events) if isinstance(e, FailureRecorded))
    calls_before = len({e.call_id for e in events[: failure_at + 1] if isinstance(e, ModelCall)})
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert screen.cursor is None and screen.total == len(events)
        await pilot.press("n")
        assert screen.cursor == failure_at
        # as of the failure: the outcome is not decided yet; cleanup as far as it had got (the receipt
        # came before the OOM was diagnosed, the sandbox is released after)
        assert screen.view_state.outcome is None
        assert screen.view_state.failures and len(screen.query_one(FailuresTable).records) == 1
        as_of = _cleanup_as_of(events, failure_at + 1)
        assert screen.query_one(CleanupPanel).step_states(screen.view_state) == as_of
        assert as_of["receipt"] == "ok" and as_of["sandbox_released"] == "pending"
        assert screen.query_one(ModelCallsTable).row_count == calls_before
        timeline = screen.query_one(Timeline).render().plain
        assert f"{failure_at + 1:,} / {len(events):,} events" in timeline
        assert fmt.summarize(events[failure_at]) in timeline
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
        # the terminal grows with the cursor: the hog's prompt line appears with its rendering
        hog = _bash_call(events)
        hog_at = next(i for i, e in enumerate(events) if isinstance(e, ToolCall) and e.call_id == hog.call_id)
        shown_at = next(
            i
            for i, e in enumerate(events)
            if i > hog_at and isinstance(e, TerminalOutput) and hog.input["command"] in e.data
        )
        prompt = f"$ {hog.input['command']}"
        screen.seek(shown_at - 1)
        await pilot.pause()
        assert prompt not in screen.terminal._plain(0, screen.terminal.line_count)
        screen.seek(shown_at)
        await pilot.pause()
        assert prompt in screen.terminal._plain(0, screen.terminal.line_count)
        await pilot.press("end")
        assert screen.cursor is None
        assert screen.query_one(ModelCallsTable).row_count == len(
            {e.call_id for e in events if isinstance(e, ModelCall)}
        )


async def test_cast_playback_fast(fixture_runs, replay_loaded, wait):
    run = fixture_runs / "oom"
    events = _events(run)
    cast = RunDirReader(run).cast()
    assert cast is not None and cast.frames
    played = ANSI.sub("", "".join(text for _, text in cast.frames).replace("\r\n", "\n")).splitlines()
    last_display = max(
        i for i, e in enumerate(events) if isinstance(e, TerminalOutput) and e.stream == "display"
    )
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        await pilot.press("f", "p")
        term = screen.query_one(TerminalView)
        # after the recording's last frame playback goes on through the events (cleanup, outcome)
        assert term.view == "cast" and screen.play_source in ("cast", "events")
        await wait(pilot, lambda: not screen.playing, timeout=10, what="the playback to finish")
        assert screen.play_source == "events" and screen.cursor == len(events) - 1
        text = term._plain(0, term.line_count)
        assert text == played
        assert f"$ {_bash_call(events).input['command']}" in text
        # the timeline followed the recording's clock: at the end of the recording it stands on (or just
        # past) the event the last frame recorded, so the panels match what the cast shows
        assert screen.cursor is not None and screen.cursor >= last_display
        assert not any(
            isinstance(e, TerminalOutput) and e.stream == "display" for e in events[screen.cursor + 1 :]
        )
        await pilot.press("escape")
        assert term.view == "rendered" and screen.play_source is None


async def test_raw_view_and_follow_toggle(fixture_runs, replay_loaded):
    run = fixture_runs / "hello-file"
    events = _events(run)
    stdout_lines = [
        line
        for e in events
        if isinstance(e, TerminalOutput) and e.stream == "stdout"
        for line in e.data.splitlines()
    ]
    assert any(json.loads(line)["type"] == "message.part.delta" for line in stdout_lines)
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        term = app.screen.query_one(TerminalView)
        rendered = term._plain(0, term.line_count)
        assert not any(line in rendered for line in stdout_lines)  # OpenCode's JSON is not in the view
        term.focus()
        await pilot.press("r")
        assert term.view == "raw"
        raw = term._plain(0, term.line_count)
        # OpenCode's JSON lines on stdout are only in the raw view, byte for byte; escapes are made visible
        for line in stdout_lines:
            assert line in raw, line
        assert any(line.startswith("␛[1;32m$␛[0m ␛[1mcat hello.txt") for line in raw)
        await pilot.press("r")
        assert term.view == "rendered"
        assert term.follow
        await pilot.press("l")
        assert not term.follow and "paused" in term.border_subtitle
        await pilot.press("l")
        assert term.follow


async def test_shell_unavailable_in_replay_and_live_actions_hidden(fixture_runs, replay_loaded):
    """A replay's run is over: shell, cancel and keep are not offered (its sandbox was released when
    the run ended); asked for anyway (a served read-only app binds `s` on every screen), the app says why."""
    messages: list = []
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await replay_loaded(pilot)
        bindings = app.screen.active_bindings
        assert not {"s", "c", "k"} & set(bindings)  # not offered in a replay
        await pilot.press("s")  # does nothing: no shell screen
        assert isinstance(app.screen, RunScreen)
        app.open_shell(None)  # what the palette's "Open shell" runs
        await pilot.pause()
        assert any(isinstance(m, ShellStateChanged) and m.state == "unavailable" for m in messages)
        assert isinstance(app.screen, RunScreen)
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
        for title in (
            "Copy",
            "Next theme",
            "Theme: opencode-light",
            "Help",
            "Quit",
            "Play terminal recording",
        ):
            assert title in commands
        assert "Open shell" not in commands  # a replay has no shell (no `s` in its footer either)


async def test_copy_terminal_and_call(fixture_runs, replay_loaded):
    run = fixture_runs / "hello-file"
    events = _events(run)
    records = {r.call_id: r.model_dump(mode="json") for r in RunDirReader(run).model_calls()}
    first_call = next(e for e in events if isinstance(e, ModelCall))
    messages: list = []
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await replay_loaded(pilot)
        await pilot.press("y")
        copied = [m for m in messages if isinstance(m, Copied)]
        assert copied[-1].what == "terminal"
        assert copied[-1].text.splitlines() == _terminal_lines(events)
        assert "$ cat hello.txt" in copied[-1].text.splitlines()
        app.screen.query_one(ModelCallsTable).focus()
        await pilot.press("y")
        copied = [m for m in messages if isinstance(m, Copied)]
        assert copied[-1].what == "model call"
        data = json.loads(copied[-1].text)
        assert data["call_id"] == first_call.call_id
        assert data["record"] == records[first_call.call_id]
        assert data["record"]["request_body"]["model"] == "scripted"


async def test_runs_browser_lists_and_opens_runs(fixture_runs, replay_loaded):
    infos = {name: RunDirReader(fixture_runs / name).info() for name in ("hello-file", "oom")}
    app = OpenCodeTUI(runs_dir=fixture_runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        rows = _cell_texts(screen.query_one("#runs"))
        by_run = {row[0]: row for row in rows}
        assert set(by_run) == set(infos)
        # newest start first
        assert [r[0] for r in rows] == sorted(infos, key=lambda n: infos[n].started_at, reverse=True)
        for name, info in infos.items():
            row = by_run[name]
            assert row[1] == info.task_id
            assert row[2] == info.outcome.action
            assert row[3] == f"{info.outcome.reward:g}"
            assert row[4] == (info.outcome.failure_kind or fmt.DASH)
            assert row[5] == fmt.duration(info.duration_s)
            assert row[6] == info.started_at.strftime("%Y-%m-%d %H:%M:%S")
        assert by_run["oom"][2:5] == ["count_as_zero", "0", "provider_oom_killed"]
        assert by_run["hello-file"][2:5] == ["scored", "1", fmt.DASH]
        index = [r[0] for r in rows].index("oom")
        screen.query_one("#runs").move_cursor(row=index)
        await pilot.press("enter")
        await replay_loaded(pilot)
        assert isinstance(app.screen, RunScreen) and app.screen.run_dir.name == "oom"
        assert app.screen.total == len(_events(fixture_runs / "oom"))
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)


async def test_bad_lines_in_events_jsonl_are_skipped(tmp_path, fixture_runs, replay_loaded):
    run = tmp_path / "torn"
    shutil.copytree(fixture_runs / "hello-file", run)
    good = len(_events(run))
    with (run / RunFiles.EVENTS).open("a") as f:
        f.write('{"type": "from_a_newer_engine", "seq": 999}\n{"type": "terminal", "str')
    messages: list = []
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await replay_loaded(pilot)
        loaded = next(m for m in messages if isinstance(m, ReplayLoaded))
        assert loaded.bad_lines == 2 and loaded.events == good
        assert app.screen.state.outcome is not None and app.screen.state.outcome.action == "scored"


async def test_stats_name_the_subagent_sessions_of_the_transcript(tmp_path, fixture_runs, replay_loaded):
    """A run whose agent delegated (OpenCode's task tool): the Transcript row says how many subagent
    sessions there were (their work is in trajectory.json); a run without any says nothing of them."""
    run = tmp_path / "delegated"
    shutil.copytree(fixture_runs / "hello-file", run)
    lines = (run / RunFiles.EVENTS).read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "transcript")
    lines[at] = json.dumps({**json.loads(lines[at]), "subagent_sessions": 2})
    (run / RunFiles.EVENTS).write_text("\n".join(lines) + "\n")
    for run_dir, said in ((run, True), (fixture_runs / "hello-file", False)):
        app = OpenCodeTUI(run_dir=run_dir)
        async with app.run_test(size=SIZE) as pilot:
            await replay_loaded(pilot)
            text = app.screen.query_one(StatsPanel).render().plain
            assert ("2 subagent session(s)" in text) is said and "messages" in text


async def test_command_palette_runs_app_actions(fixture_runs, replay_loaded, wait):
    events = _events(fixture_runs / "oom")
    failure_at = next(i for i, e in enumerate(events) if isinstance(e, FailureRecorded))
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
        assert app.screen.cursor == failure_at
        assert isinstance(app.screen.view_state.failures[-1], FailureRecorded)


def test_call_bodies_from_the_typed_record():
    from datetime import UTC, datetime

    from opencode_tui_core.calls.records import ModelCallRecord

    when = datetime.now(UTC)
    recorded = ModelCallRecord(
        call_id="c",
        method="POST",
        path="/v1/chat/completions",
        started_at=when,
        request_body={"model": "m"},
        response_body="data: {}\n\ndata: [DONE]\n",
    )
    assert json.loads(_body(recorded, "request")) == {"model": "m"}
    assert _body(recorded, "response").startswith("data: {}")
    bare = ModelCallRecord(call_id="c", method="POST", path="/v1/x", started_at=when)
    assert _body(bare, "response") == NOT_RECORDED
    assert _body(None, "request") == NOT_RECORDED


def test_cast_origin_takes_the_fraction_from_the_run_start(fixture_runs):
    """asciinema's header timestamp is whole seconds; run.json's started_at supplies the fraction."""
    from datetime import UTC, datetime

    from opencode_tui_core.artifacts import Cast

    cast = Cast({"timestamp": 1_700_000_000}, [(1.0, "x")])
    assert cast.origin(None) == 1_700_000_000.0
    within = datetime.fromtimestamp(1_700_000_000.75, UTC)
    assert cast.origin(within) == 1_700_000_000.75
    elsewhere = datetime.fromtimestamp(1_700_000_002.5, UTC)  # not the recording's start: keep the header
    assert cast.origin(elsewhere) == 1_700_000_000.0
    assert Cast({}, []).origin(within) is None
    # the recorded runs: the recording started within the second run.json says the run started
    for name in ("hello-file", "oom"):
        recorded = RunDirReader(fixture_runs / name).cast()
        started = RunDirReader(fixture_runs / name).info().started_at
        assert recorded.origin(started) == started.timestamp() != recorded.start_epoch


async def test_a_kernel_kill_seen_live_is_on_the_timeline_and_in_failures_at_its_time(
    tmp_path, fixture_runs, replay_loaded
):
    """The recorded oom run predates the live watch: a ``SandboxFault`` is put into a copy of it where
    the engine emits one (during the hog's command), as the engine writes it (``ts`` = the kill)."""
    run = tmp_path / "oom"
    shutil.copytree(fixture_runs / "oom", run)
    events = _events(run)
    hog = _bash_call(events)
    started = next(i for i, e in enumerate(events) if isinstance(e, ToolCall) and e.call_id == hog.call_id)
    at = started + 1
    kill = SandboxFault(
        ts=events[started].ts,
        kind=FaultKind.OOM_KILL,
        source="kernel.log",
        message="the kernel OOM-killed pid 57: python3 -c ...",
        pid=57,
        command="python3 -c ...",
        tool_call_id=hog.call_id,
    )
    events.insert(at, kill)
    lines = [e.model_copy(update={"seq": i + 1}).model_dump_json() for i, e in enumerate(events)]
    (run / RunFiles.EVENTS).write_text("\n".join(lines) + "\n")
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        timeline = screen.query_one(Timeline)
        assert timeline.markers["fault"] == [at]
        timeline.focus()
        await pilot.press("home", "e")
        assert screen.cursor == at
        assert "KERNEL oom_kill" in timeline.render().plain
        rows = _cell_texts(screen.query_one(FailuresTable))
        assert rows == [["oom_kill", "agent", "live", f"seen {kill.ts:%H:%M:%S}", kill.message]]
