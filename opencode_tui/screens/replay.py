"""The replay run screen: a run directory's ``events.jsonl``, with the timeline (any event can be the
cursor: the panels then show the state folded up to it, the terminal the lines written up to it) and
playback (``terminal.cast``, then the events)."""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_right
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import ClassVar, cast

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType

from opencode_tui import format as fmt
from opencode_tui.feeds import EventIndex, LoadStats, iter_event_batches
from opencode_tui.lineage_request import LineageRequest
from opencode_tui.messages import EventsReceived, ReplayLoaded
from opencode_tui.screens.run import (
    FAST,
    FAST_GAP_S,
    PLAY_TICK,
    REDRAW_INTERVAL,
    REDRAW_INTERVAL_LOADING,
    REPLAY_BATCH,
    SHARED_BINDINGS,
    PaletteEntry,
    RunScreen,
)
from opencode_tui.state import RunState
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.timeline import Timeline
from opencode_tui_core.artifacts import Cast
from opencode_tui_core.events import (
    Compaction,
    Event,
    FailureRecorded,
    FailureRecovered,
    HealthWarning,
    Intervention,
    ModelCall,
    SandboxFault,
    ShellClosed,
    ShellOpened,
    ToolCall,
)


class ReplayRunScreen(RunScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
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
            tooltip="Replay: play/pause from the timeline's position (terminal.cast, then the events)",
            id="run.play",
        ),
        Binding(
            "S",
            "shell_replay",
            "Shells",
            show=False,
            tooltip="Replay: play a person's shell (shells/shell-N.cast), what was typed included",
            id="run.shell-replay",
        ),
        Binding(
            "f",
            "fast",
            "Fast",
            tooltip=f"Replay: toggle 1{fmt.TIMES} / fast playback (idle gaps skipped)",
            id="run.fast",
        ),
        Binding(
            "R",
            "lineage_rerun",
            "Rerun",
            show=False,  # (the footer is full: the help and the palette list it)
            tooltip="Rerun this run live, every model call answered from its record",
            id="run.rerun",
        ),
        Binding(
            "F",
            "fork",
            "Fork",
            show=False,
            tooltip="Fork this run at the selected model call (or the timeline's): the record up to it, "
            "then a model",
            id="run.fork",
        ),
        *SHARED_BINDINGS,
    ]
    mode = "replay"

    def __init__(self, run_dir: Path, *, from_browser: bool = False) -> None:
        super().__init__(run_dir, from_browser=from_browser)
        assert self.reader is not None
        self.index = EventIndex(self.reader.events_path)
        self.replay_loading = True
        self.load_stats = LoadStats()
        self.load_seconds: float | None = None
        self.failure_idx: list[int] = []
        self.markers: dict[str, list[int]] = {
            "model_call": [],
            "tool_call": [],
            "compaction": [],
            "shell": [],
            "subagent": [],
            "health": [],
            "fault": [],
            "intervention": [],
        }
        self._marked_calls: set[tuple[str, str]] = set()  # a call is marked where it first appears
        # playback
        self.cast: Cast | None = None
        self.cast_checked = False
        self.playing = False
        self.speed = 1.0
        self.play_clock = 0.0
        self.play_frame = 0
        self.play_source: str | None = None  # "cast" | "events"

    def compose_below(self) -> ComposeResult:
        yield Timeline(id="timeline")

    def start(self) -> None:
        self._load_replay()
        self.refresh_timeline()
        self._play_timer = self.set_interval(PLAY_TICK, self._play_tick, pause=True)

    def header_mode(self) -> str:
        return f"REPLAY {self.run_dir.name if self.run_dir else ''}".strip()

    def redraw_interval(self) -> float:
        return REDRAW_INTERVAL_LOADING if self.replay_loading else REDRAW_INTERVAL

    def pending_max_age(self) -> float:
        # once all is read, nothing more can follow a held-back event: show it now
        return super().pending_max_age() if self.replay_loading else 0.0

    def can_go_back(self) -> bool:
        return self.from_browser or self.play_source is not None

    def palette_entries(self) -> Iterable[PaletteEntry]:
        entries = [
            PaletteEntry("Play terminal recording", "Play/pause from the cursor (p)", "play"),
            PaletteEntry("Fast playback", f"Toggle 1{fmt.TIMES} / fast playback (f)", "fast"),
            PaletteEntry("Next failure", "Jump the timeline to the next failure (n)", "next_failure"),
        ]
        if self.state.shells:  # no shell, nothing to play: not offered
            entries.append(
                PaletteEntry(
                    "Play a shell",
                    "A person's shell in the sandbox, what was typed included (S)",
                    "shell_replay",
                )
            )
        return entries

    # -- the source ------------------------------------------------------------------------------

    @work(exclusive=True, group="replay-load")
    async def _load_replay(self) -> None:
        """Read events.jsonl in batches on the event loop, yielding between batches.

        (A thread would decode in parallel in theory, but under the GIL a busy decoder thread makes
        every wake-up of the event loop wait for the interpreter lock: on the loop, in small batches,
        the whole load is faster and the screen stays responsive.)
        """
        assert self.reader is not None
        start = time.perf_counter()
        for batch in iter_event_batches(self.reader.events_path, self.index, REPLAY_BATCH, self.load_stats):
            self.post_message(EventsReceived(batch, "replay"))
            await asyncio.sleep(0)
        self.post_message(
            ReplayLoaded(self.load_stats.events, time.perf_counter() - start, self.load_stats.bad_lines)
        )

    def index_keys(self, events: list[Event], keys: list[int], base: int) -> None:
        markers = self.markers
        for index in keys:
            ev = events[index - base]
            kind = type(ev)
            if kind is FailureRecorded:
                self.failure_idx.append(index)
            elif kind is Compaction:
                markers["compaction"].append(index)
            elif kind is ShellOpened or kind is ShellClosed:
                markers["shell"].append(index)
            elif kind is HealthWarning:
                markers["health"].append(index)
            elif kind is SandboxFault:
                markers["fault"].append(index)
            elif kind is Intervention:
                markers["intervention"].append(index)
            elif kind is ModelCall or kind is ToolCall:
                marker = "model_call" if kind is ModelCall else "tool_call"
                call_id = cast("ModelCall | ToolCall", ev).call_id  # (``type() is``: the fast test)
                if (marker, call_id) not in self._marked_calls:
                    self._marked_calls.add((marker, call_id))
                    markers[marker].append(index)
                    if kind is ModelCall and self.state.tally.subagent_call(cast("ModelCall", ev)):
                        markers["subagent"].append(index)

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

    def redraw(self) -> None:
        super().redraw()
        self.refresh_timeline()

    def refresh_timeline(self) -> None:
        timeline = self.query_one(Timeline)
        pos = self.total - 1 if self.cursor is None else self.cursor
        summary, when = "", ""
        if pos >= 0:
            ev = self.index.event_at(pos)
            if ev is not None:
                summary = fmt.summarize(ev, in_batch=bool(self.info and self.info.batch_id))
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
        self._panels_dirty = False
        if index is None:
            term.set_limit(None)
            self.view_state = self.state
        else:
            k = bisect_right(self.key_idx, index)
            view = RunState.fold(self.key_evs[:k], info=self.info)
            view.last_ts = self.ts[index]
            if view.first_ts is None:
                view.first_ts = self.ts[0]
            term.set_limit(term.marks[index])
            self.view_state = view
        self.refresh_timeline()
        if index is not None:
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

    @on(Timeline.Open)
    def on_timeline_open(self, message: Timeline.Open) -> None:
        """Enter on the timeline: a tool call's step, a model call, a shell's recording."""
        ev = self.index.event_at(self.total - 1 if self.cursor is None else self.cursor)
        if isinstance(ev, ToolCall):
            self.open_step(ev.call_id)
        elif isinstance(ev, ModelCall):
            self.open_call_id(ev.call_id)
        elif isinstance(ev, ShellOpened | ShellClosed):
            self.open_shell_replay(ev.shell)
        else:
            what = fmt.summarize(ev) if ev is not None else "nothing"
            self.notify(
                f"Enter opens a tool call, a model call or a shell (o, m, h jump to one); here: {what}",
                timeout=4,
            )

    def action_shell_replay(self) -> None:
        """The shell at or before the cursor (else the first): its recording played."""
        shells = self.state.shells
        if not shells:
            self.notify("No shell was opened in this run.", timeout=3)
            return
        pos = self.total - 1 if self.cursor is None else self.cursor
        before = [i for i in self.markers["shell"] if i <= pos]
        ev = self.index.event_at(before[-1]) if before else None
        self.open_shell_replay(ev.shell if isinstance(ev, ShellOpened | ShellClosed) else shells[0].shell)

    def open_shell_replay(self, n: int) -> None:
        opened = next((s for s in self.state.shells if s.shell == n), None)
        if opened is None or self.reader is None:
            self.notify(f"Shell {n} is not in this run's events.", severity="warning", timeout=4)
            return
        from opencode_tui.screens.shell_replay import ShellReplayScreen

        closed = next((e for e in self.key_evs if isinstance(e, ShellClosed) and e.shell == n), None)
        self._stop_playback()
        self.app.push_screen(ShellReplayScreen(opened, self.reader.shell_cast(opened), closed))

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
            if self.total == 0 and not (self.cast is not None and self.cast.frames):
                return
            # From the cursor (the timeline's position); from the start when it follows the end.
            start_idx = 0 if self.cursor is None or self.cursor >= self.total - 1 else self.cursor
            fresh = (
                self.play_source != "cast" or self.cast is None or self.play_frame >= len(self.cast.frames)
            )
            if self.cast is not None and self.cast.frames and (not fresh or self._cast_from(start_idx)):
                self.terminal.view = "cast"
            else:  # no recording, or the cursor is past its end: the events from the cursor
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

    def _cast_from(self, index: int) -> bool:
        """Start the recording at event ``index``'s time: the frames before it drawn at once (the
        screen as it was then). False when that time is past the recording's end."""
        assert self.cast is not None
        clock = 0.0
        origin = self.cast.origin(self.info.started_at if self.info else self.state.start_time)
        if index > 0 and origin is not None and self.total:
            clock = max(self.ts[index].timestamp() - origin, 0.0)
        frames = self.cast.frames
        if clock > self.cast.duration:
            return False
        self.play_source = "cast"
        self.play_clock = clock
        self.terminal.cast_reset()
        i = 0
        while i < len(frames) and frames[i][0] <= clock:
            self.terminal.cast_feed(frames[i][1])
            i += 1
        self.play_frame = i
        return True

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
        if self.play_source == "cast" and self.cast is not None:
            self._play_cast(self.cast)
        elif self.play_source == "events" and self.total:
            self._play_events()

    def _play_cast(self, cast: Cast) -> None:
        """One tick of ``terminal.cast``: its frames up to the clock, and the cursor at the same time."""
        frames = cast.frames
        if self.speed > 1 and self.play_frame < len(frames):
            gap = frames[self.play_frame][0] - self.play_clock
            if gap > FAST_GAP_S:
                self.play_clock = frames[self.play_frame][0] - FAST_GAP_S
        self.play_clock += PLAY_TICK * self.speed
        term = self.terminal
        i = self.play_frame
        while i < len(frames) and frames[i][0] <= self.play_clock:
            term.cast_feed(frames[i][1])
            i += 1
        self.play_frame = i
        term.refresh_content()
        cast_ended = i >= len(frames)
        start = cast.origin(self.info.started_at if self.info else self.state.start_time)
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

    def _play_events(self) -> None:
        """One tick of playing the events themselves (no recording, or after its end)."""
        t0 = self.ts[0]
        pos = self.cursor or 0
        if self.speed > 1 and pos + 1 < self.total:
            gap = (self.ts[pos + 1] - t0).total_seconds() - self.play_clock
            if gap > FAST_GAP_S:
                self.play_clock = (self.ts[pos + 1] - t0).total_seconds() - FAST_GAP_S
        self.play_clock += PLAY_TICK * self.speed
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

    # -- rerun and fork (issue 28): the app closes with the request; the command runs it live ---------

    @property
    def _path(self) -> Path:
        assert self.run_dir is not None  # a replay always has its run directory
        return self.run_dir

    def action_lineage_rerun(self) -> None:
        self._request(LineageRequest(run_dir=self._path, lineage="rerun"))

    def _request(self, request: LineageRequest) -> None:
        if self.app.read_only:  # type: ignore[attr-defined]
            self.notify("Reruns and forks are off here (a read-only session).", timeout=4)
            return
        if self.app.served:  # type: ignore[attr-defined]
            # A browser session is this one app: the child runs in it and comes back to the browser.
            self.app.run_here(self._path, request)  # type: ignore[attr-defined]
            return
        self.app.lineage_request = request  # type: ignore[attr-defined]
        self.app.exit()

    def fork_step(self) -> tuple[int | None, int]:
        """The agent step to fork at (the selected model call's, or the last one at the timeline's
        cursor when the timeline has the focus) and how many agent steps the run made."""
        agent = sorted(
            (c for c in self.state.model_calls if c.kind == "agent"), key=lambda c: (c.started_at, c.seq)
        )
        ids = [c.call_id for c in agent]
        if isinstance(self.focused, Timeline):
            seen = {c.call_id for c in self.view_state.model_calls}
            return (sum(1 for i in ids if i in seen) or None), len(ids)
        call = self.query_one(ModelCallsTable).selected
        if call is None:
            return None, len(ids)
        if call.call_id in ids:
            return ids.index(call.call_id) + 1, len(ids)
        # a title or compaction call: the agent calls made before it
        return (sum(1 for c in agent if c.started_at <= call.started_at) or None), len(ids)

    def action_fork(self) -> None:
        from opencode_tui.screens.fork import ForkScreen

        step, steps = self.fork_step()
        if steps < 2:
            self.notify("This run made fewer than two agent model calls: nothing to fork from.", timeout=4)
            return
        if step is None or not 1 <= step < steps:
            self.notify(
                f"Select a model call (agent step 1 to {steps - 1}) in the model calls table or on the "
                "timeline, then press F.",
                timeout=5,
            )
            return

        from opencode_tui_core.artifacts import RunDirReader
        from opencode_tui_core.episode import fork_point

        # a cut or failed recorded answer at (or a cut one before) the step: the fork starts earlier
        point = fork_point(RunDirReader(self._path).model_calls(), step)
        if point.step == 0:
            self.notify(f"No fork: {point.why}; R reruns the run instead.", severity="error", timeout=8)
            return

        def chosen(request: LineageRequest | None) -> None:
            if request is not None:
                self._request(request)

        request = LineageRequest(run_dir=self._path, lineage="fork", at=step)
        self.app.push_screen(ForkScreen(request, steps, start=point.step, moved=point.why), chosen)

    def action_back(self) -> None:
        if self.play_source is not None:
            self._stop_playback()
            self.refresh_timeline()
            return
        super().action_back()
