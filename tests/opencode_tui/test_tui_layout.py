"""Issue 13, first parts: layouts that fit small terminals, one outcome stated once, replay to the end,
timeline markers. Driven by Pilot over the recorded runs (``tests/fixtures/runs``) and the constructed
run of conftest (for a compaction, which the recordings lack)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.run import RunScreen
from opencode_tui.state import CLEANUP_ORDER, RunState
from opencode_tui.widgets.header import RunHeader
from opencode_tui.widgets.stats import StatsPanel, verification_words
from opencode_tui.widgets.tabs import PANELS, PanelTabs
from opencode_tui.widgets.terminal import TerminalView
from opencode_tui.widgets.timeline import Timeline
from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.events import (
    CleanupObserved,
    Compaction,
    FailureRecorded,
    ModelCall,
    OutcomeDecided,
    PhaseChanged,
    StepState,
    ToolCall,
    VerificationFinished,
)


def _events(run):
    return list(RunDirReader(run).events())


async def test_header_is_one_line_and_keeps_the_outcome_at_80x24(fixture_runs, replay_loaded):
    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=(80, 24)) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        header = screen.query_one(RunHeader)
        assert header.size.height == 1
        shown = header.render().plain
        assert "\n" not in shown and len(shown) <= 80 - 2
        # the outcome and its failure kind come first, so the ellipsis eats the details, not them
        assert shown.startswith("done · count_as_zero (provider_oom_killed) · reward 0"), shown
        assert shown.endswith("…") and "done ok" not in header.plain
        # small terminal: the panels are tabs, the terminal has real height
        assert screen.compact and screen.query_one(PanelTabs).display
        assert screen.terminal.size.height >= 12
        key = {pid: str(n) for n, (pid, _) in enumerate(PANELS, 1)}  # the number keys follow the registry
        await pilot.press(key["stats"])
        stats = screen.query_one(StatsPanel)
        assert stats.display and not screen.terminal.display and stats.size.height >= 12
        text = stats.render().plain
        assert "Verification passed (not the reward: count_as_zero)" in text
        assert "reward 1" not in text
        await pilot.press(key["failures"])
        failures = screen.query_one("#failures")
        assert failures.display and failures.has_focus and failures.size.height >= 12
        await pilot.press(key["terminal"])
        assert screen.terminal.display and screen.terminal.has_focus


async def test_large_terminal_shows_every_panel(fixture_runs, replay_loaded):
    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert not screen.compact and not screen.query_one(PanelTabs).display
        for pid, _title in PANELS:
            assert screen.query_one(f"#{pid}").display, pid
        assert screen.query_one(StatsPanel).size.height >= 10
        await pilot.resize_terminal(90, 28)
        await pilot.pause()
        assert screen.compact and [p for p, _ in PANELS if screen.query_one(f"#{p}").display] == ["terminal"]


def _state(*events) -> RunState:
    return RunState.fold(list(events))


def test_verification_line_never_contradicts_the_outcome():
    now = datetime.now(UTC)
    passed = VerificationFinished(ts=now, exit_code=0, reward=1.0, passed=True, duration_s=0.5)
    failed = VerificationFinished(ts=now, exit_code=1, reward=0.0, passed=False, duration_s=0.5)
    unsure = VerificationFinished(ts=now, exit_code=None, reward=None, passed=None, duration_s=0.5)
    scored1 = OutcomeDecided(ts=now, action="scored", reward=1.0, summary="ok")
    scored0 = OutcomeDecided(ts=now, action="scored", reward=0.0, summary="failed tests")
    timeout = OutcomeDecided(ts=now, action="count_as_zero", reward=0.0, failure_kind="timeout", summary="t")
    evalerr = OutcomeDecided(ts=now, action="mark_evaluation_error", reward=None, summary="e")
    assert verification_words(_state(passed, scored1))[0] == "passed · reward 1"
    assert verification_words(_state(failed, scored0))[0] == "failed · reward 0"
    assert verification_words(_state(unsure))[0] == "inconclusive"
    assert verification_words(_state(timeout))[0] == "not run"
    assert verification_words(_state(passed, timeout))[0] == "passed (not the reward: count_as_zero)"
    assert verification_words(_state(failed, evalerr))[0] == "failed (not the reward: mark_evaluation_error)"


async def test_replay_plays_to_the_end_through_cleanup_and_outcome(fixture_runs, replay_loaded, wait):
    """Home, p: playback runs past the end of terminal.cast (the agent's terminal) through cleanup and the
    outcome; p at the end plays again from the start."""
    run = fixture_runs / "oom"
    events = _events(run)
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        screen: RunScreen = app.screen
        screen.query_one(Timeline).focus()
        await pilot.press("home")
        assert screen.cursor == 0
        await pilot.press("f", "p")
        await wait(pilot, lambda: not screen.playing, timeout=30, what="playback to end")
        assert screen.cursor == len(events) - 1
        view = screen.view_state
        assert view.outcome is not None and str(view.outcome.action) == "count_as_zero"
        assert {str(s): str(view.cleanup[s].state) for s in CLEANUP_ORDER} == {
            str(s): "ok" for s in CLEANUP_ORDER
        }
        assert "end of the run" in screen.query_one(Timeline).render().plain
        assert "end of the run" in str(screen.terminal.border_subtitle)
        await pilot.press("f", "p")  # back to 1x, then play again: from the start of the recording
        assert screen.playing and screen.play_source == "cast"
        assert screen.cast is not None and screen.play_frame < len(screen.cast.frames) // 2


async def test_timeline_markers_and_jumps(fixture_runs, replay_loaded):
    run = fixture_runs / "oom"
    events = _events(run)
    calls = [i for i, e in enumerate(events) if isinstance(e, ModelCall)]
    tools: dict[str, int] = {}
    for i, e in enumerate(events):
        if isinstance(e, ToolCall):
            tools.setdefault(e.call_id, i)
    failure = next(i for i, e in enumerate(events) if isinstance(e, FailureRecorded))
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        screen: RunScreen = app.screen
        timeline = screen.query_one(Timeline)
        timeline.focus()
        assert timeline.markers["tool_call"] == sorted(tools.values())
        bar = timeline.render().plain.split("\n")[1]
        assert {"m", "o", "✗"} <= set(bar)
        await pilot.press("home", "m")
        assert screen.cursor == calls[0]
        await pilot.press("m")
        assert screen.cursor == next(i for i in calls if i > calls[0])
        await pilot.press("home", "o")
        assert screen.cursor == min(tools.values())
        await pilot.press("home", "x")
        assert screen.cursor == failure
        await pilot.press("home", "c")  # this run has no compaction: the cursor stays
        assert screen.cursor == 0
        bindings = {b.binding.id for b in app.active_bindings.values() if b.binding.id}
        assert {"timeline-next-model_call", "timeline-next-compaction", "timeline-next-shell"} <= bindings


async def test_timeline_jumps_to_a_compaction(constructed_run, replay_loaded):
    events = _events(constructed_run)
    compaction = next(i for i, e in enumerate(events) if isinstance(e, Compaction))
    app = OpenCodeTUI(run_dir=constructed_run)
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        timeline = app.screen.query_one(Timeline)
        timeline.focus()
        assert "C" in timeline.render().plain.split("\n")[1]  # (the cursor sits at the end, not on it)
        await pilot.press("home", "c")
        assert app.screen.cursor == compaction


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
async def test_failed_run_never_shows_done_ok(constructed_run, replay_loaded, size):
    events = _events(constructed_run)
    assert any(isinstance(e, PhaseChanged) for e in events)
    assert any(isinstance(e, CleanupObserved) and e.state is StepState.FAILED for e in events)
    app = OpenCodeTUI(run_dir=constructed_run)
    async with app.run_test(size=size) as pilot:
        await replay_loaded(pilot)
        shown = app.screen.query_one(RunHeader).render().plain
        assert shown.startswith("closing · count_as_zero (provider_oom_killed) · reward 0"), shown
        assert isinstance(app.screen.query_one(TerminalView), TerminalView)


def _compaction_stream() -> list[dict]:
    """A compaction as OpenCode's server stream sends it (session/compaction.ts): a step whose context
    is large, a user message with a ``compaction`` part, the summary message (agent ``compaction``,
    ``summary: true``) streamed as deltas, then ``session.compacted``. Fed to the engine's real
    translator; the test checks what the TUI shows of the engine's rendering."""

    def msg(mid, role, **info):
        return {
            "type": "message.updated",
            "properties": {"info": {"id": mid, "role": role, "sessionID": "s", **info}},
        }

    def part(**p):
        return {
            "type": "message.part.updated",
            "properties": {"sessionID": "s", "part": {"sessionID": "s", **p}},
        }

    summary = "## Objective\nSort the numbers in data.txt.\n\n## Files\n- notes.txt read\n"
    read = {
        "status": "completed",
        "input": {"filePath": "/app/notes.txt"},
        "output": "notes",
        "title": "notes",
    }
    info = {"agent": "compaction", "mode": "compaction", "summary": True}
    return [
        {"type": "runner.session", "properties": {"sessionID": "s"}},
        msg("m1", "assistant", agent="build", tokens={"input": 50_000, "output": 500, "cache": {"read": 0}}),
        part(id="t1", messageID="m1", type="tool", tool="read", callID="c1", state=read),
        msg("m2", "user"),
        part(id="p2", messageID="m2", type="compaction", auto=True, overflow=True),
        msg("m3", "assistant", **info),
        part(id="p3", messageID="m3", type="text", text=""),
        {
            "type": "message.part.delta",
            "properties": {
                "sessionID": "s",
                "messageID": "m3",
                "partID": "p3",
                "field": "text",
                "delta": summary,
            },
        },
        part(id="p3", messageID="m3", type="text", text=summary, time={"start": 1, "end": 2}),
        msg("m3", "assistant", tokens={"input": 50_500, "output": 321, "cache": {"read": 0}}, **info),
        {"type": "session.compacted", "properties": {"sessionID": "s"}},
        # the next agent step: its first update has no tokens yet, its last says what it was sent
        msg("m4", "assistant", agent="build", tokens={"input": 0, "output": 0, "cache": {"read": 0}}),
        part(id="p4", messageID="m4", type="text", text="Sorting now.", time={"start": 3, "end": 4}),
        msg(
            "m4", "assistant", agent="build", tokens={"input": 2_100, "output": 40, "cache": {"read": 1_000}}
        ),
    ]


async def test_compaction_is_marked_and_its_summary_folded_in_the_terminal(tmp_path, replay_loaded):
    import json

    from opencode_tui_core.artifacts import RunDir
    from opencode_tui_core.events import EpisodeStarted
    from opencode_tui_core.runtime.stream import ServeStreamTranslator

    rd = RunDir.create(tmp_path / "runs", "compaction-run")
    rd.append_event(
        EpisodeStarted(
            run_id="compaction-run",
            task_id="t",
            provider="docker",
            opencode_version="1.18.32",
            run_budget_s=600,
            close_budget_s=60,
            model="scripted",
        )
    )
    tr = ServeStreamTranslator("/app")
    for line in _compaction_stream():
        for ev in tr.feed((json.dumps(line) + "\n").encode()):
            rd.append_event(ev)
    rd.append_event(Compaction(count=1, trigger="overflow"))
    rd.close()
    app = OpenCodeTUI(run_dir=rd.path)
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_loaded(pilot)
        term = app.screen.query_one(TerminalView)
        lines = [line.rstrip() for line in term._plain(0, term.line_count)]
        start = lines.index("── compacting context (overflow) · 50,500 tokens in context ──")
        assert lines[start - 1] == "• read notes.txt"
        assert lines[start + 1].startswith("▸ summary: ## Objective … 5 lines")
        # the size after the compaction is what the next call was sent (input + cache read), not the
        # summary's 321 output tokens
        assert lines[start + 2] == "── context compacted (was 50,500 tokens) ──"
        after = [line for line in lines if "context after the compaction" in line]
        assert after == ["── context after the compaction: 3,100 tokens (the next call's input) ──"], lines
        assert not any("321" in line for line in lines)
        assert not any("Sort the numbers" in line for line in lines)
        assert app.screen.state.compaction_count == 1


async def test_timeline_marks_shells_and_jumps_to_them(tmp_path, replay_loaded):
    """The engine records a person's shell as shell_opened/shell_closed: both are marked `$`."""
    from opencode_tui_core.artifacts import RunDir
    from opencode_tui_core.events import EpisodeStarted, Phase, ShellClosed, ShellOpened, TerminalOutput

    rd = RunDir.create(tmp_path / "runs", "shell-run")
    emitted = [
        EpisodeStarted(
            run_id="shell-run",
            task_id="t",
            provider="docker",
            opencode_version="1.18.32",
            run_budget_s=600,
            close_budget_s=60,
            model="scripted",
        ),
        TerminalOutput(stream="display", data="working\n"),
        ShellOpened(shell=1, phase=Phase.AGENT, marks_sample=True, cast="shells/1.cast"),
        TerminalOutput(stream="display", data="still working\n"),
        ShellClosed(shell=1, duration_s=3.0, bytes_in=10, bytes_out=200),
        TerminalOutput(stream="display", data="done\n"),
    ]
    for ev in emitted:
        rd.append_event(ev)
    rd.close()
    app = OpenCodeTUI(run_dir=rd.path)
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_loaded(pilot)
        timeline = app.screen.query_one(Timeline)
        assert timeline.markers["shell"] == [2, 4]
        timeline.focus()
        await pilot.press("home", "h")
        assert app.screen.cursor == 2
        await pilot.press("h")
        assert app.screen.cursor == 4
        await pilot.press("H")
        assert app.screen.cursor == 2
        assert "human intervened" in app.screen.query_one(RunHeader).plain


def test_header_says_a_limit_that_was_asked_for_and_not_enforced():
    """The SandboxReady event of a docker run with ``limits.disk`` on overlay2 over extfs (as the
    engine emits it): the header names the unenforced limit, not only the events (issue 25)."""
    from opencode_tui_core.events import SandboxReady

    state = RunState()
    state.apply(
        SandboxReady(
            sandbox_id="c0ffee",
            provider="docker",
            owned=True,
            network="none",
            disk_limit_enforced=False,
            pids_limit_enforced=True,
            notes=[
                "disk limit not enforced: storage driver overlay2 on extfs cannot limit a container's size"
            ],
        )
    )
    header = RunHeader()
    header.show(state, mode="live")
    assert "disk limit not enforced" in header.line.plain
    state.apply(SandboxReady(sandbox_id="c0ffee", provider="docker", owned=True, network="none"))
    header.show(state, mode="live")
    assert "not enforced" not in header.line.plain
