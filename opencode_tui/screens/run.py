"""What the live and replay run screens share: the panels and their layout, search, panel switching,
the one event-handling path and the redraw.

Both sources deliver :class:`EventsReceived` batches to :meth:`RunScreen.on_events_received`: the
terminal pane ingests the batch, :class:`RunState` folds it, and the panels are redrawn once per batch.
State flows down: the screen's ``view_state`` (the run as of the cursor; live: now) is bound into every
panel that shows it (``data_bind``, the panel protocol in ``widgets/base.py``); messages flow up.

The two screens are :class:`opencode_tui.screens.live.LiveRunScreen` (an episode's bus) and
:class:`opencode_tui.screens.replay.ReplayRunScreen` (a run directory, with the timeline and playback);
each adds only its own keys, sources and drawing to what is here. The panels are listed once, in
``opencode_tui.panels``.
"""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import on
from textual.actions import parse as parse_action
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Footer

from opencode_tui.messages import EventsReceived, ShellWanted
from opencode_tui.panels import RUN_PANELS, Region, panel_spec
from opencode_tui.screens.inspect import InspectScreen
from opencode_tui.screens.modals import FailureScreen, ModelCallScreen
from opencode_tui.screens.step import StepScreen
from opencode_tui.screens.warning_detail import WarningDetailScreen
from opencode_tui.state import RunState
from opencode_tui.widgets.base import ShowsRunState
from opencode_tui.widgets.cleanup import CleanupPanel
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.findbar import FindBar
from opencode_tui.widgets.header import RunHeader
from opencode_tui.widgets.held_bar import HeldBar
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.progress import InstallProgressBar, WarningsBar
from opencode_tui.widgets.tabs import PANELS, PanelTabs, is_compact
from opencode_tui.widgets.terminal import TerminalView
from opencode_tui_core.artifacts import RunDirReader, RunInfo
from opencode_tui_core.diff import episode_steps
from opencode_tui_core.events import (
    CleanupObserved,
    Event,
    FailureRecorded,
    HealthWarning,
    SandboxFault,
    ToolCall,
)

if TYPE_CHECKING:
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

