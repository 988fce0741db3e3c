"""The live run screen: a running episode's events from its bus (``EpisodeControl.bus``), with the keys
that act on it (shell, cancel, keep)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.binding import Binding, BindingType

from core.events import CleanupStep, Event, StepState, TerminalOutput
from opencode_tui.messages import CancelWanted, EventsReceived, KeepToggleWanted
from opencode_tui.screens import run
from opencode_tui.screens.run import (
    LIVE_BATCH_CHARS_MAX,
    LIVE_BATCH_CHARS_MIN,
    LIVE_BATCH_EVENTS,
    LIVE_BATCH_INTERVAL,
    LIVE_HANDOFF_DEADLINE_S,
    LIVE_SLICE_S,
    SHARED_BINDINGS,
    PaletteEntry,
    RunScreen,
)

if TYPE_CHECKING:
    from core.control import EpisodeControl


class LiveRunScreen(RunScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
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
        *SHARED_BINDINGS,
    ]
    mode = "live"

    def __init__(
        self, control: EpisodeControl, run_dir: Path | None = None, *, from_browser: bool = False
    ) -> None:
        super().__init__(run_dir, from_browser=from_browser)
        self.control = control
        self._action_key: tuple[bool, bool, bool] | None = None
        # one batch handed over at a time, sized by the measured ingest rate
        self._batch_taken = asyncio.Event()
        self._batch_chars = 256 * 1024
        self._ingest_rate: float | None = None

    def start(self) -> None:
        self.watch(self.tui, "episode_done", self._on_episode_done, init=False)
        self._live_feed()
        self.set_interval(1.0, self.show_header)  # elapsed time

    @property
    def bodies_dir(self) -> Path | None:
        """The live episode's run directory (the control's ``run_dir``: a path, or a
        ``core.artifacts.RunDir`` once the episode has created it)."""
        if self.run_dir is not None:
            return self.run_dir
        found = getattr(self.control, "run_dir", None)
        if found is None or isinstance(found, str | Path):
            return Path(found) if found is not None else None
        path = getattr(found, "path", None)
        return Path(path) if path is not None else None

    def header_mode(self) -> str:
        return "LIVE"

    def header_now(self) -> datetime | None:
        return None if self.view_state.finished else run.clock_now()

    def redraw_unchanged(self) -> None:
        self.show_header()

    def _on_episode_done(self, done: bool) -> None:
        if done:
            self.show_header()
            self.refresh_action_states()

    # -- the feed ------------------------------------------------------------------------------

    @work(exclusive=True, group="live-feed")
    async def _live_feed(self) -> None:
        """Drain the bus queue into batches: at most one batch per LIVE_BATCH_INTERVAL while output is
        sparse; under a flood, one slice of ingest work per turn of the event loop.

        Two things keep keys quick while megabytes stream in. A batch is sized to about LIVE_SLICE_S of
        ingest (the rate is measured by :meth:`take_batch`; batches of up to 2 MB held the loop 10-20 ms
        each). And only one batch is in the screen's message queue at a time: a screen drains its whole
        queue in one go, and a key press bubbles through the screen on its way to the bindings, so
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

    def take_batch(self, message: EventsReceived) -> None:
        start = time.perf_counter()
        self.ingest(message.events)
        self._measure_ingest(message.events, time.perf_counter() - start)
        self._batch_taken.set()

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

    # -- actions (shell/cancel/keep are asked of the app, which routes them to the control) -----

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Actions that can no longer apply are hidden from the footer (False), not merely greyed: a
        # finished run's footer listed Shell, Cancel and Keep as if they still meant something.
        if action == "toggle_keep":
            return bool(self.control.keep_changeable)  # else decided for good
        if action == "cancel_episode":
            return not self._episode_ended()  # after the outcome there is nothing left to cancel
        if action == "open_shell":
            # a live sandbox can be shelled into until cleanup released it
            return not self._sandbox_released()
        return super().check_action(action, parameters)

    def _episode_ended(self) -> bool:
        return self.state.finished or not self.tui.episode_running

    def _sandbox_released(self) -> bool:
        """The sandbox is gone (released and not kept): no shell can be opened in it any more."""
        seen = self.state.cleanup.get(CleanupStep.SANDBOX_RELEASED)
        if seen is None or seen.state is not StepState.OK:  # a failed release may have left it
            return False
        return not self.control.kept

    def refresh_action_states(self) -> None:
        """Hide the actions that no longer apply as soon as the events say so (not on the next key)."""
        key = (self._episode_ended(), self._sandbox_released(), not self.control.keep_changeable)
        if key != self._action_key:
            self._action_key = key
            self.refresh_bindings()

    def action_back(self) -> None:
        """Esc on a run the runs browser started: back to the browser, as `q` goes (it asks first while
        the episode runs, and the app waits for its cleanup)."""
        if self.from_browser:
            self.app.call_next(self.app.run_action, "app.request_quit")

    def action_cancel_episode(self) -> None:
        self.post_message(CancelWanted())

    def action_toggle_keep(self) -> None:
        self.post_message(KeepToggleWanted())

    def palette_entries(self) -> Iterable[PaletteEntry]:
        return (
            PaletteEntry("Open shell", "Interactive shell in the sandbox (s)", "open_shell"),
            PaletteEntry("Cancel episode", "Stop the agent; cleanup is confirmed (c)", "cancel_episode"),
            PaletteEntry("Keep sandbox", "Toggle keeping the sandbox after the run (k)", "toggle_keep"),
        )
