"""The live debugger of one episode: holds agent calls at breakpoints and carries out a person's acts.

It is the recording proxy's ``CallGate`` (opencode_tui_core.model.hold) and a subscriber of the event stream (the
``tool:``, ``warning``, ``error`` and ``failure`` conditions are facts of the stream). Acts come from the
control socket (opencode_tui_core.debugger.control_socket) or the TUI; each one is an ``Intervention`` event.

A hold never outlives the run: it is bounded by the run deadline (then failed with a 503), released by
``release_all`` when the episode closes (cancel, signal, deadline), and cancelled when OpenCode hangs up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from opencode_tui_core.breaks import BreakCondition, BreakKind, parse_break
from opencode_tui_core.debugger.protocol import CtlReply, HeldView, StatusView
from opencode_tui_core.debugger.readable_request import short_conversation
from opencode_tui_core.events import Event, FailureRecorded, HealthWarning, Intervention, ModelCall, ToolCall
from opencode_tui_core.model.hold import FORWARD, HandAnswer, HeldCall, HoldVerdict, Release, answer_problem

# Acts that change what the agent sees: a run with any of them is human_intervened.
INTERVENING = frozenset({"say", "answer", "edited", "abort"})
# A held call is failed this long after the run deadline at the latest (the session's own deadline
# stops OpenCode first; this bound is for a hold that nothing else ends).
DEADLINE_GRACE_S = 5.0
DEADLINE_SLACK_S = 1.0  # the session's clock started a moment before the debugger's
HELD_PAST_DEADLINE = "the run deadline passed while the call was held"

# say/abort through OpenCode's server in the sandbox: (action, text) → None, or raises with the reason.
ServeAct = Callable[[str, str], Awaitable[None]]


class _Held:
    """A held call: before it is forwarded (``request``), or its reply, held for editing (``reply``)."""

    def __init__(self, call: HeldCall, number: int, reason: str, reply: HandAnswer | None = None) -> None:
        self.call = call
        self.number = number
        self.reason = reason
        self.reply = reply
        self.stage: Literal["request", "reply"] = "request" if reply is None else "reply"
        self.since = time.monotonic()
        self.verdict: asyncio.Future[HoldVerdict] = asyncio.get_running_loop().create_future()


class Debugger:
    """Breakpoints and acts for one episode. ``emit`` publishes Intervention events; ``on_intervened``
    is told once a person changed what the agent sees (the human_intervened rule)."""

    def __init__(
        self,
        breaks: list[str],
        *,
        emit: Callable[[Event], Any],
        on_intervened: Callable[[str], None],
        phase: Callable[[], str],
    ) -> None:
        self.breaks: list[BreakCondition] = [parse_break(b) for b in breaks]
        self._emit = emit
        self._on_intervened = on_intervened
        self._phase = phase
        self.agent_calls = 0
        self.held: _Held | None = None
        self._pending: str | None = None  # a condition fired by the stream: break before the next call
        self._pause = False  # `pause`/`step`: break before the next call
        self._deadline: float | None = None  # monotonic run deadline, once the agent runs
        self._serve: ServeAct | None = None
        self._closed: str | None = None  # the run is ending: every call goes through (or fails)
        self._fired_tools: set[str] = set()
        self._edits: dict[str, int] = {}  # call id → number: forwarded to have the reply held
        self.interventions: list[Intervention] = []

    # ---- wiring ---------------------------------------------------------------------------------

    def agent_started(self, run_budget_s: float, serve: ServeAct | None) -> None:
        self._deadline = time.monotonic() + run_budget_s
        self._serve = serve

    def observe(self, event: Event) -> None:
        """Bus subscriber: the stream-side break conditions."""
        if isinstance(event, ToolCall) and event.status in ("completed", "error"):
            for b in self.breaks:
                if b.kind is BreakKind.TOOL and b.tool == event.tool and b.tool not in self._fired_tools:
                    self._fired_tools.add(event.tool)
                    self._pending = self._pending or f"tool:{event.tool} ran"
        elif isinstance(event, HealthWarning) and self._has(BreakKind.WARNING):
            self._pending = self._pending or f"warning: {event.kind.value}"
        elif isinstance(event, ModelCall) and event.failed and self._has(BreakKind.ERROR):
            self._pending = self._pending or f"error: call {event.call_id} failed"
        elif isinstance(event, FailureRecorded) and self._has(BreakKind.FAILURE):
            self._pending = self._pending or f"failure: {event.failure.kind}"

    def _has(self, kind: BreakKind) -> bool:
        return any(b.kind is kind for b in self.breaks)

    def _record(self, what: str, who: str, text: str | None = None) -> None:
        held = self.held
        event = Intervention(
            what=what,  # type: ignore[arg-type]
            who=who,
            call_id=held.call.call_id if held else None,
            call_number=held.number if held else None,
            text=text,
        )
        self.interventions.append(event)
        self._emit(event)
        if what in INTERVENING:
            self._on_intervened(what)

    # ---- the gate -------------------------------------------------------------------------------

    async def hold(self, call: HeldCall) -> HoldVerdict:
        self.agent_calls += 1
        number = self.agent_calls
        if self._closed is not None or self.held is not None:
            return FORWARD  # one hold at a time; a parallel call (a sub-agent's) goes through
        reason = self._reason(number)
        if reason is None:
            return FORWARD
        self._pending, self._pause = None, False
        held = self.held = _Held(call, number, reason)
        self._record("break", "engine", reason)
        return await self._wait(held)

    async def hold_reply(self, call: HeldCall, reply: HandAnswer) -> HoldVerdict:
        """The model's reply to a call forwarded by ``edit``: held until a person edits or sends it."""
        number = self._edits.pop(call.call_id, None)
        if number is None or self._closed is not None or self.held is not None:
            return FORWARD
        held = self.held = _Held(call, number, "reply held for editing", reply)
        self._record("reply", "engine", reply.model_dump_json(exclude_defaults=True))
        return await self._wait(held)

    async def _wait(self, held: _Held) -> HoldVerdict:
        """Until a person (or the run's end, or its deadline) gives the verdict."""
        try:
            timeout = None
            if self._deadline is not None:
                timeout = max(self._deadline + DEADLINE_GRACE_S - time.monotonic(), 0.0)
            try:
                return await asyncio.wait_for(asyncio.shield(held.verdict), timeout)
            except TimeoutError:
                return HoldVerdict(action=Release.FAIL, reason=HELD_PAST_DEADLINE)
        except asyncio.CancelledError:
            # OpenCode hung up (its request timeout, model.request_timeout_s): it retries the call,
            # and the retry is held in its place, so a long look at a break does not lose the break.
            if self._closed is None and not held.verdict.done() and not self._past_deadline():
                self._record("release", "engine", "OpenCode stopped waiting for the held call")
                self._pending = f"{held.reason} (OpenCode retried the call it stopped waiting for)"
            raise
        finally:
            if self._past_deadline():
                # The hold, not the agent, used up the run: the record says so (not a clean sample).
                self._record("release", "engine", HELD_PAST_DEADLINE)
                self._on_intervened("a call held past the run deadline")
            if self.held is held:
                self.held = None

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline - DEADLINE_SLACK_S

    def _reason(self, number: int) -> str | None:
        if self._pause:
            return "paused"
        if self._pending is not None:
            return self._pending
        for b in self.breaks:
            if b.kind is BreakKind.NEXT:
                self.breaks.remove(b)  # `next` fires once
                return "next"
            if b.kind is BreakKind.CALL and b.call == number:
                return f"call:{number}"
        return None

    def release_all(self, reason: str) -> None:
        """The run is ending (cancel, signal, deadline, close): fail a held call, hold no more."""
        self._closed = reason
        held = self.held
        if held is not None and not held.verdict.done():
            self._record("release", "engine", reason)
            held.verdict.set_result(HoldVerdict(action=Release.FAIL, reason=reason))

    # ---- acts -----------------------------------------------------------------------------------

    def status(self, with_request: bool = False) -> CtlReply:
        held = self.held
        view = None
        if held is not None:
            left = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
            view = HeldView(
                call_number=held.number,
                call_id=held.call.call_id,
                age_s=round(time.monotonic() - held.since, 1),
                reason=held.reason,
                run_deadline_in_s=None if left is None else round(left, 1),
                conversation=short_conversation(held.call.request_body),
                stage=held.stage,
                reply=held.reply,
                request_body=held.call.request_body if with_request else None,
            )
        status = StatusView(
            phase=self._phase(),
            live=self._closed is None,
            held=view,
            breaks=[b.words for b in self.breaks],
            agent_calls=self.agent_calls,
            interventions=len(self.interventions),
        )
        return CtlReply(ok=True, message=_status_line(status), status=status)

    def _not_live(self) -> CtlReply | None:
        if self._closed is not None:
            return CtlReply(
                ok=False, message=f"the run is not live any more ({self._closed}); nothing changed"
            )
        return None

    def pause(self, who: str) -> CtlReply:
        if (refused := self._not_live()) is not None:
            return refused
        if self.held is not None:
            return CtlReply(ok=True, message=f"already held before call {self.held.number}")
        self._pause = True
        self._record("pause", who)
        return CtlReply(ok=True, message=f"will hold before call {self.agent_calls + 1}")

    def add_break(self, text: str, who: str) -> CtlReply:
        if (refused := self._not_live()) is not None:
            return refused
        try:
            cond = parse_break(text)
        except ValueError as exc:
            return CtlReply(ok=False, message=str(exc))
        self.breaks.append(cond)
        return CtlReply(ok=True, message=f"break set: {cond.words}")

    def _release(self, what: str, who: str, verdict: HoldVerdict, text: str | None = None) -> CtlReply:
        held = self.held
        if held is None or held.verdict.done():
            return CtlReply(ok=False, message=f"not held: nothing to {what} (`pause` holds the next call)")
        self._record(what, who, text)
        if what == "step":
            self._pause = True
        held.verdict.set_result(verdict)
        return CtlReply(ok=True, message=f"{what}: call {held.number} ({held.call.call_id}) released")

    def continue_(self, who: str) -> CtlReply:
        return self._release("continue", who, FORWARD)

    def step(self, who: str) -> CtlReply:
        return self._release("step", who, FORWARD)

    def answer(self, answer: HandAnswer, who: str) -> CtlReply:
        held = self.held
        if held is None:
            return CtlReply(
                ok=False, message="not held: an answer replaces a held call's reply; nothing changed"
            )
        if held.stage == "reply":
            return self.edit(answer, who)  # the model's reply is held: an answer is its edit
        problem = answer_problem(answer, held.call.request_body)
        if problem is not None:
            return CtlReply(ok=False, message=f"answer refused: {problem}; nothing changed")
        verdict = HoldVerdict(action=Release.ANSWER, answer=answer, by=who)
        return self._release("answer", who, verdict, answer.model_dump_json(exclude_defaults=True))

    def edit(self, answer: HandAnswer | None, who: str) -> CtlReply:
        """No answer: forward the held call and hold the model's reply; an answer: replace that reply."""
        held = self.held
        if held is None:
            return CtlReply(ok=False, message="not held: `edit` acts on a held call; nothing changed")
        if answer is None:
            if held.stage == "reply":
                return CtlReply(
                    ok=False,
                    message=f"the reply of call {held.number} is held: give the edited reply "
                    "(edit TEXT or --file F), or `continue` to send it as it came; nothing changed",
                )
            if held.verdict.done():
                return CtlReply(ok=False, message="not held: nothing to edit; nothing changed")
            self._edits[held.call.call_id] = held.number
            self._record("edit", who)
            held.verdict.set_result(HoldVerdict(edit_reply=True, by=who))
            return CtlReply(
                ok=True,
                message=f"edit: call {held.number} forwarded; its reply will be held for editing",
            )
        if held.stage != "reply":
            return CtlReply(
                ok=False,
                message=f"call {held.number} has no reply yet: `edit` alone forwards it and holds the "
                "model's reply (`answer` replaces the model instead); nothing changed",
            )
        problem = answer_problem(answer, held.call.request_body)
        if problem is not None:
            return CtlReply(ok=False, message=f"edit refused: {problem}; nothing changed")
        verdict = HoldVerdict(action=Release.ANSWER, answer=answer, by=who)
        return self._release("edited", who, verdict, answer.model_dump_json(exclude_defaults=True))

    async def say(self, text: str, who: str) -> CtlReply:
        if self.held is None:
            return CtlReply(
                ok=False, message="not held: `say` adds a message while a call is held; nothing changed"
            )
        if not text.strip():
            return CtlReply(ok=False, message="say: the message is empty; nothing changed")
        return await self._serve_act("say", text, who)

    async def abort(self, who: str) -> CtlReply:
        if (refused := self._not_live()) is not None:
            return refused
        return await self._serve_act("abort", "", who)

    async def _serve_act(self, action: str, text: str, who: str) -> CtlReply:
        if self._serve is None:
            return CtlReply(
                ok=False, message=f"{action}: OpenCode's server is not running yet; nothing changed"
            )
        try:
            await self._serve(action, text)
        except Exception as exc:
            return CtlReply(ok=False, message=f"{action} failed: {exc}")
        self._record(action, who, text or None)
        if action == "abort":
            held = self.held
            if held is not None and not held.verdict.done():
                # The turn is over: the held call is answered with a 503 OpenCode no longer waits for.
                held.verdict.set_result(HoldVerdict(action=Release.FAIL, reason="the turn was aborted"))
        where = f" (call {self.held.number} still held)" if self.held and action == "say" else ""
        return CtlReply(ok=True, message=f"{action}: done{where}")


def _status_line(s: StatusView) -> str:
    if not s.live:
        return f"phase {s.phase}: not live"
    if s.held is None:
        return f"phase {s.phase}: running, {s.agent_calls} agent call(s), breaks: {', '.join(s.breaks) or 'none'}"
    h = s.held
    left = "" if h.run_deadline_in_s is None else f", run deadline in {h.run_deadline_in_s:.0f} s"
    where = f"reply of call {h.call_number}" if h.stage == "reply" else f"before call {h.call_number}"
    return f"phase {s.phase}: HELD {where} ({h.age_s:.0f} s, {h.reason}{left})"


__all__ = ["Debugger", "ServeAct"]
