"""Answering model calls from a recorded run (``rerun`` and ``fork``, issue 28).

A ``Replayer`` stands where the recording proxy would forward a request (``ModelProxy.replay``): each
request is matched with the parent run's next recorded call of the same kind (``model_calls.jsonl``,
in request order) and, when the conversation is the one recorded, answered with the recorded response
(status, headers and body, byte for byte as recorded; an upstream that could not be reached or a
stream that broke is reproduced as such). The proxy then records and judges the replayed answer as it
would a live one, so the child's ``model_calls.jsonl`` reads like any run's, each replayed call naming
the recorded one (``replayed_from``).

The first request that differs from the recorded one (conversation and tool results, ids and
timestamps ignored) is the **divergence**: said once (``on_diverged``), then by the plan's
``on_divergence``: ``stop`` fails the call (the episode stops its agent), ``continue`` keeps answering
from the record, ``live`` forwards this and every later call to the live model. A fork answers its
first ``fork_step`` agent calls from the record and goes live with the next one.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.calls.records import ModelCallRecord

OnDivergence = Literal["stop", "continue", "live"]
Lineage = Literal["rerun", "fork"]
# Kinds whose requests carry the agent's conversation: a difference there is a divergence. A title
# request is answered from the record when one is left, else live, never judged.
_JUDGED = frozenset({"agent", "compaction"})
# Run-to-run noise in a conversation: clock times, dates, durations (``Ran 1 test in 0.001s``) and
# throughputs (dd's ``214 MB/s``), OpenCode's own ids (a subagent's ``<task id="ses_...">``) and the
# pid bash names in a job's death.
_NOISE = [
    (re.compile(r"\b(ses|msg|prt)_[0-9A-Za-z]{12,}\b"), r"\1_<id>"),
    (re.compile(r"(\s)\d+(\s+(Killed|Terminated|Aborted|Segmentation fault|Hangup)\b)"), r"\1<pid>\2"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?"), "<datetime>"),
    (re.compile(r"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun)\w* \w{3,9} \d{1,2},? \d{4}\b"), "<date>"),
    (re.compile(r"\b\d{1,2}:\d\d:\d\d(\.\d+)?\b"), "<time>"),
    (re.compile(r"\b\d+(\.\d+)?\s?([kKMGTP]i?)?B/s\b"), "<rate>"),
    (re.compile(r"\b\d+(\.\d+)?\s?(ms|s|sec|secs|seconds)\b"), "<duration>"),
]
DIFF_LINES = 12


class ReplayPlan(BaseModel):
    """What a child run is a replay of, and how far (the parent's record is read when it starts)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lineage: Lineage
    parent_run_id: str
    parent_run_dir: str
    fork_step: int | None = Field(default=None, ge=1)  # fork: agent calls answered from the record
    on_divergence: OnDivergence = "stop"
    say: str | None = None  # fork: a user message added at the fork point (before the first live call)
    # fork: the step asked for and why the fork starts earlier (``fork_point``); None: as asked
    asked_step: int | None = Field(default=None, ge=1)
    moved: str | None = None


class Divergence(BaseModel):
    """The first request that was not the recorded one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int  # the agent call (1-based) at which it happened
    call_id: str | None = None  # the recorded call it was compared with (None: the record had no more)
    what: str  # in words: which message differs
    diff: str = ""  # a short unified diff of that message, recorded then new


@dataclass
class Replayed:
    """A recorded answer for the proxy to relay: ``response`` (its body streams as recorded)."""

    response: httpx.Response
    call_id: str | None  # the recorded call answered from (None: an answer made here, e.g. a stop)


class _RecordedStream(httpx.AsyncByteStream):
    """The recorded body as one chunk; a broken recorded stream breaks again after its bytes."""

    def __init__(self, body: bytes, broken: str | None) -> None:
        self._body = body
        self._broken = broken

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._body:
            yield self._body
        if self._broken is not None:
            raise httpx.ReadError(f"replayed: {self._broken}")


def recorded_order(records: Iterable[ModelCallRecord]) -> list[ModelCallRecord]:
    """The records in the order their requests were made (the file is in completion order)."""
    return sorted(records, key=lambda r: r.started_at)


def agent_steps(records: Iterable[ModelCallRecord]) -> int:
    return sum(1 for r in records if r.kind == "agent" and r.method == "POST")


def cut_reason(rec: ModelCallRecord) -> str | None:
    """Why a recorded answer cannot be replayed as its client got it (None: it can): how a record
    ends, in words that follow "step k's recorded answer"."""
    if rec.truncated:
        return "was cut at the record's size limit (the proxy kept only its start), so it cannot be replayed"
    if rec.client_disconnected:
        return (
            f"was cut: OpenCode hung up before it completed ({rec.error or 'a stalled stream'}), "
            "which a replay cannot reproduce"
        )
    return None


def incomplete_reason(rec: ModelCallRecord) -> str | None:
    """Why a recorded answer is no complete answer to fork after (None: it is one): cut (above), a
    stream that broke or never ended, an error."""
    cut = cut_reason(rec)
    if cut is not None:
        return cut
    if rec.error and rec.error.startswith("upstream stream broken"):
        return f"was cut mid-stream ({rec.error})"
    if rec.failed or rec.answer_fault is not None:
        return f"failed ({rec.error or f'HTTP {rec.status}'})"
    return None


@dataclass(frozen=True)
class ForkPoint:
    """Where a fork asked for at ``asked`` can start: ``step`` (0: nowhere) and, when that is not the
    step asked for, ``why`` in one line (which step and why)."""

    asked: int
    step: int
    why: str | None = None


def fork_point(records: Iterable[ModelCallRecord], at: int) -> ForkPoint:
    """A fork answers agent steps 1..``at`` from the record and goes live after ``at``. That needs each
    of those answers replayable (``cut_reason``) and step ``at``'s a complete one (a cut or failed
    answer there is no point to go on from: OpenCode asks again, and that request is the live
    model's). Otherwise the fork starts from the last complete step before the first that is not."""
    agent = [r for r in recorded_order(records) if r.kind == "agent" and r.method == "POST"][:at]
    bad = next(((j, why) for j, r in enumerate(agent, 1) if (why := cut_reason(r)) is not None), None)
    if bad is None and agent and len(agent) == at and (why := incomplete_reason(agent[-1])) is not None:
        bad = (at, why)
    if bad is None:
        return ForkPoint(at, at)
    j, why = bad
    step = next((k for k in range(j - 1, 0, -1) if incomplete_reason(agent[k - 1]) is None), 0)
    said = f"step {j}'s recorded answer {why}"
    if step == 0:
        return ForkPoint(at, 0, f"--at {at}: {said}, and no step before it is complete: nothing to fork from")
    return ForkPoint(at, step, f"--at {at}: {said}; the fork starts from step {step}, the last complete step")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content, sort_keys=True)


