"""The run screen: one episode, live (events from ``EpisodeControl.bus``) or replayed (``events.jsonl``).

Both sources deliver :class:`EventsReceived` batches to :meth:`RunScreen.on_events_received`, the one
event-handling path: the terminal pane ingests the batch, :class:`RunState` folds it, and the panels are
redrawn once per batch. Replay adds the timeline: the cursor can be moved to any event; the panels then
show the state folded up to it and the terminal pane the lines written up to it.

Above 800 lines because it is one Screen whose handlers (live, replay, timeline, keys, panels) share
the folded state and the cursor; the state itself (RunState) and the widgets are in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from array import array
from bisect import bisect_right
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer

from core.artifacts import Cast, RunDirReader, RunInfo
from core.events import (
    CleanupObserved,
    CleanupStep,
    Compaction,
    Event,
    FailureRecorded,
    FailureRecovered,
    HealthWarning,
    ModelCall,
    SandboxFault,
    ShellClosed,
    ShellOpened,
    StepState,
    TerminalOutput,
    ToolCall,
)
from opencode_tui import format as fmt
from opencode_tui.feeds import EventIndex, LoadStats, iter_event_batches
from opencode_tui.messages import CancelWanted, EventsReceived, KeepToggleWanted, ReplayLoaded, ShellWanted
from opencode_tui.screens.inspect import InspectScreen
from opencode_tui.screens.modals import FailureScreen, ModelCallScreen
from opencode_tui.state import RunState
from opencode_tui.widgets.cleanup import CleanupPanel
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.findbar import FindBar
from opencode_tui.widgets.header import RunHeader
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.progress import InstallProgressBar, WarningsBar
from opencode_tui.widgets.stats import StatsPanel
from opencode_tui.widgets.tabs import PANELS, PanelTabs, is_compact
from opencode_tui.widgets.terminal import TerminalView
from opencode_tui.widgets.timeline import Timeline

if TYPE_CHECKING:
    from core.control import EpisodeControl
    from opencode_tui.host import EpisodeHost as OpenCodeTUI

LIVE_BATCH_INTERVAL = 1 / 30  # at most this often a live batch is delivered (events are coalesced)
# A live batch holds about LIVE_SLICE_S of ingest work (measured as it goes: chars per second of ingest),
# between these bounds: a key press that reaches the screen waits behind at most one such slice.
LIVE_SLICE_S = 0.004
LIVE_BATCH_CHARS_MIN = 32_768
LIVE_BATCH_CHARS_MAX = 2_000_000
LIVE_BATCH_EVENTS = 20_000
LIVE_HANDOFF_DEADLINE_S = 1.0  # the feed waits this long at most for the screen to take a batch
REPLAY_BATCH = 1000
FAST = 10.0  # "fast" playback speed; idle gaps longer than FAST_GAP_S are skipped too
FAST_GAP_S = 0.5
PLAY_TICK = 0.05
REDRAW_INTERVAL = 1 / 20  # live: the screen redraws at most this often while events stream in
REDRAW_INTERVAL_LOADING = 0.5  # replay: while events.jsonl is being read
PENDING_MAX_AGE = 0.3  # a held-back tool call/text is shown after this long without an engine rendering

LIVE_ONLY = {"cancel_episode", "toggle_keep"}
REPLAY_ONLY = {"step", "key_event", "next_failure", "prev_failure", "play", "fast"}


class RunScreen(Screen[None]):
    BINDINGS = [
        Binding(
            "s",
            "open_shell",
            "Shell",
            tooltip="Interactive shell in the sandbox (ctrl+] to return)",
            id="run.shell",
        ),
        Binding(
            "c",
            "cancel_episode",
            "Cancel",
            tooltip="Cancel the episode (cleanup is still confirmed)",
            id="run.cancel",
        ),
        Binding(
            "k",
            "toggle_keep",
            "Keep sandbox",
            tooltip="Keep the sandbox after the run for debugging",
            id="run.keep",
        ),
        Binding(
            "left_square_bracket",
            "step(-1)",
            "◀ Event",
            key_display="[",
            tooltip="Replay: step the timeline one event back",
            id="run.step-back",
        ),
        Binding(
            "right_square_bracket",
            "step(1)",
            "Event ▶",
            key_display="]",
            tooltip="Replay: step the timeline one event forward",
            id="run.step-forward",
        ),
        Binding(
            "left_curly_bracket",
            "key_event(-1)",
            "Prev key event",
            show=False,
            key_display="{",
            id="run.prev-key-event",
        ),
        Binding(
            "right_curly_bracket",
            "key_event(1)",
            "Next key event",
            show=False,
            key_display="}",
            id="run.next-key-event",
        ),
        Binding(
            "n",
            "next_failure",
            "Next failure",
            tooltip="Replay: jump the timeline to the next failure",
            id="run.next-failure",
        ),
        Binding("N", "prev_failure", "Prev failure", show=False, id="run.prev-failure"),
        Binding(
            "p",
            "play",
            "Play/pause",
            tooltip="Replay: play/pause the terminal recording (terminal.cast)",
            id="run.play",
        ),
        Binding(
            "f",
            "fast",
            "Fast",
            tooltip=f"Replay: toggle 1{fmt.TIMES} / fast playback (idle gaps skipped)",
            id="run.fast",
        ),
        Binding("escape", "back", "Back", show=False, id="run.back"),
        Binding("ctrl+f", "find", "Search", show=False, tooltip="Search the terminal pane", id="run.find"),
        # `/` from any panel without a `/` of its own (the timeline while a recording plays, the stats):
        # the terminal pane's search, whichever view it shows (rendered, raw, terminal.cast)
        Binding(
            "slash",
            "find",
            "Search",
            show=False,
            key_display="/",
            tooltip="Search the terminal pane",
            id="run.find-slash",
        ),
        Binding(
            "v",
            "inspect",
            "Inspect",
            tooltip="Cleanup detail with the receipt, verifier output, prompt and instructions as sent, task.yaml",
            id="run.inspect",
        ),
        *(
            Binding(str(i), f"panel('{pid}')", title, show=False, id=f"panel-{pid}")
            for i, (pid, title) in enumerate(PANELS, 1)
        ),
    ]

    # Live: bound to the app's one keep state (``OpenCodeTUI.keep``); None in a replay (nothing to keep).
    keep: reactive[bool | None] = reactive(None, init=False)

    def __init__(
        self,
        *,
        control: EpisodeControl | None = None,
        run_dir: Path | None = None,
        from_browser: bool = False,
    ) -> None:
        super().__init__()
        if control is None and run_dir is None:
            raise ValueError("RunScreen needs a live EpisodeControl or a run directory")
        self.control = control
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.reader = RunDirReader(self.run_dir, check=False) if self.run_dir is not None else None
        self.mode = "live" if control is not None else "replay"
        self.from_browser = from_browser
        self.info: RunInfo | None = self._read_info()
        self.state = RunState(info=self.info)
        self.view_state = self.state
        self.total = 0
        self.ts: list[datetime] = []
        self.key_idx = array("q")
        self.key_evs: list[Event] = []
        self.failure_idx: list[int] = []
        self.markers: dict[str, list[int]] = {
            "model_call": [],
            "tool_call": [],
            "compaction": [],
            "shell": [],
            "health": [],
            "fault": [],
        }
        self._marked_calls: set[tuple[str, str]] = set()  # a call is marked where it first appears
        self.cursor: int | None = None
        self.replay_loading = self.mode == "replay"
        self.load_stats = LoadStats()
        self.load_seconds: float | None = None
        self.index: EventIndex | None = None
        if self.run_dir is not None and self.mode == "replay":
            assert self.reader is not None
            self.index = EventIndex(self.reader.events_path)
        self.compact: bool | None = None  # one panel at a time (a small terminal); None: not laid out yet
        self.panel = PANELS[0][0]  # the panel shown when compact
        self._action_key: tuple[bool, bool, bool] | None = None
        self._bindings_pending = False  # a footer update is scheduled (refresh_bindings)
        self._redrawn_at = 0.0
        self._redraw_timer: Timer | None = None
        self._panels_dirty = False
        # live feed: one batch handed over at a time, sized by the measured ingest rate
        self._batch_taken = asyncio.Event()
        self._batch_chars = 256 * 1024
        self._ingest_rate: float | None = None
        # playback
        self.cast: Cast | None = None
        self.cast_checked = False
        self.playing = False
        self.speed = 1.0
        self.play_clock = 0.0
        self.play_frame = 0
        self.play_source: str | None = None  # "cast" | "events"

    def _read_info(self) -> RunInfo | None:
        return self.reader.info_or_none() if self.reader is not None else None

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header").data_bind(keep=RunScreen.keep)
        yield WarningsBar(id="warnings")
        yield InstallProgressBar(id="install")
        yield PanelTabs(id="tabs")
        with Horizontal(id="main"):
            with Vertical(id="terminal-pane"):
                yield TerminalView(id="terminal")
                yield FindBar(
                    placeholder="search the terminal · Enter: find · Esc: close", id="terminal-find"
                )
            with Vertical(id="side"):
                yield StatsPanel(id="stats")
                yield CleanupPanel(id="cleanup")
        with Horizontal(id="bottom"):
            with Vertical(id="calls-pane"):
                yield ModelCallsTable(id="calls")
                yield FindBar(
                    placeholder="filter calls: status:error|ok|4xx|5xx|429 kind:agent|title|compaction, or words",
                    id="calls-filter",
                )
            yield FailuresTable(id="failures")
        if self.mode == "replay":
            yield Timeline(id="timeline")
        yield Footer()

    def on_resize(self) -> None:
        self._apply_layout()

    def _apply_layout(self) -> None:
        """Below ~100×30 the panels become tabs: each shown panel gets the whole height."""
        compact = is_compact(self.size.width, self.size.height)
        if compact == self.compact and not compact:
            return
        self.compact = compact
        self.set_class(compact, "-compact")
        self.query_one(PanelTabs).display = compact
        self.query_one(InstallProgressBar).show(self.view_state, compact=compact)
        for pid, _title in PANELS:
            self.query_one(f"#{pid}").display = not compact or pid == self.panel
        self.query_one("#terminal-pane").display = not compact or self.panel == "terminal"
        self.query_one("#calls-pane").display = not compact or self.panel == "calls"
        self.query_one("#main").display = not compact or self.panel in ("terminal", "stats", "cleanup")
        self.query_one("#side").display = not compact or self.panel in ("stats", "cleanup")
        self.query_one("#bottom").display = not compact or self.panel in ("calls", "failures")
        self._show_tabs()
        self.refresh_bindings()

    def _show_tabs(self) -> None:
        state = self.view_state
        badges = {"calls": str(len(state.model_calls)) if state.model_calls else ""}
        failed = sum(1 for f in state.failures if isinstance(f, FailureRecorded))
        warned = len(state.health)  # [health] warnings live in the same tab
        badges["failures"] = " ".join(
            b for b in (f"✗{failed}" if failed else "", f"⚠{warned}" if warned else "") if b
        )
        self.query_one(PanelTabs).show(self.panel, badges)

    def action_panel(self, panel: str) -> None:
        self.panel = panel
        self._apply_layout()
        widget = self.query_one(f"#{panel}")
        if widget.focusable:
            widget.focus()

    # -- search and filter -----------------------------------------------------------------------

    def action_find(self) -> None:
        """ctrl+f (and ``/`` in the terminal pane): the terminal's search bar."""
        if self.compact and self.panel != "terminal":
            self.action_panel("terminal")
        self.query_one("#terminal-find", FindBar).open(self.terminal.query)

    @on(TerminalView.FindWanted)
    def on_terminal_find_wanted(self) -> None:
        self.action_find()

    @on(FindBar.Applied, "#terminal-find")
    def on_terminal_find_applied(self, message: FindBar.Applied) -> None:
        found = self.terminal.search(message.query)
        self.terminal.focus()
        if message.query and not found:
            self.notify(f"Not found in the {self.terminal.border_title}: {message.query}", timeout=3)

    @on(FindBar.Closed, "#terminal-find")
    def on_terminal_find_closed(self) -> None:
        self.terminal.clear_search()
        self.terminal.focus()

    @on(ModelCallsTable.FilterWanted)
    def on_calls_filter_wanted(self) -> None:
        table = self.query_one(ModelCallsTable)
        self.query_one("#calls-filter", FindBar).open(table.filter_text)

    @on(FindBar.Applied, "#calls-filter")
    def on_calls_filter_applied(self, message: FindBar.Applied) -> None:
        table = self.query_one(ModelCallsTable)
        table.set_filter(message.query)
        table.focus()

    @on(FindBar.Closed, "#calls-filter")
    def on_calls_filter_closed(self) -> None:
        table = self.query_one(ModelCallsTable)
        table.set_filter("")
        table.focus()

    @on(PanelTabs.Selected)
    def on_panel_selected(self, message: PanelTabs.Selected) -> None:
        self.action_panel(message.panel)

    @property
    def terminal(self) -> TerminalView:
        return self.query_one(TerminalView)

    @property
    def tui(self) -> OpenCodeTUI:
        """The app, typed: the run screen only runs inside ``OpenCodeTUI``."""
        from opencode_tui.host import EpisodeHost as OpenCodeTUI

        app = self.app
        assert isinstance(app, OpenCodeTUI), app
        return app

    @property
    def bodies_dir(self) -> Path | None:
        """Where ``model_calls.jsonl`` is: the replayed run directory, or the live episode's (the control's
        ``run_dir``: a path, or a ``core.artifacts.RunDir`` once the episode has created it)."""
        if self.run_dir is not None:
            return self.run_dir
        found = getattr(self.control, "run_dir", None)
        if found is None or isinstance(found, str | Path):
            return Path(found) if found is not None else None
        path = getattr(found, "path", None)
        return Path(path) if path is not None else None

    def watch_keep(self) -> None:
        self.refresh_bindings()

    def refresh_bindings(self) -> None:
        """One footer update per refresh, however many asked: each request makes the footer recompose
        (a layout of the whole screen, ~20 ms), and mounting alone asked six times (layout, focus, keep,
        action states), the last ones landing on the first streamed output."""
        if not self._bindings_pending:
            self._bindings_pending = True
            self.call_after_refresh(self._publish_bindings)

    def _publish_bindings(self) -> None:
        self._bindings_pending = False
        super().refresh_bindings()

    def _on_episode_done(self, done: bool) -> None:
        if done:
            self._show_header()
            self._refresh_action_states()

    def on_mount(self) -> None:
        if self.mode == "live":
            self.watch(self.tui, "episode_done", self._on_episode_done, init=False)
        self.query_one("#stats").border_title = "Stats"
        self.query_one("#cleanup").border_title = "Cleanup"
        self.app.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self._apply_layout()
        self.refresh_panels()
        self.terminal.focus()
        if self.mode == "live":
            self._live_feed()
            self.set_interval(1.0, self._show_header)  # elapsed time
        else:
            self._load_replay()
            self.refresh_timeline()
        self._play_timer = self.set_interval(PLAY_TICK, self._play_tick, pause=True)

    def _on_theme_changed(self, _theme: object) -> None:
        self.query_one(ModelCallsTable).sync(
            self.view_state.model_calls, self.view_state.start_time, force=True
        )
        self.query_one(FailuresTable).sync(self.view_state.problems, force=True)

    # -- sources -------------------------------------------------------------------------------

    @work(exclusive=True, group="live-feed")
    async def _live_feed(self) -> None:
        """Drain the bus queue into batches: at most one batch per LIVE_BATCH_INTERVAL while output is
        sparse; under a flood, one slice of ingest work per turn of the event loop.

        Two things keep keys quick while megabytes stream in. A batch is sized to about LIVE_SLICE_S of
        ingest (the rate is measured by :meth:`on_events_received`; batches of up to 2 MB held the loop
        10-20 ms each). And only one batch is in the screen's message queue at a time: a screen drains its
        whole queue in one go, and a key press bubbles through the screen on its way to the bindings, so
        batches queued while the screen was busy (an awaited handler, a repaint) were ingested back to
        back, ahead of the key.
        """
        queue = self.tui.live_queue()
        handed = self._batch_taken
        while True:
            first = await queue.get()
            batch = [first]
            budget = self._batch_chars
            chars = len(first.data) if type(first) is TerminalOutput else 0
            while not queue.empty() and chars < budget and len(batch) < LIVE_BATCH_EVENTS:
                ev = queue.get_nowait()
                batch.append(ev)
                if type(ev) is TerminalOutput:
                    chars += len(ev.data)
            handed.clear()
            self.post_message(EventsReceived(batch, "live"))
            with contextlib.suppress(TimeoutError):  # a screen that stopped taking batches: carry on
                await asyncio.wait_for(handed.wait(), LIVE_HANDOFF_DEADLINE_S)
            await asyncio.sleep(0 if not queue.empty() else LIVE_BATCH_INTERVAL)

    def flush_live(self) -> None:
        """Ingest whatever is still queued right now (before exiting, so the last state is shown)."""
        queue = self.tui.live_queue()
        batch: list[Event] = []
        while not queue.empty():
            batch.append(queue.get_nowait())
        if batch:
            self.ingest(batch)
        self.terminal.flush_pending()
        self._panels_dirty = True
        self.redraw()

    @work(exclusive=True, group="replay-load")
    async def _load_replay(self) -> None:
        """Read events.jsonl in batches on the event loop, yielding between batches.

        (A thread would decode in parallel in theory, but under the GIL a busy decoder thread makes
        every wake-up of the event loop wait for the interpreter lock: on the loop, in small batches,
        the whole load is faster and the screen stays responsive.)
        """
        assert self.reader is not None and self.index is not None
        start = time.perf_counter()
        for batch in iter_event_batches(self.reader.events_path, self.index, REPLAY_BATCH, self.load_stats):
            self.post_message(EventsReceived(batch, "replay"))
            await asyncio.sleep(0)
        self.post_message(
            ReplayLoaded(self.load_stats.events, time.perf_counter() - start, self.load_stats.bad_lines)
        )

    # -- the one event-handling path -----------------------------------------------------------

    @on(EventsReceived)
    def on_events_received(self, message: EventsReceived) -> None:
        if message.source == "live":
            start = time.perf_counter()
            self.ingest(message.events)
            self._measure_ingest(message.events, time.perf_counter() - start)
            self._batch_taken.set()
        else:
            self.ingest(message.events)

    def _measure_ingest(self, events: list[Event], seconds: float) -> None:
        """Size the next live batch to about LIVE_SLICE_S of ingest, from this one's chars per second
        (a moving average: one slow batch, a collection or a repaint, does not halve the next)."""
        chars = sum(len(ev.data) for ev in events if type(ev) is TerminalOutput)
        if chars < LIVE_BATCH_CHARS_MIN or seconds <= 0:
            return  # too small to say anything about the rate
        rate = chars / seconds
        self._ingest_rate = rate if self._ingest_rate is None else 0.7 * self._ingest_rate + 0.3 * rate
        self._batch_chars = int(
            min(max(self._ingest_rate * LIVE_SLICE_S, LIVE_BATCH_CHARS_MIN), LIVE_BATCH_CHARS_MAX)
        )

    def ingest(self, events: list[Event]) -> None:
        if not events:
            return
        self.terminal.ingest(events)
        base = self.total
        self.ts.extend(ev.ts for ev in events)
        keys = self.state.apply_batch(events, base)
        self.total += len(events)
        for index in keys:
            ev = events[index - base]
            self.key_idx.append(index)
            self.key_evs.append(ev)
            kind = type(ev)
            if kind is FailureRecorded:
                self.failure_idx.append(index)
            elif kind is Compaction:
                self.markers["compaction"].append(index)
            elif kind is ShellOpened or kind is ShellClosed:
                self.markers["shell"].append(index)
            elif kind is HealthWarning:
                self.markers["health"].append(index)
            elif kind is SandboxFault:
                self.markers["fault"].append(index)
            elif kind is ModelCall or kind is ToolCall:
                marker = "model_call" if kind is ModelCall else "tool_call"
                if (marker, ev.call_id) not in self._marked_calls:
                    self._marked_calls.add((marker, ev.call_id))
                    self.markers[marker].append(index)
        self._panels_dirty = self._panels_dirty or bool(keys)
        self._redraw_soon()

    @on(ReplayLoaded)
    def on_replay_loaded(self, message: ReplayLoaded) -> None:
        self.replay_loading = False
        self.load_seconds = message.seconds
        if message.bad_lines:
            examples = "; ".join(self.load_stats.bad_examples)
            self.notify(
                f"{message.bad_lines} line(s) of events.jsonl could not be read and were skipped ({examples})",
                severity="warning",
                timeout=8,
            )
        self._panels_dirty = True
        self.redraw()

    # -- drawing -------------------------------------------------------------------------------

    def _redraw_soon(self) -> None:
        """Redraw after new events at most every REDRAW_INTERVAL (a trailing timer draws the last batch):
        a repaint costs far more than ingesting a batch, so batches are coalesced here too."""
        interval = REDRAW_INTERVAL_LOADING if self.replay_loading else REDRAW_INTERVAL
        now = time.monotonic()
        if now - self._redrawn_at >= interval:
            self.redraw()
        elif self._redraw_timer is None:
            self._redraw_timer = self.set_timer(interval - (now - self._redrawn_at), self.redraw)

    def redraw(self) -> None:
        """Show everything ingested so far (when the cursor follows the end)."""
        self._redrawn_at = time.monotonic()
        if self._redraw_timer is not None:
            self._redraw_timer.stop()
            self._redraw_timer = None
        if self.terminal.flush_pending(
            older_than=0.0 if not self.replay_loading and self.mode == "replay" else PENDING_MAX_AGE
        ):
            self._redraw_timer = self.set_timer(PENDING_MAX_AGE, self.redraw)  # show it if nothing follows
        if self.cursor is None:
            self.terminal.refresh_content()
            if self._panels_dirty:
                self.refresh_panels()
            elif self.mode == "live":
                self._show_header()
        if self.mode == "replay":
            self.refresh_timeline()

    def refresh_panels(self) -> None:
        self._panels_dirty = False
        self._refresh_action_states()
        state = self.view_state
        self._show_header()
        self.query_one(WarningsBar).show(state)
        self.query_one(InstallProgressBar).show(state, compact=bool(self.compact))
        self.query_one(StatsPanel).show(state)
        self.query_one(CleanupPanel).show(state)
        self.query_one(ModelCallsTable).sync(state.model_calls, state.start_time)
        self.query_one(FailuresTable).sync(state.problems)
        if self.compact:
            self._show_tabs()

    def _show_header(self) -> None:
        state = self.view_state
        live_now = None
        if self.mode == "live" and self.cursor is None and not state.finished:
            live_now = datetime.now(UTC)
        mode = (
            "LIVE" if self.mode == "live" else f"REPLAY {self.run_dir.name if self.run_dir else ''}".strip()
        )
        self.query_one(RunHeader).show(state, mode=mode, now=live_now)

    def refresh_timeline(self) -> None:
        if self.mode != "replay":
            return
        timeline = self.query_one(Timeline)
        pos = self.total - 1 if self.cursor is None else self.cursor
        summary, when = "", ""
        if pos >= 0 and self.index is not None:
            ev = self.index.event_at(pos)
            if ev is not None:
                summary = fmt.summarize(ev)
                when = fmt.offset(ev.ts, self.state.start_time)
        timeline.show(
            cursor=self.cursor,
            total=self.total,
            loading=self.replay_loading,
            summary=summary,
            when=when,
            failures=self.failure_idx,
            playback=self._playback_status(),
            markers=self.markers,
        )

    # -- timeline ------------------------------------------------------------------------------

    def seek(self, index: int | None) -> None:
        """Show the run as of event ``index`` (``None``: the latest state, following new events)."""
        if index is not None:
            if self.total == 0:
                return
            index = min(max(index, 0), self.total - 1)
        self.cursor = index
        term = self.terminal
        if index is None:
            self.view_state = self.state
            term.set_limit(None)
        else:
            k = bisect_right(self.key_idx, index)
            view = RunState.fold(self.key_evs[:k], info=self.info)
            view.last_ts = self.ts[index]
            if view.first_ts is None:
                view.first_ts = self.ts[0]
            self.view_state = view
            term.set_limit(term.marks[index])
        self.refresh_panels()
        self.refresh_timeline()
        if index is not None and self.index is not None:
            ev = self.index.event_at(index)
            if isinstance(ev, FailureRecorded | FailureRecovered):
                table = self.query_one(FailuresTable)
                if table.records:
                    table.move_cursor(row=len(table.records) - 1, animate=False)
            elif isinstance(ev, ModelCall):
                self.query_one(ModelCallsTable).select_call(ev.call_id)

    @on(Timeline.Seek)
    def on_timeline_seek(self, message: Timeline.Seek) -> None:
        self._stop_playback()
        self.seek(message.index)

    def action_step(self, delta: int) -> None:
        self._stop_playback()
        pos = self.total - 1 if self.cursor is None else self.cursor
        self.seek(pos + delta)

    def action_key_event(self, direction: int) -> None:
        """Jump to the previous/next event that changes a panel (skipping terminal output)."""
        pos = self.total - 1 if self.cursor is None else self.cursor
        i = bisect_right(self.key_idx, pos)
        target = (self.key_idx[i] if i < len(self.key_idx) else None) if direction > 0 else None
        if direction < 0:
            j = bisect_right(self.key_idx, pos - 1) - 1
            target = self.key_idx[j] if j >= 0 else 0
        if target is not None:
            self._stop_playback()
            self.seek(target)

    def action_next_failure(self) -> None:
        self._jump_failure(True)

    def action_prev_failure(self) -> None:
        self._jump_failure(False)

    def _jump_failure(self, forward: bool) -> None:
        if not self.failure_idx:
            self.notify("No failure events in this run.", timeout=3)
            return
        target = self.query_one(Timeline).next_failure(forward)
        self._stop_playback()
        self.seek(target)

    # -- playback ------------------------------------------------------------------------------

    def _playback_status(self) -> str:
        if self.play_source is None:
            return ""
        speed = "fast" if self.speed > 1 else f"1{fmt.TIMES}"
        state = "▶" if self.playing else "⏸"
        if self.play_source == "cast" and self.cast is not None:
            return f"{state} terminal.cast {speed} {fmt.duration(self.play_clock)}/{fmt.duration(self.cast.duration)}"
        if not self.playing and self.at_end():
            return "■ end of the run (p plays again)"
        return f"{state} events {speed}"

    def action_play(self) -> None:
        if self.playing:
            self.playing = False
        elif self.play_source == "events" and not self.at_end():
            self.playing = True  # resume where it was paused (after the recording's end)
        else:
            if self.play_source is not None and self.at_end():
                self.notify("At the end of the run: playing again from the start.", timeout=3)
                self.play_source = None
            if not self.cast_checked and self.reader is not None:
                self.cast = self.reader.cast()
                self.cast_checked = True
            if self.cast is not None and self.cast.frames:
                if self.play_source != "cast" or self.play_frame >= len(self.cast.frames):
                    self.play_source = "cast"
                    self.play_clock = 0.0
                    self.play_frame = 0
                    self.terminal.cast_reset()
                self.terminal.view = "cast"
            else:
                if self.total == 0:
                    return
                start_idx = 0 if self.cursor is None or self.cursor >= self.total - 1 else self.cursor
                self.play_source = "events"
                self.play_clock = (self.ts[start_idx] - self.ts[0]).total_seconds()
                self.seek(start_idx)
            self.playing = True
        if self.playing:
            self._play_timer.resume()
        else:
            self._play_timer.pause()
        self.terminal.set_cast_status(self._playback_status())
        self.refresh_timeline()

    def action_fast(self) -> None:
        self.speed = 1.0 if self.speed > 1 else FAST
        self.terminal.set_cast_status(self._playback_status())
        self.refresh_timeline()

    def _continue_with_events(self) -> None:
        """The recording ends when the agent's terminal does; the run goes on (cleanup, verification,
        the outcome): playback continues through the events, from where the recording ended."""
        pos = 0 if self.cursor is None else self.cursor
        self.play_source = "events"
        self.play_clock = (self.ts[pos] - self.ts[0]).total_seconds() if self.total else 0.0
        # the terminal pane keeps showing the recording (it is complete); the panels follow the events
        if self.total == 0 or pos >= self.total - 1:
            self.playing = False

    def at_end(self) -> bool:
        return self.total > 0 and (self.cursor is None or self.cursor >= self.total - 1)

    def _stop_playback(self) -> None:
        if self.play_source is not None:
            self.playing = False
            self.play_source = None
            if self.terminal.view == "cast":
                self.terminal.view = "rendered"
            self.terminal.set_cast_status("")

    def _play_tick(self) -> None:
        if not self.playing:
            self._play_timer.pause()
            return
        dt = PLAY_TICK * self.speed
        if self.play_source == "cast" and self.cast is not None:
            frames = self.cast.frames
            if self.speed > 1 and self.play_frame < len(frames):
                gap = frames[self.play_frame][0] - self.play_clock
                if gap > FAST_GAP_S:
                    self.play_clock = frames[self.play_frame][0] - FAST_GAP_S
            self.play_clock += dt
            term = self.terminal
            i = self.play_frame
            while i < len(frames) and frames[i][0] <= self.play_clock:
                term.cast_feed(frames[i][1])
                i += 1
            self.play_frame = i
            term.refresh_content()
            cast_ended = i >= len(frames)
            start = self.cast.origin(self.info.started_at if self.info else self.state.start_time)
            if start is not None and self.total:
                t0 = self.ts[0]
                at = t0 + timedelta(seconds=start + self.play_clock - t0.timestamp())
                idx = bisect_right(self.ts, at) - 1
                if idx >= 0 and idx != self.cursor:
                    self.seek(idx)
            if cast_ended:
                self._continue_with_events()
            term.set_cast_status(self._playback_status())
            self.refresh_timeline()
        elif self.play_source == "events" and self.total:
            t0 = self.ts[0]
            pos = self.cursor or 0
            if self.speed > 1 and pos + 1 < self.total:
                gap = (self.ts[pos + 1] - t0).total_seconds() - self.play_clock
                if gap > FAST_GAP_S:
                    self.play_clock = (self.ts[pos + 1] - t0).total_seconds() - FAST_GAP_S
            self.play_clock += dt
            idx = max(bisect_right(self.ts, t0 + timedelta(seconds=self.play_clock)) - 1, 0)
            if idx >= self.total - 1:
                self.playing = False
                idx = self.total - 1
            if idx != self.cursor:
                self.seek(idx)
            else:
                self.refresh_timeline()
            status = self._playback_status()
            if status != self.terminal.cast_status:
                self.terminal.set_cast_status(status)

    # -- panel interactions --------------------------------------------------------------------

    @on(ModelCallsTable.Open)
    def open_call(self, message: ModelCallsTable.Open) -> None:
        self.app.push_screen(ModelCallScreen(message.call, self.bodies_dir))

    def action_inspect(self, tab: str = "cleanup") -> None:
        """The inspect screen, as of the timeline's cursor (live: now)."""
        view = self.view_state
        pos = self.total if self.cursor is None else self.cursor + 1
        cleanup = [
            e
            for i, e in zip(self.key_idx, self.key_evs, strict=True)
            if i < pos and isinstance(e, CleanupObserved)
        ]
        self.app.push_screen(
            InspectScreen(
                self.bodies_dir, cleanup=cleanup, verification=view.verification, info=self.info, tab=tab
            )
        )

    @on(CleanupPanel.Open)
    def on_cleanup_open(self) -> None:
        self.action_inspect("cleanup")

    @on(FailuresTable.Open)
    def open_failure(self, message: FailuresTable.Open) -> None:
        if isinstance(message.record, HealthWarning | SandboxFault):  # no cause chain: its words say it all
            w = message.record
            what = "health" if isinstance(w, HealthWarning) else f"kernel, {w.ts:%H:%M:%S}"
            self.notify(w.message, title=f"{what}: {w.kind.value}", severity="warning", timeout=8)
            return
        self.app.push_screen(FailureScreen(message.record), self.open_call_id)

    def open_call_id(self, call_id: str | None) -> None:
        """Open the model call ``call_id`` (a failure named it): the latest event for it."""
        if not call_id:
            return
        call = next((c for c in reversed(self.state.model_calls) if c.call_id == call_id), None)
        if call is None:
            self.notify(f"Model call {call_id} is not among this run's calls.", severity="warning", timeout=4)
            return
        self.query_one(ModelCallsTable).select_call(call_id)
        self.app.push_screen(ModelCallScreen(call, self.bodies_dir))

    def copy_target(self) -> tuple[str, str] | None:
        """What ``y`` copies here: the selected call's bodies, the selected failure, or the terminal."""
        focused = self.focused
        if isinstance(focused, ModelCallsTable) and focused.selected is not None:
            call = focused.selected
            where = self.bodies_dir
            record = RunDirReader(where, check=False).model_call(call.call_id) if where is not None else None
            data = json.loads(call.model_dump_json())
            data["record"] = record.model_dump(mode="json") if record is not None else "not recorded"
            return "model call", json.dumps(data, indent=2)
        if isinstance(focused, FailuresTable) and focused.selected is not None:
            return "failure", json.dumps(json.loads(focused.selected.model_dump_json()), indent=2)
        return "terminal", self.terminal.visible_text()

    # -- actions (shell/cancel/keep are asked of the app, which routes them to the control) -----

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in LIVE_ONLY and self.mode != "live":
            return False
        if action in REPLAY_ONLY and self.mode != "replay":
            return False
        if action == "panel":
            return bool(self.compact)
        if action == "back":
            return self.from_browser or self.play_source is not None
        # Actions that can no longer apply are hidden from the footer (False), not merely greyed: a
        # finished run's footer listed Shell, Cancel and Keep as if they still meant something.
        if action == "toggle_keep":
            control = self.control
            return not (control is not None and not control.keep_changeable)  # decided for good
        if action == "cancel_episode":
            return not self._episode_ended()  # after the outcome there is nothing left to cancel
        if action == "open_shell":
            # a replay's sandbox was released when its run ended; a live one's once cleanup released it
            return self.mode == "live" and not self._sandbox_released()
        return True

    def _episode_ended(self) -> bool:
        return self.state.finished or not self.tui.episode_running

    def _sandbox_released(self) -> bool:
        """The sandbox is gone (released and not kept): no shell can be opened in it any more."""
        seen = self.state.cleanup.get(CleanupStep.SANDBOX_RELEASED)
        if seen is None or seen.state is not StepState.OK:  # a failed release may have left it
            return False
        control = self.control
        return not (control is not None and control.kept)

    def _refresh_action_states(self) -> None:
        """Hide the actions that no longer apply as soon as the events say so (not on the next key)."""
        control = self.control
        key = (
            self._episode_ended(),
            self._sandbox_released(),
            control is not None and not control.keep_changeable,
        )
        if key != self._action_key:
            self._action_key = key
            self.refresh_bindings()

    def action_open_shell(self) -> None:
        self.post_message(ShellWanted(self.state.sandbox_id))

    def action_cancel_episode(self) -> None:
        self.post_message(CancelWanted())

    def action_toggle_keep(self) -> None:
        self.post_message(KeepToggleWanted())

    def action_back(self) -> None:
        if self.play_source is not None:
            self._stop_playback()
            self.refresh_timeline()
            return
        if self.from_browser:
            self.app.pop_screen()
