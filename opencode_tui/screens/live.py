"""The live run screen: a running episode's events from its bus (``EpisodeControl.bus``), with the keys
that act on it (shell, cancel, keep) and on its agent through the debugger (issue 27: break, continue,
step, say, answer, edit, abort; the held request in the call view)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from textual import work
from textual.binding import Binding, BindingType

from opencode_tui import debug_acts
from opencode_tui.messages import CancelWanted, EventsReceived, KeepToggleWanted, RerunWanted
from opencode_tui.screens import run
from opencode_tui.screens.debug_input import DebugInputScreen
from opencode_tui.screens.modals import ConfirmScreen, ModelCallScreen
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
from opencode_tui_core.calls.records import ModelCallRecord
from opencode_tui_core.debugger.protocol import CtlReply, CtlRequest
from opencode_tui_core.events import CleanupStep, Event, Intervention, StepState, TerminalOutput
from opencode_tui_core.model import HandAnswer, answer_json

if TYPE_CHECKING:
    from opencode_tui_core.control import EpisodeControl


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
        # Once the run has ended (check_action), over the terminal pane's `r` (raw, while it runs; the
        # palette's "Raw output" after): the task again, in a sandbox prepared ahead when one matches.
        Binding(
            "r",
            "rerun",
            "Re-run",
            tooltip="Run the task again with its recorded configuration",
            priority=True,
            id="run.rerun",
        ),
        # The debugger's keys (issue 27), only when they apply (check_action); the held bar lists the
        # ones for a held call (the footer has no room for them at 80 columns).
        Binding("b", "debug_break", "Break", tooltip="Hold the agent's next model call", id="debug.break"),
        Binding(
            "g",
            "debug_continue",
            "Continue",
            tooltip="Send the held call; run to the next break",
            show=False,
            id="debug.continue",
        ),
        Binding(
            "n",
            "debug_step",
            "Step",
            tooltip="Send the held call; hold the one after it",
            show=False,
            id="debug.step",
        ),
        Binding(
            "h",
            "debug_held",
            "Held call",
            tooltip="The held request as a conversation",
            show=False,
            id="debug.held",
        ),
        Binding(
            "m",
            "debug_say",
            "Say",
            tooltip="Add a user message OpenCode takes into its next turn",
            show=False,
            id="debug.say",
        ),
        Binding(
            "a",
            "debug_answer",
            "Answer",
            tooltip="Write the model's reply by hand (text or a tool call)",
            show=False,
            id="debug.answer",
        ),
        Binding(
            "e",
            "debug_edit",
            "Edit reply",
            tooltip="Send the held call, then edit the model's reply before OpenCode sees it",
            show=False,
            id="debug.edit",
        ),
        Binding(
            "x",
            "debug_abort",
            "Abort turn",
            tooltip="Stop the agent's current turn or running tool",
            id="debug.abort",
        ),
        *SHARED_BINDINGS,
    ]
    mode = "live"

    def __init__(
        self,
        control: EpisodeControl,
        run_dir: Path | None = None,
        *,
        from_browser: bool = False,
        in_batch: bool = False,
    ) -> None:
        # in_batch: one attempt of the batch screen's; Esc goes back to it and the episode runs on
        super().__init__(run_dir, from_browser=from_browser or in_batch)
        self.in_batch = in_batch
        self.control = control
        self._action_key: tuple[bool, bool, bool, str | None] | None = None
        # one batch handed over at a time, sized by the measured ingest rate
        self._batch_taken = asyncio.Event()
        self._batch_chars = 256 * 1024
        self._ingest_rate: float | None = None
        self._edit_asked = False  # this TUI asked for `edit`: the held reply opens in the edit box

    def start(self) -> None:
        self.watch(self.tui, "episode_done", self._on_episode_done, init=False)
        self._live_feed()
        self.set_interval(1.0, self.show_header)  # elapsed time

    @property
    def bodies_dir(self) -> Path | None:
        """The live episode's run directory (the control's ``run_dir``: a path, or a
        ``opencode_tui_core.artifacts.RunDir`` once the episode has created it)."""
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
        if action == "rerun":
            return not self.in_batch and not self.tui.episode_running and self.tui.can_rerun
        if action == "open_shell":
            # a live sandbox can be shelled into until cleanup released it
            return not self._sandbox_released()
        if action.startswith("debug_"):
            return self._debug_applies(action)
        return super().check_action(action, parameters)

    def _debug_applies(self, action: str) -> bool:
        if self._episode_ended():
            return False
        held = self.state.held
        if action == "debug_break":
            return held is None and self._agent_to_come()
        if action == "debug_abort":
            return self._agent_running()
        if action == "debug_answer":
            return held is not None and held.what == "break"
        return held is not None  # continue, step, say, edit, the held call: while a call is held

    def _agent_to_come(self) -> bool:
        """The agent runs, or will: a break can still hold one of its calls."""
        phase = self.state.phase
        return phase is None or str(phase.phase) in ("admission", "seed", "install", "agent")

    def _agent_running(self) -> bool:
        phase = self.state.phase
        return phase is not None and str(phase.phase) == "agent"

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
        held = self.state.held
        key = (
            self._episode_ended(),
            self._sandbox_released(),
            not self.control.keep_changeable,
            None if held is None else held.what,
        )
        if key != self._action_key:
            self._action_key = key
            self.refresh_bindings()

    def action_back(self) -> None:
        """Esc on an attempt opened from the batch screen: back to it (the episode runs on). On a run the
        runs browser started: back to the browser, as `q` goes (it asks first while the episode runs,
        and the app waits for its cleanup)."""
        if self.in_batch:
            self.app.pop_screen()
        elif self.from_browser:
            self.app.call_next(self.app.run_action, "app.request_quit")

    def action_cancel_episode(self) -> None:
        self.post_message(CancelWanted())

    def action_toggle_keep(self) -> None:
        self.post_message(KeepToggleWanted())

    def action_rerun(self) -> None:
        self.post_message(RerunWanted())

    def palette_entries(self) -> Iterable[PaletteEntry]:
        return (
            PaletteEntry("Open shell", "Interactive shell in the sandbox (s)", "open_shell"),
            PaletteEntry("Cancel episode", "Stop the agent; cleanup is confirmed (c)", "cancel_episode"),
            PaletteEntry("Keep sandbox", "Toggle keeping the sandbox after the run (k)", "toggle_keep"),
            PaletteEntry("Re-run", "Run the task again with its recorded configuration (r)", "rerun"),
        )

    # -- the debugger (issue 27): acts go through the run's control socket, as `ctl` sends them ---

    def index_keys(self, events: list[Event], keys: list[int], base: int) -> None:
        for index in keys:
            ev = events[index - base]
            if isinstance(ev, Intervention):
                self._on_intervention(ev)

    def _on_intervention(self, ev: Intervention) -> None:
        if ev.what == "break":
            self.notify(
                f"before call {ev.call_number} ({ev.text}) · h request · g continue · n step · m say · "
                "a answer · e edit reply",
                title="Held",
                timeout=6,
            )
        elif ev.what == "reply":
            if self._edit_asked:
                self._edit_asked = False
                self._open_edit(ev)
            else:
                self.notify(
                    f"The reply of call {ev.call_number} is held for editing: e edit · g send it as it came",
                    title="Held",
                    timeout=6,
                )

    def _act(self, req: CtlRequest, then: Callable[[CtlReply], None] | None = None) -> None:
        self._send_act(req, then)

    @work(thread=True, group="debugger")
    def _send_act(self, req: CtlRequest, then: Callable[[CtlReply], None] | None) -> None:
        reply = debug_acts.send(self.bodies_dir, req)
        self.app.call_from_thread(self._acted, reply, then)

    def _acted(self, reply: CtlReply, then: Callable[[CtlReply], None] | None) -> None:
        if reply.ok:
            self.notify(reply.message, timeout=3)
        else:
            self.notify(reply.message, title="Refused", severity="error", timeout=8)
        if then is not None:
            then(reply)

    def _held_number(self) -> str:
        held = self.state.held
        return "?" if held is None or held.call_number is None else str(held.call_number)

    def action_debug_break(self) -> None:
        self._act(CtlRequest(command="pause"))

    def action_debug_continue(self) -> None:
        self._act(CtlRequest(command="continue"))

    def action_debug_step(self) -> None:
        self._act(CtlRequest(command="step"))

    def action_debug_abort(self) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self._act(CtlRequest(command="abort"))

        self.app.push_screen(
            ConfirmScreen(
                "Abort the agent's current turn?",
                "OpenCode stops the turn (or the running tool); the episode goes on to its close, "
                "cleanup confirmed. The run is marked human_intervened.",
                yes="Abort turn",
                no="Keep going",
            ),
            answered,
        )

    def action_debug_say(self) -> None:
        def said(text: str | None) -> None:
            if text is None:
                return
            if not text.strip():
                self.notify("Nothing said: the message was empty.", severity="warning", timeout=4)
                return
            self._act(CtlRequest(command="say", text=text))

        self.app.push_screen(
            DebugInputScreen(
                f"Say to the agent (call {self._held_number()} is held)",
                "A user message OpenCode takes into its next turn; the held call goes as it is.",
            ),
            said,
        )

    def action_debug_answer(self) -> None:
        self.app.push_screen(
            DebugInputScreen(
                f"Answer call {self._held_number()} by hand",
                f"The model never sees this call; OpenCode gets this reply. Write {debug_acts.ANSWER_FORMS}.",
                multiline=True,
            ),
            lambda text: self._send_reply("answer", text),
        )

    def action_debug_edit(self) -> None:
        held = self.state.held
        if held is not None and held.what == "reply":
            self._open_edit(held)
            return

        def forwarded(reply: CtlReply) -> None:
            if not reply.ok:
                self._edit_asked = False

        self._edit_asked = True
        self._act(CtlRequest(command="edit"), forwarded)

    def _open_edit(self, ev: Intervention) -> None:
        try:
            reply = HandAnswer.model_validate_json(ev.text or "")
        except ValueError:
            reply = HandAnswer()
        self.app.push_screen(
            DebugInputScreen(
                f"Edit the model's reply to call {ev.call_number}",
                "OpenCode gets your edit instead of the model's reply. Esc keeps it held "
                "(g sends it as it came).",
                text=debug_acts.answer_text(reply),
                multiline=True,
            ),
            lambda text: self._send_reply("edit", text),
        )

    def _send_reply(self, command: Literal["answer", "edit"], text: str | None) -> None:
        if text is None:
            return
        try:
            answer = debug_acts.parse_answer(text)
        except debug_acts.BadAnswer as exc:
            self.notify(
                f"{command} not sent: {exc}; nothing changed", title="Refused", severity="error", timeout=8
            )
            return
        self._act(CtlRequest(command=command, answer=answer))

    def action_debug_held(self) -> None:
        self._fetch_held()

    @work(thread=True, exclusive=True, group="debugger-held")
    def _fetch_held(self) -> None:
        reply = debug_acts.send(self.bodies_dir, CtlRequest(command="status", with_request=True))
        self.app.call_from_thread(self._show_held, reply)

    def _show_held(self, reply: CtlReply) -> None:
        held = reply.status.held if reply.status is not None else None
        if held is None:
            self.notify(
                reply.message if not reply.ok else "Nothing is held now.", severity="warning", timeout=4
            )
            return
        record = ModelCallRecord(
            call_id=held.call_id,
            method="POST",
            path="/v1/chat/completions",
            started_at=run.clock_now(),
            kind="agent",
            request_body=held.request_body,
            response_body=None if held.reply is None else answer_json(held.reply, None),
        )
        where = "reply held for editing" if held.stage == "reply" else "not sent yet"
        self.app.push_screen(
            ModelCallScreen(
                record.to_event(), None, record=record, held=f"call {held.call_number}, HELD, {where}"
            )
        )
