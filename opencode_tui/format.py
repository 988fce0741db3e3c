"""Small formatting helpers shared by widgets (numbers, durations, one-line event summaries)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from opencode_tui_core.events import (
    CleanupObserved,
    CleanupStep,
    Compaction,
    EpisodeStarted,
    Event,
    FailureRecorded,
    FailureRecovered,
    HealthWarning,
    InstallProgress,
    Intervention,
    ModelCall,
    OpenCodeEvent,
    OutcomeDecided,
    PhaseChanged,
    SandboxFault,
    SandboxReady,
    TerminalOutput,
    ToolCall,
    TranscriptStats,
    VerificationFinished,
    WarmSandbox,
    Warning_,
)
from opencode_tui_core.failures import Outcome, Recovery

# Escape sequences (CSI, OSC, two-character escapes) and the other control characters of terminal output:
# a one-line summary shows the text they style, never the codes themselves.
_TERMINAL_CODES = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[()*+][ -~]?|[ -~])?|[\x00-\x08\x0e-\x1f\x7f]"
)

DASH = "\u2013"  # en dash: "unknown" (never zero)
TIMES = "\u00d7"


def duration(seconds: float | None) -> str:
    """``1:02:03`` / ``2:03`` style; unknown is a dash."""
    if seconds is None:
        return DASH
    seconds = max(seconds, 0.0)
    total = int(seconds)
    h, rem = divmod(total, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def reward(value: float | None) -> str:
    """A reward as shown: ``1``, ``0.5``, or ``–`` when unknown (never "None", never 0)."""
    return DASH if value is None else f"{value:g}"


def seconds(value: float | None, digits: int = 2) -> str:
    return DASH if value is None else f"{value:.{digits}f}s"


def offset(ts: datetime, start: datetime | None) -> str:
    """Time since the episode start as ``+m:ss.s``."""
    if start is None:
        return ts.strftime("%H:%M:%S")
    delta = (ts - start).total_seconds()
    sign = "-" if delta < 0 else "+"
    delta = abs(delta)
    m, s = divmod(delta, 60)
    return f"{sign}{int(m)}:{s:04.1f}"


def count(value: int | None) -> str:
    return DASH if value is None else f"{value:,}"


def nbytes(value: int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"


CLEANUP_LABELS = {
    CleanupStep.RECEIPT: "Cleanup receipt",
    CleanupStep.DESCENDANTS: "Descendants drained",
    CleanupStep.TRANSCRIPT_SNAPSHOT: "Transcript snapshot",
    CleanupStep.SANDBOX_RELEASED: "Sandbox released",
}
STEP_ICONS = {"pending": "○", "running": "◐", "ok": "✓", "failed": "✗", "skipped": DASH}

RECOVERY_LABELS = {
    Recovery.FOLLOWED_EXECUTION_ID: "followed by execution id",
    Recovery.RESUBMITTED: "resubmitted",
    Recovery.RETURNED_UNOBSERVED: "returned, exit unknown",
    Recovery.REATTACHED: "re-attached",
    Recovery.TERMINAL_ENDED: "terminal ended",
}


def action_words(action: str, in_batch: bool) -> str:
    """A policy action as the TUI says it. ``retry`` is what a batch does next; a run outside a batch
    (the TUI's one attempt) was not retried, and saying ``retry`` there would claim it was."""
    if action != Outcome.RETRY:
        return str(action)
    return "retried by its batch" if in_batch else "not retried (a batch would)"


def recovery_label(recovery: Recovery) -> str:
    """How a recovered failure was handled, in words (the failures panel and the timeline)."""
    return RECOVERY_LABELS.get(recovery, str(recovery))


def plain_text(terminal_output: str) -> str:
    """Terminal output without its escape sequences and control characters (the words it shows)."""
    return _TERMINAL_CODES.sub("", terminal_output)


def short(text: Any, limit: int = 80) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def pretty_json(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def summarize(ev: Event, in_batch: bool = False) -> str:
    """One line describing an event, for the timeline (``in_batch``: the run is a batch's attempt)."""
    if isinstance(ev, TerminalOutput):
        return f"{ev.stream}: {short(plain_text(ev.data), 60)}"
    if isinstance(ev, OpenCodeEvent):
        return f"opencode {ev.event_type}"
    if isinstance(ev, ToolCall):
        what = ev.input.get("command") or ev.input.get("filePath") or ev.title or ""
        return f"tool {ev.tool} {ev.status} {short(what, 50)}"
    if isinstance(ev, ModelCall):
        return f"model call {ev.kind} {ev.status or 'no status'} {ev.call_id}"
    if isinstance(ev, PhaseChanged):
        return f"phase {ev.phase} {ev.state}" + (f" ({short(ev.detail, 40)})" if ev.detail else "")
    if isinstance(ev, FailureRecorded):
        f = ev.failure
        action = action_words(ev.decision.action, in_batch)
        return f"FAILURE {f.kind} @{f.stage} → {action} ({ev.decision.failure_class})"
    if isinstance(ev, FailureRecovered):
        return f"recovered {ev.failure.kind} @{ev.failure.stage} ({recovery_label(ev.recovery)})"
    if isinstance(ev, CleanupObserved):
        return f"cleanup {ev.step} {ev.state}" + (f": {short(ev.reason, 40)}" if ev.reason else "")
    if isinstance(ev, EpisodeStarted):
        return f"episode started: {ev.task_id} on {ev.provider}"
    if isinstance(ev, SandboxReady):
        return f"sandbox {ev.sandbox_id} ready ({'owned' if ev.owned else 'borrowed'})"
    if isinstance(ev, WarmSandbox):
        return (
            f"sandbox {ev.sandbox_id} prepared ahead ({seconds(ev.prepare_s)}, waited {seconds(ev.waited_s)})"
        )
    if isinstance(ev, InstallProgress):
        return f"install {ev.package} {nbytes(ev.bytes_done)}/{nbytes(ev.bytes_total)}"
    if isinstance(ev, Warning_):
        return f"{'note' if ev.informational else 'warning'} {ev.code}: {short(ev.message, 50)}"
    if isinstance(ev, Compaction):
        return f"compaction #{ev.count} ({ev.trigger})"
    if isinstance(ev, HealthWarning):
        return f"health {ev.kind}: {short(ev.message, 50)}"
    if isinstance(ev, SandboxFault):
        return f"KERNEL {ev.kind}: {short(ev.message, 60)}"
    if isinstance(ev, Intervention):
        call = f" call {ev.call_number}" if ev.call_number is not None else ""
        text = f": {short(ev.text, 60)}" if ev.text else ""
        return f"debugger {ev.what}{call} by {ev.who}{text}"
    if isinstance(ev, VerificationFinished):
        passed = DASH if ev.passed is None else ("passed" if ev.passed else "not passed")
        return f"verification reward {reward(ev.reward)} · {passed}"
    if isinstance(ev, TranscriptStats):
        return f"transcript {ev.messages} messages, {sum(ev.tool_calls.values())} tool calls"
    if isinstance(ev, OutcomeDecided):
        return f"outcome {action_words(ev.action, in_batch)} reward {reward(ev.reward)}"
    return getattr(ev, "type", type(ev).__name__)


def status_word(call: ModelCall) -> str:
    """The status column: the HTTP status, and ``failed`` when a 2xx was no answer (or broke); a reply a
    person wrote or edited at a break says so (it is not the model's)."""
    if call.status is None:
        return "error" if call.error else "pending"
    if call.failed and call.status < 400:
        return f"{call.status} failed"
    if call.answered_by:
        return f"{call.status} answered"
    if call.edited_by:
        return f"{call.status} edited"
    return str(call.status)