# The keys both screens have, after their own (the footer lists a screen's keys in this order).
SHARED_BINDINGS: list[Binding] = [
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


@dataclass(frozen=True)
class PaletteEntry:
    """A command palette entry for a screen's key: offered only while the key applies."""

    title: str
    help: str
    action: str  # exactly as the screen's binding spells it


def clock_now() -> datetime:
    """The live header's clock (the snapshot tests freeze it here)."""
    return datetime.now(UTC)


class RunScreen(Screen[None]):
    """One episode on screen. Not used on its own: a live or a replay screen adds its source."""

    BINDINGS: ClassVar[list[BindingType]] = []
    mode: ClassVar[str]  # "live" | "replay": a label (tests, the palette), never a branch here

    # The run as of the cursor (live: now), bound into every panel that shows it (ShowsRunState).
    # always_update: it is folded in place, so the same object is still news.
    view_state: reactive[RunState] = reactive(RunState, init=False, always_update=True, repaint=False)
    # Live: bound to the app's one keep state (``OpenCodeTUI.keep``); None in a replay (nothing to keep).
    keep: reactive[bool | None] = reactive(None, init=False)

    def __init__(self, run_dir: Path | None, *, from_browser: bool = False) -> None:
        super().__init__()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.reader = RunDirReader(self.run_dir, check=False) if self.run_dir is not None else None
        self.from_browser = from_browser
        self.info: RunInfo | None = self.reader.info_or_none() if self.reader is not None else None
        self.state = RunState(info=self.info)
        self.set_reactive(RunScreen.view_state, self.state)
        self.total = 0
        self.ts: list[datetime] = []
        self.key_idx = array("q")
        self.key_evs: list[Event] = []
        self.cursor: int | None = None  # the replay timeline's; None: the latest state, following
        self.compact: bool | None = None  # one panel at a time (a small terminal); None: not laid out yet
        self.panel = PANELS[0][0]  # the panel shown when compact
        self._bindings_pending = False  # a footer update is scheduled (refresh_bindings)
        self._redrawn_at = 0.0
        self._redraw_timer: Timer | None = None
        self._panels_dirty = False

    # -- what a live or replay screen adds ----------------------------------------------------------

    def compose_below(self) -> ComposeResult:
        """Widgets under the panels (the replay's timeline)."""
        yield from ()

    def start(self) -> None:
        """Start the source of events (called once the panels are mounted)."""

    def take_batch(self, message: EventsReceived) -> None:
        self.ingest(message.events)

    def header_mode(self) -> str:
        raise NotImplementedError

    def header_now(self) -> datetime | None:
        """The header's "now" (None: elapsed up to the last event)."""
        return None

    def redraw_interval(self) -> float:
        return REDRAW_INTERVAL

    def pending_max_age(self) -> float:
        return PENDING_MAX_AGE

    def can_go_back(self) -> bool:
        return self.from_browser

    def palette_entries(self) -> Iterable[PaletteEntry]:
        """The command palette's entries for this screen's own keys."""
        return ()

    def palette_commands(self) -> Iterator[SystemCommand]:
        """This screen's entries of the command palette: the ones whose key the footer offers now (one
        source of truth: the key is bound here and ``check_action`` allows it), so the palette never
        offers what the key would not do."""
        for entry in self.palette_entries():
            if self.action_applies(entry.action):
                yield SystemCommand(entry.title, entry.help, partial(self.run_action, entry.action))

    def action_applies(self, action: str) -> bool:
        """The action is bound to a key of this screen and ``check_action`` allows it (False hides the
        key from the footer, None greys it out: neither applies)."""
        _, name, params = parse_action(action)
        bound = any(b.action == action for bs in self._bindings.key_to_bindings.values() for b in bs)
        return bound and self.check_action(name, params) is True

    # -- layout --------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header").data_bind(keep=RunScreen.keep)
        yield HeldBar(id="held-bar", live=self.mode == "live").data_bind(RunScreen.view_state)
        yield WarningsBar(id="warnings").data_bind(RunScreen.view_state)
        yield InstallProgressBar(id="install")
        yield PanelTabs(id="tabs")
        with Horizontal(id="main"):
            yield from self._compose_region("main")
            with Vertical(id="side"):
                yield from self._compose_region("side")
        with Horizontal(id="bottom"):
            yield from self._compose_region("bottom")
        yield from self.compose_below()
        yield Footer()

    def _compose_region(self, region: Region) -> Iterable[Widget]:
        for spec in RUN_PANELS:
            if spec.region != region:
                continue
            widget = spec.widget(id=spec.id)
            if spec.border_title is not None:
                widget.border_title = spec.border_title
            if isinstance(widget, ShowsRunState):
                widget.data_bind(RunScreen.view_state)
            if spec.bar is None:
                yield widget
                continue
            with Vertical(id=spec.pane):
                yield widget
                yield FindBar(placeholder=spec.bar.placeholder, id=spec.bar.id)

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
        shown = panel_spec(self.panel)
        for spec in RUN_PANELS:
            self.query_one(f"#{spec.id}").display = not compact or spec is shown
            if spec.pane != spec.id:
                self.query_one(f"#{spec.pane}").display = not compact or spec is shown
        self.query_one("#main").display = not compact or shown.region in ("main", "side")
        self.query_one("#side").display = not compact or shown.region == "side"
        self.query_one("#bottom").display = not compact or shown.region == "bottom"
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

    @on(PanelTabs.Selected)
    def on_panel_selected(self, message: PanelTabs.Selected) -> None:
        self.action_panel(message.panel)

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
        """Where ``model_calls.jsonl`` is (the run directory)."""
        return self.run_dir

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

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._on_theme_changed)
        self._apply_layout()
        self.refresh_panels()
        self.terminal.focus()
        self.start()

    def _on_theme_changed(self, _theme: object) -> None:
        self.query_one(ModelCallsTable).sync(
            self.view_state.model_calls, self.view_state.start_time, force=True
        )
        self.query_one(FailuresTable).sync(self.view_state.problems, force=True)

    # -- the one event-handling path -----------------------------------------------------------

    @on(EventsReceived)
    def on_events_received(self, message: EventsReceived) -> None:
        self.take_batch(message)

    def ingest(self, events: list[Event]) -> None:
        if not events:
            return
        self.terminal.ingest(events)
        base = self.total
        self.ts.extend(ev.ts for ev in events)
        keys = self.state.apply_batch(events, base)
        self.total += len(events)
        for index in keys:
            self.key_idx.append(index)
            self.key_evs.append(events[index - base])
        self.index_keys(events, keys, base)
        self._panels_dirty = self._panels_dirty or bool(keys)
        self._redraw_soon()

    def index_keys(self, events: list[Event], keys: list[int], base: int) -> None:
        """Note a batch's key events (stream indices ``keys``; ``events[i - base]``) for the timeline."""

    # -- drawing -------------------------------------------------------------------------------

    def _redraw_soon(self) -> None:
        """Redraw after new events at most every redraw interval (a trailing timer draws the last batch):
        a repaint costs far more than ingesting a batch, so batches are coalesced here too."""
        interval = self.redraw_interval()
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
        if self.terminal.flush_pending(older_than=self.pending_max_age()):
            self._redraw_timer = self.set_timer(PENDING_MAX_AGE, self.redraw)  # show it if nothing follows
        if self.cursor is None:
            self.terminal.refresh_content()
            if self._panels_dirty:
                self.refresh_panels()
            else:
                self.redraw_unchanged()

    def redraw_unchanged(self) -> None:
        """A redraw that brought no key event (the live header's counts and clock still move)."""

    def refresh_panels(self) -> None:
        """Redraw every panel from ``view_state`` (its bound panels, then the bars)."""
        self._panels_dirty = False
        self.mutate_reactive(RunScreen.view_state)

    def watch_view_state(self, state: RunState) -> None:
        # the bound panels draw themselves; the header, the bars and the tabs are drawn here
        self.refresh_action_states()
        self.show_header()
        self.query_one(InstallProgressBar).show(state, compact=bool(self.compact))
        if self.compact:
            self._show_tabs()

    def show_header(self) -> None:
        self.query_one(RunHeader).show(self.view_state, mode=self.header_mode(), now=self.header_now())

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
        if isinstance(message.record, HealthWarning | SandboxFault):
            calls = {c.call_id for c in self.state.model_calls}
            self.app.push_screen(WarningDetailScreen(message.record, calls), self.open_call_id)
            return
        in_batch = bool(self.info and self.info.batch_id)
        self.app.push_screen(FailureScreen(message.record, in_batch), self.open_call_id)

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

    # -- a step in full (Enter on a tool call: the terminal pane, the replay's timeline) ------------

    def open_step(self, call_id: str) -> None:
        """The tool call ``call_id`` in full: as it ended, wherever the timeline's cursor is (live: as far
        as it got); ``m`` there opens its model call."""
        step = next(
            (s for s in episode_steps(self.key_evs) if s.kind == "tool_call" and s.call_id == call_id), None
        )
        if step is None:
            self.notify(f"Tool call {call_id} is not among this run's events.", severity="warning", timeout=4)
            return
        asked = next((c for c in self.state.model_calls if c.call_id == step.asked_by), None)
        self.app.push_screen(StepScreen(step, asked, self.state.start_time), self.open_call_id)

    @on(TerminalView.StepWanted)
    def on_terminal_step_wanted(self, message: TerminalView.StepWanted) -> None:
        """Enter in the terminal pane: the latest tool call that began on or above the pane's last line."""
        marks = self.terminal.marks
        # (the raw and cast views' lines are not the rendered ones: there, the latest tool call)
        line = message.line if self.terminal.view == "rendered" else None
        pos = self.total if self.cursor is None else self.cursor + 1
        found: str | None = None
        seen: set[str] = set()
        for i, ev in zip(self.key_idx, self.key_evs, strict=True):
            if i >= pos or (line is not None and i < len(marks) and (marks[i - 1] if i else 0) > line):
                break
            if isinstance(ev, ToolCall) and ev.call_id not in seen:
                seen.add(ev.call_id)
                found = ev.call_id
        if found is None:
            self.notify("No tool call on screen here (scroll to one, then Enter).", timeout=3)
            return
        self.open_step(found)

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

    # -- actions -------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "panel":
            return bool(self.compact)
        if action == "back":
            return self.can_go_back()
        return True

    def refresh_action_states(self) -> None:
        """Hide the actions that no longer apply as soon as the events say so (the live screen's)."""

    def action_open_shell(self) -> None:
        """Asked of the app, which opens it in the live sandbox or says why not."""
        self.post_message(ShellWanted(self.state.sandbox_id))

    def action_back(self) -> None:
        if self.from_browser:
            self.app.pop_screen()