def _denoise(text: str) -> str:
    for pattern, mask in _NOISE:
        text = pattern.sub(mask, text)
    return text


def conversation_lines(body: Any) -> list[str]:
    """A request's conversation as comparable lines: one per message (role, text, tool calls by name
    and arguments; ids dropped, clock noise masked), then the offered tools' names."""
    if not isinstance(body, dict):
        return [_denoise(_text(body))]
    out = []
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        parts = [f"[{m.get('role')}]", _text(m.get("content"))]
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") or {} if isinstance(tc, dict) else {}
            parts.append(f"-> {fn.get('name')}({fn.get('arguments')})")
        out.append(_denoise(" ".join(p for p in parts if p)))
    tools = sorted(
        str((t.get("function") or {}).get("name")) for t in body.get("tools") or [] if isinstance(t, dict)
    )
    if tools:
        out.append("[tools] " + ",".join(tools))
    return out


def compare(recorded: Any, new: Any) -> tuple[str, str] | None:
    """None when the two requests carry the same conversation; else (what differs, a short diff)."""
    a, b = conversation_lines(recorded), conversation_lines(new)
    if a == b:
        return None
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    if i >= len(a):
        what = f"message {i + 1} is new ({b[i][:80]!r})"
    elif i >= len(b):
        what = f"message {i + 1} is missing (recorded {a[i][:80]!r})"
    else:
        role = a[i].split(" ", 1)[0]
        what = f"message {i + 1} {role} differs" + (" (a tool result)" if role == "[tool]" else "")
    old_text = a[i] if i < len(a) else ""
    new_text = b[i] if i < len(b) else ""
    diff = difflib.unified_diff(
        old_text.splitlines(), new_text.splitlines(), "recorded", "now", lineterm="", n=1
    )
    return what, "\n".join(list(diff)[:DIFF_LINES])


