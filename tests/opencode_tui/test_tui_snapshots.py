"""SVG snapshots of the main screens and modals, driven by Pilot over the recorded run directories
(``tests/fixtures/runs``, recorded by ``scripts/record-fixture-runs``).

Update after an intended UI change with ``pytest tests/opencode_tui --snapshot-update`` and review the
SVGs in ``__snapshots__``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

import opencode_tui.screens.run as run_screen_module
from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.modals import FailureScreen, ModelCallScreen
from opencode_tui.themes import BUILTIN_ORDER
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.events import FailureRecorded, Intervention, ModelCall, TerminalOutput, ToolCall
from tests.opencode_tui.conftest import RecordedEpisode

SIZE = (160, 45)


def test_run_screen_mid_episode(snap_compare, fixture_runs, replay_loaded):
    run = fixture_runs / "hello-file"
    events = list(RunDirReader(run).events())
    # mid-episode: the agent's bash command is running and its output has just been shown (the server
    # stream's live output on the display stream), before the agent's last model call and before cleanup
    bash = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, ToolCall) and e.tool == "bash" and e.status == "running"
    )
    mid = next(
        i
        for i, e in enumerate(events)
        if i > bash and isinstance(e, TerminalOutput) and e.stream == "display" and "Hello from" in e.data
    )
    assert not any(isinstance(e, ToolCall) and e.status == "completed" for e in events[bash:mid])
    assert any(isinstance(e, ModelCall) for e in events[mid:])

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        pilot.app.screen.seek(mid)
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=run), terminal_size=SIZE, run_before=run_before)


def test_failure_detail_modal(snap_compare, fixture_runs, replay_loaded):
    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        pilot.app.screen.query_one(FailuresTable).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(pilot.app.screen, FailureScreen)

    assert snap_compare(OpenCodeTUI(run_dir=fixture_runs / "oom"), terminal_size=SIZE, run_before=run_before)


def test_model_call_detail_modal(snap_compare, fixture_runs, replay_loaded, wait):
    run = fixture_runs / "hello-file"
    events = list(RunDirReader(run).events())
    agent_row = next(
        i for i, e in enumerate(e for e in events if isinstance(e, ModelCall)) if e.kind == "agent"
    )

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        table = pilot.app.screen.query_one(ModelCallsTable)
        table.focus()
        table.move_cursor(row=agent_row)
        await pilot.press("enter")
        modal = pilot.app.screen
        assert isinstance(modal, ModelCallScreen)
        await wait(pilot, lambda: modal.loaded, what="the call's bodies")
        await pilot.press("right")  # Request tab
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=run), terminal_size=SIZE, run_before=run_before)


def test_model_call_response_assembled_120x40(snap_compare, fixture_runs, replay_loaded, wait):
    """The last agent call of the oom run: the response as the client assembled it from the stream
    (a tool call with its arguments parsed), latency and TTFT in view at 120 columns."""
    run = fixture_runs / "oom"

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        table = pilot.app.screen.query_one(ModelCallsTable)
        table.focus()
        table.move_cursor(row=1)
        await pilot.press("enter")
        modal = pilot.app.screen
        assert isinstance(modal, ModelCallScreen)
        await wait(pilot, lambda: modal.loaded, what="the call's bodies")
        await pilot.press("right", "right")  # Response tab
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=run), terminal_size=(120, 40), run_before=run_before)


def test_terminal_search_120x40(snap_compare, fixture_runs, replay_loaded):
    """/ in the terminal pane: every match highlighted, the current one in its own colour, the count
    in the pane's subtitle."""

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        pilot.app.screen.terminal.focus()
        await pilot.press("slash", *"hello", "enter", "n")
        await pilot.pause()

    run = fixture_runs / "hello-file"
    assert snap_compare(OpenCodeTUI(run_dir=run), terminal_size=(120, 40), run_before=run_before)


