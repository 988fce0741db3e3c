"""Episode-health warnings: signs, while an episode still runs, that it is going badly.

``HealthMonitor`` folds the same event stream every other consumer sees and derives ``HealthWarning``
events from it (``EventBus.derive``); a command's silence has no event of its own, so ``watch`` checks
it on a clock while the agent runs. Warnings are shown and counted (the batch line's ``health``), never
failures and never the outcome: a run can storm and still pass.

What each kind means (thresholds in ``opencode_tui_core.config.HealthThresholds``):

- ``compaction_storm``: many compactions within a window, or the first agent call after a compaction
  still near the context limit (compaction freed nothing: OpenCode will compact again at once; a real
  failed run compacted 31 times).
- ``reads_without_edits``: many file reads and not one file edit (the same run: 144 reads, 0 edits).
- ``command_silent``: a running bash command printed nothing for longer than the threshold (with the
  ``serve`` harness; ``run`` reports a tool call only once it has finished, so there it cannot fire).
- ``repeated_tool_call``: the same tool with the same arguments, again and again.
- ``retry_storm``: many model calls answered 429 or 5xx within a window.
- ``empty_answers``: model answers in a row that gave the agent nothing (an empty 200, no choices, no
  text, tool call or token); ``model.empty_answers_limit`` of them end the episode (core/calls/progress.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter, deque
from collections.abc import Iterable
from datetime import datetime, timedelta

from opencode_tui_core.calls.progress import empty_answer, good_answer
from opencode_tui_core.config import HealthThresholds
from opencode_tui_core.events import (
    Compaction,
    Event,
    EventBus,
    HealthKind,
    HealthWarning,
    ModelCall,
    OutcomeDecided,
    Phase,
    PhaseChanged,
    TerminalOutput,
    ToolCall,
)
from opencode_tui_core.failures.evidence import utcnow

# OpenCode's tool names, by what they do to files.
READ_TOOLS = frozenset({"read", "grep", "glob", "list"})
EDIT_TOOLS = frozenset({"edit", "write", "patch", "multiedit", "apply_patch"})


def _signature(call: ToolCall) -> str:
    return call.tool + " " + json.dumps(call.input, sort_keys=True, default=str)


def _retryable(call: ModelCall) -> bool:
    return call.status is not None and (call.status == 429 or 500 <= call.status <= 599)


class HealthMonitor:
    """Derives health warnings from one episode's events. Thread-safe (events arrive from the proxy's
    thread and the loop); pure apart from ``watch``'s clock, so tests can feed it events directly."""

    def __init__(self, thresholds: HealthThresholds, context_window: int) -> None:
        self.t = thresholds
        self.context_window = context_window
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._phase: Phase | None = None
        self._ended = False
        self._compactions: deque[datetime] = deque()
        self._after_compaction = False
        self._reads = 0
        self._reads_warned = False
        self._recent_calls: deque[str] = deque(maxlen=thresholds.repeated_tool_call_window)
        self._seen_calls: set[str] = set()
        self._repeats_warned: set[str] = set()
        self._retries: deque[datetime] = deque()
        self._empty_run: list[str] = []  # call ids of the current run of empty answers
        self._empty_warned = False
        # The running bash command: call id -> (its command, when it last printed); warned ids.
        self._running: dict[str, tuple[str, datetime]] = {}
        self._silent_warned: set[str] = set()

    # ---- the event stream ------------------------------------------------------------------------

    def attach(self, bus: EventBus) -> None:
        bus.derive(self.observe)

    def observe(self, event: Event) -> list[HealthWarning]:
        if not self.t.enabled or isinstance(event, HealthWarning):
            return []
        with self._lock:
            out = self._observe(event)
            for w in out:
                self.counts[w.kind.value] += 1
            return out

    def _observe(self, ev: Event) -> list[HealthWarning]:
        if isinstance(ev, PhaseChanged):
            self._phase = ev.phase
            if ev.phase is not Phase.AGENT:
                self._running.clear()
            if ev.phase is Phase.DONE:
                self._ended = True
            return []
        if isinstance(ev, OutcomeDecided):
            self._ended = True
            return []
        if isinstance(ev, Compaction):
            return self._compaction(ev)
        if isinstance(ev, ModelCall):
            return self._model_call(ev)
        if isinstance(ev, ToolCall):
            return self._tool_call(ev)
        if isinstance(ev, TerminalOutput) and ev.stream == "display":
            # The rendering follows the running command's output: any of it means it is not silent.
            for call_id, (command, _) in self._running.items():
                self._running[call_id] = (command, ev.ts)
        return []

    def _compaction(self, ev: Compaction) -> list[HealthWarning]:
        self._after_compaction = True
        window = timedelta(seconds=self.t.compaction_storm_window_s)
        self._compactions.append(ev.ts)
        while self._compactions and ev.ts - self._compactions[0] > window:
            self._compactions.popleft()
        n = len(self._compactions)
        if n < self.t.compaction_storm_count:
            return []
        self._compactions.clear()  # one warning per storm; a continuing storm warns again later
        return [
            HealthWarning(
                kind=HealthKind.COMPACTION_STORM,
                message=f"{n} compactions within {self.t.compaction_storm_window_s:g} s "
                f"({ev.count} in the run so far)",
                data={"reason": "count", "compactions": n, "total": ev.count},
            )
        ]

    def _model_call(self, ev: ModelCall) -> list[HealthWarning]:
        out: list[HealthWarning] = []
        if _retryable(ev):
            window = timedelta(seconds=self.t.retry_storm_window_s)
            self._retries.append(ev.ts)
            while self._retries and ev.ts - self._retries[0] > window:
                self._retries.popleft()
            n = len(self._retries)
            if n >= self.t.retry_storm_count:
                self._retries.clear()
                out.append(
                    HealthWarning(
                        kind=HealthKind.RETRY_STORM,
                        message=f"{n} model calls answered 429/5xx within {self.t.retry_storm_window_s:g} s "
                        f"(last: HTTP {ev.status} on {ev.call_id})",
                        data={"calls": n, "status": ev.status, "call_id": ev.call_id},
                    )
                )
        out.extend(self._empty_answer(ev))
        if self._after_compaction and ev.kind == "agent" and ev.status == 200:
            self._after_compaction = False
            limit = self.t.compaction_near_limit_ratio * self.context_window
            if ev.tokens_in is not None and ev.tokens_in >= limit:
                out.append(
                    HealthWarning(
                        kind=HealthKind.COMPACTION_STORM,
                        message=f"still {ev.tokens_in:,} tokens in context right after a compaction "
                        f"({ev.tokens_in / self.context_window:.0%} of {self.context_window:,}): "
                        "compaction freed nothing",
                        data={
                            "reason": "near_limit_after_compaction",
                            "tokens_in": ev.tokens_in,
                            "context_window": self.context_window,
                            "call_id": ev.call_id,
                        },
                    )
                )
        return out

    def _empty_answer(self, ev: ModelCall) -> list[HealthWarning]:
        """Counted as core/calls/progress.py counts (one warning per run of empty answers)."""
        if good_answer(ev):
            self._empty_run.clear()
            self._empty_warned = False
        if not empty_answer(ev):
            return []
        self._empty_run.append(ev.call_id)
        n = len(self._empty_run)
        if n < self.t.empty_answers or self._empty_warned:
            return []
        self._empty_warned = True
        return [
            HealthWarning(
                kind=HealthKind.EMPTY_ANSWERS,
                message=f"{n} model answers in a row gave the agent nothing "
                f"(last: {ev.call_id}, {ev.error or 'no text, tool call or token'})",
                data={"calls": n, "call_ids": list(self._empty_run), "answer_fault": ev.answer_fault},
            )
        ]

    def _tool_call(self, ev: ToolCall) -> list[HealthWarning]:
        out: list[HealthWarning] = []
        if ev.status == "running":
            if ev.tool == "bash" and ev.call_id not in self._silent_warned:
                self._running[ev.call_id] = (str(ev.input.get("command", "")), ev.ts)
        else:
            self._running.pop(ev.call_id, None)
        first = ev.call_id not in self._seen_calls
        if not first:
            return out
        # Each call counts once, at its first event (``run`` only reports finished calls).
        self._seen_calls.add(ev.call_id)
        if ev.tool in EDIT_TOOLS:
            self._reads = 0
            self._reads_warned = False
        elif ev.tool in READ_TOOLS:
            self._reads += 1
            if self._reads >= self.t.reads_without_edits and not self._reads_warned:
                self._reads_warned = True
                out.append(
                    HealthWarning(
                        kind=HealthKind.READS_WITHOUT_EDITS,
                        message=f"{self._reads} file reads without a single edit",
                        data={"reads": self._reads},
                    )
                )
        sig = _signature(ev)
        self._recent_calls.append(sig)
        n = self._recent_calls.count(sig)
        if n >= self.t.repeated_tool_call and sig not in self._repeats_warned:
            self._repeats_warned.add(sig)
            out.append(
                HealthWarning(
                    kind=HealthKind.REPEATED_TOOL_CALL,
                    message=f"the same {ev.tool} call {n} times in the last {len(self._recent_calls)} "
                    f"tool calls: {sig[:160]}",
                    data={"tool": ev.tool, "input": ev.input, "times": n},
                )
            )
        return out

    # ---- the clock -------------------------------------------------------------------------------

    def silent_commands(self, now: datetime | None = None) -> list[HealthWarning]:
        """A warning for each running bash command silent past the threshold (once per command)."""
        if not self.t.enabled:
            return []
        now = now or utcnow()
        limit = timedelta(seconds=self.t.command_silent_s)
        out: list[HealthWarning] = []
        with self._lock:
            for call_id, (command, last) in list(self._running.items()):
                quiet = now - last
                if quiet < limit:
                    continue
                del self._running[call_id]
                self._silent_warned.add(call_id)
                out.append(
                    HealthWarning(
                        kind=HealthKind.COMMAND_SILENT,
                        message=f"no output for {quiet.total_seconds():.0f} s from: {command[:160]}",
                        data={"call_id": call_id, "command": command, "silent_s": quiet.total_seconds()},
                    )
                )
                self.counts[HealthKind.COMMAND_SILENT.value] += 1
        return out

    async def watch(self, bus: EventBus, deadline_s: float) -> None:
        """Check for silent commands until the episode ends (or ``deadline_s`` passes)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        interval = min(1.0, self.t.command_silent_s / 4)
        while not self._ended and loop.time() < end:
            await asyncio.sleep(interval)
            for w in self.silent_commands():
                bus.emit(w)

    def summary(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


def health_counts(events: Iterable[Event]) -> dict[str, int]:
    """The warnings recorded in an event stream, by kind (for run directories already written)."""
    return dict(Counter(ev.kind.value for ev in events if isinstance(ev, HealthWarning)))