def _recorded_response(rec: ModelCallRecord) -> Replayed:
    """The recorded answer as an httpx response (raises httpx.ConnectError for an unreached upstream)."""
    if rec.status is None:
        raise httpx.ConnectError(f"replayed: {rec.error or 'the upstream was not reached'}")
    body = rec.response_body
    data = b"" if body is None else body.encode() if isinstance(body, str) else json.dumps(body).encode()
    headers = [
        (k, v)
        for k, v in rec.response_headers.items()
        if k.lower() not in ("content-length", "content-encoding", "transfer-encoding", "connection")
    ]
    broken = rec.error if rec.error and rec.error.startswith("upstream stream broken") else None
    return Replayed(
        httpx.Response(rec.status, headers=headers, stream=_RecordedStream(data, broken)), rec.call_id
    )


def _stopped(divergence: Divergence) -> Replayed:
    message = f"rerun stopped at its divergence (step {divergence.step}: {divergence.what})"
    body = json.dumps({"error": {"message": message, "type": "replay_diverged", "code": 503}}).encode()
    headers = [("Content-Type", "application/json")]
    return Replayed(httpx.Response(503, headers=headers, stream=_RecordedStream(body, None)), None)


class Replayer:
    """The answers of one child run (see the module's docstring). ``on_diverged`` is told once;
    ``on_live`` once, when the first call goes to the live model (step number)."""

    def __init__(
        self,
        plan: ReplayPlan,
        records: Iterable[ModelCallRecord],
        *,
        on_diverged: Callable[[Divergence], None] | None = None,
        on_live: Callable[[int], None] | None = None,
        at_fork_point: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.plan = plan
        # Awaited before the last replayed answer of a fork (its ``say`` goes in then, so OpenCode
        # takes it into the first live request).
        self._at_fork_point = at_fork_point
        self._queues: dict[str, deque[ModelCallRecord]] = {}
        for rec in recorded_order(records):
            if rec.method == "POST":
                self._queues.setdefault(rec.kind, deque()).append(rec)
        self._on_diverged = on_diverged
        self._on_live = on_live
        self.step = 0  # agent calls seen
        self.replayed = 0
        self.live_from: int | None = None  # the agent step of the first live call
        self.divergence: Divergence | None = None

    @property
    def live(self) -> bool:
        return self.live_from is not None

    def _go_live(self) -> None:
        if self.live_from is None:
            self.live_from = max(self.step, 1)
            if self._on_live is not None:
                self._on_live(self.live_from)

    def _diverged(self, divergence: Divergence) -> None:
        self.divergence = divergence
        if self._on_diverged is not None:
            self._on_diverged(divergence)

    async def answer(self, kind: str, body: Any) -> Replayed | None:
        """The recorded answer to this request; None: forward it to the live model."""
        if kind == "agent":
            self.step += 1
        if self.live:
            return None
        if kind == "agent" and self.plan.fork_step is not None and self.step > self.plan.fork_step:
            self._go_live()
            return None
        if self.divergence is not None and self.plan.on_divergence == "stop":
            return _stopped(self.divergence)
        queue = self._queues.get(kind)
        rec = queue.popleft() if queue else None
        if kind in _JUDGED and self.divergence is None:
            found = self._difference(rec, body)
            if found is not None:
                self._diverged(found)
                if self.plan.on_divergence == "stop" and self.plan.lineage == "rerun":
                    return _stopped(found)
                if self.plan.on_divergence == "live" or self.plan.lineage == "fork" or rec is None:
                    self._go_live()
                    return None
        if rec is None:
            return None  # a title or other call the record has no more of: the live model answers
        if kind == "agent" and self.step == self.plan.fork_step and self._at_fork_point is not None:
            await self._at_fork_point()
        self.replayed += 1
        return _recorded_response(rec)

    def _difference(self, rec: ModelCallRecord | None, body: Any) -> Divergence | None:
        if rec is None:
            return Divergence(step=self.step, what="the recorded run made no further call of this kind")
        if rec.truncated:
            return Divergence(
                step=self.step, call_id=rec.call_id, what="the recorded call was truncated: cannot replay it"
            )
        found = compare(rec.request_body, body)
        if found is None:
            return None
        return Divergence(step=self.step, call_id=rec.call_id, what=found[0], diff=found[1])