def test_inspect_cleanup_80x24(snap_compare, fixture_runs, replay_loaded, wait):
    """v on a small terminal: each cleanup step's detail with the receipt's fields."""

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        await pilot.press("v")
        await wait(pilot, lambda: getattr(pilot.app.screen, "loaded", False), what="the run's files")
        await pilot.pause()

    assert snap_compare(
        OpenCodeTUI(run_dir=fixture_runs / "oom"), terminal_size=(80, 24), run_before=run_before
    )


@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_inspect_verifier(snap_compare, fixture_runs, replay_loaded, wait, size):
    """v, then the Verifier tab: stderr right under stdout (it sat below a screen of blank rows)."""

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        await pilot.press("v")
        await wait(pilot, lambda: getattr(pilot.app.screen, "loaded", False), what="the run's files")
        await pilot.press("right")
        await pilot.pause()

    assert snap_compare(
        OpenCodeTUI(run_dir=fixture_runs / "hello-file"), terminal_size=size, run_before=run_before
    )


def test_runs_browser(snap_compare, fixture_runs, monkeypatch):
    async def run_before(pilot) -> None:
        await pilot.pause()

    monkeypatch.chdir(
        fixture_runs.parent
    )  # the title shows the runs dir as given: keep it checkout-independent
    app = OpenCodeTUI(runs_dir=Path(fixture_runs.name))
    assert snap_compare(app, terminal_size=(140, 20), run_before=run_before)


def test_runs_browser_80x24(snap_compare, fixture_runs, monkeypatch):
    """At 80 columns every column that matters fits (narrow forms; the start and the reward kept, the
    provider, duration and human mark dropped)."""

    async def run_before(pilot) -> None:
        await pilot.pause()

    monkeypatch.chdir(fixture_runs.parent)
    app = OpenCodeTUI(runs_dir=Path(fixture_runs.name))
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


@pytest.mark.parametrize("theme", BUILTIN_ORDER)
def test_theme(snap_compare, fixture_runs, replay_loaded, theme):
    async def run_before(pilot) -> None:
        await replay_loaded(pilot)

    app = OpenCodeTUI(run_dir=fixture_runs / "oom", theme=theme)
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


# ---- the run screen at three sizes, live and replay (issue 13: layouts that fit) ------------------

SIZES = [(80, 24), (120, 40), (200, 60)]


def _frozen_clock(at: datetime) -> type[datetime]:
    """The live header's clock, stopped at ``at``: a snapshot of a running episode must not show the
    wall-clock elapsed time (a fake for the clock only)."""

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return at if tz is None else at.astimezone(tz)

    return Frozen


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_replay_sizes(snap_compare, fixture_runs, replay_loaded, size):
    """The finished oom run: the header leads with the outcome and its kind on one line."""

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)

    assert snap_compare(OpenCodeTUI(run_dir=fixture_runs / "oom"), terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_live_sizes(snap_compare, fixture_runs, wait, monkeypatch, size):
    """The oom run live, just after the failure was recorded (cleanup still to come)."""
    events = list(RunDirReader(fixture_runs / "oom").events())
    failed = next(i for i, e in enumerate(events) if isinstance(e, FailureRecorded))
    shown = events[: failed + 1]
    monkeypatch.setattr(run_screen_module, "datetime", _frozen_clock(shown[-1].ts))
    episode = RecordedEpisode(shown)

    async def run_before(pilot) -> None:
        screen = pilot.app.screen
        await wait(pilot, lambda: screen.total == len(shown), what="the recorded events")
        await pilot.pause(0.3)  # the held-back tool call is flushed (PENDING_MAX_AGE)
        screen.redraw()
        await pilot.pause()

    app = OpenCodeTUI(control=episode, run_dir=fixture_runs / "oom", run_episode=episode.play)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_replay_80x24_failures_tab(snap_compare, fixture_runs, replay_loaded):
    """At 80×24 each panel is a tab with the whole height: the Failures columns fit."""

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        await pilot.press("5")
        await pilot.pause()

    assert snap_compare(
        OpenCodeTUI(run_dir=fixture_runs / "oom"), terminal_size=(80, 24), run_before=run_before
    )


@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_diff_screen(snap_compare, fixture_runs, size, wait):
    """``opencode-tui diff`` of the recorded oom and exit-137 runs: drift, steps side by side with the
    first divergence marked, deltas."""
    exit_137 = fixture_runs.parent / "more-runs" / "exit-137"
    app = OpenCodeTUI(diff=(fixture_runs / "oom", exit_137))

    async def run_before(pilot) -> None:  # the diff is built in a worker thread
        await wait(pilot, lambda: pilot.app.screen.loaded, what="the diff")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


# ---- the debugger's hold (issue 27) ------------------------------------------------------------


def _held_episode(monkeypatch, fixture_runs, reply: bool = False) -> tuple[RecordedEpisode, int]:
    """hello-file live, held before its 2nd agent call (``reply``: its reply, held for editing) for 12 s
    by the clock (frozen)."""
    events = list(RunDirReader(fixture_runs / "hello-file").events())
    agent = [i for i, e in enumerate(events) if isinstance(e, ModelCall) and e.kind == "agent"]
    shown = events[: agent[1]]  # up to (not including) the 2nd agent call's record
    held_at = shown[-1].ts + timedelta(seconds=0.2)
    hold = Intervention(
        what="break", who="engine", call_id=events[agent[1]].call_id, call_number=2, text="call:2", ts=held_at
    )
    shown.append(hold)
    if reply:
        model_reply = '{"text":"Done: hello.txt holds the greeting."}'
        shown.append(hold.model_copy(update={"what": "edit", "who": "tui", "text": None}))
        shown.append(hold.model_copy(update={"what": "reply", "text": model_reply}))
    monkeypatch.setattr(run_screen_module, "datetime", _frozen_clock(held_at + timedelta(seconds=12)))
    return RecordedEpisode(shown), len(shown)


async def _settled(pilot, wait, total: int) -> None:
    """Every recorded event shown, the screen redrawn, and no toast (its timing is not what is compared)."""
    screen = pilot.app.screen
    await wait(pilot, lambda: screen.total == total, what="the recorded events")
    await pilot.pause(0.3)
    screen.redraw()
    pilot.app.clear_notifications()
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (160, 45)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_live_held_before_a_call(snap_compare, fixture_runs, wait, monkeypatch, size):
    """HELD before call 2 (12 s, run deadline counting) leads the header; the footer lists the keys
    that apply while held (continue, step, the held call, say, answer, edit, abort)."""
    episode, total = _held_episode(monkeypatch, fixture_runs)

    async def run_before(pilot) -> None:
        await _settled(pilot, wait, total)

    app = OpenCodeTUI(control=episode, run_dir=fixture_runs / "hello-file", run_episode=episode.play)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_live_held_say_box_80x24(snap_compare, fixture_runs, wait, monkeypatch):
    """m at a break: the say box fits 80×24 over the held run."""
    episode, total = _held_episode(monkeypatch, fixture_runs)

    async def run_before(pilot) -> None:
        await _settled(pilot, wait, total)
        await pilot.press("m")
        await pilot.pause()

    app = OpenCodeTUI(control=episode, run_dir=fixture_runs / "hello-file", run_episode=episode.play)
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_live_reply_held_and_the_answer_box_80x24(snap_compare, fixture_runs, wait, monkeypatch):
    """The model's reply held for editing: the header says so, the bar lists the keys for a reply; a
    (one-line, several-line) answer box over it fits 80×24."""
    episode, total = _held_episode(monkeypatch, fixture_runs, reply=True)

    async def run_before(pilot) -> None:
        screen = pilot.app.screen
        await wait(pilot, lambda: screen.total == total, what="the recorded events")
        await pilot.pause(0.3)
        screen.redraw()
        pilot.app.clear_notifications()
        await pilot.press("e")  # the reply is held: e opens it in the edit box, prefilled
        await pilot.pause()

    app = OpenCodeTUI(control=episode, run_dir=fixture_runs / "hello-file", run_episode=episode.play)
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
