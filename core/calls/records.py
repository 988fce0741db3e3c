"""``model_calls.jsonl`` (read back with ``opencode_tui_core.artifacts.RunDirReader.model_calls``): one ModelCallRecord per model call seen by the recording proxy.

Token counts are parsed from the response (the streamed usage chunk or the JSON body). A count the
response did not report stays ``None``; it is never written as 0.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.calls.classify import CallKind
from opencode_tui_core.events import ModelCall, call_failed


class TokenUsage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens_in: int | None = None  # prompt/input tokens, inclusive of cached tokens
    tokens_out: int | None = None  # completion/output tokens, inclusive of reasoning tokens
    tokens_cache_read: int | None = None
    tokens_cache_write: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _sum(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def parse_usage(usage: Any) -> TokenUsage | None:
    """Normalise an OpenAI chat, OpenAI responses or Anthropic usage object; ``None`` if not one."""
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage or "completion_tokens" in usage:  # OpenAI chat completions
        pd = usage.get("prompt_tokens_details") or {}
        cd = usage.get("completion_tokens_details") or {}
        tin, tout = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        return TokenUsage(
            tokens_in=tin,
            tokens_out=tout,
            tokens_cache_read=_int(pd.get("cached_tokens")) if isinstance(pd, dict) else None,
            tokens_reasoning=_int(cd.get("reasoning_tokens")) if isinstance(cd, dict) else None,
            tokens_total=_int(usage.get("total_tokens"))
            if _int(usage.get("total_tokens")) is not None
            else (tin + tout if tin is not None and tout is not None else None),
        )
    if "input_tokens" in usage or "output_tokens" in usage:
        idt = usage.get("input_tokens_details")
        odt = usage.get("output_tokens_details")
        if isinstance(idt, dict) or isinstance(odt, dict) or "total_tokens" in usage:  # OpenAI responses
            tin, tout = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
            return TokenUsage(
                tokens_in=tin,
                tokens_out=tout,
                tokens_cache_read=_int((idt or {}).get("cached_tokens")) if isinstance(idt, dict) else None,
                tokens_reasoning=_int((odt or {}).get("reasoning_tokens")) if isinstance(odt, dict) else None,
                tokens_total=_int(usage.get("total_tokens")),
            )
        # Anthropic: input_tokens excludes the cache; make tokens_in inclusive.
        base = _int(usage.get("input_tokens"))
        cread = _int(usage.get("cache_read_input_tokens"))
        cwrite = _int(usage.get("cache_creation_input_tokens"))
        tin = _sum(base, cread, cwrite) if base is not None else None
        tout = _int(usage.get("output_tokens"))
        return TokenUsage(
            tokens_in=tin,
            tokens_out=tout,
            tokens_cache_read=cread,
            tokens_cache_write=cwrite,
            tokens_total=tin + tout if tin is not None and tout is not None else None,
        )
    return None


def merge_usage(old: TokenUsage | None, new: TokenUsage | None) -> TokenUsage | None:
    """Later reports win field by field; fields the later report leaves unknown keep earlier values."""
    if old is None:
        return new
    if new is None:
        return old
    data = old.model_dump()
    data.update({k: v for k, v in new.model_dump().items() if v is not None})
    return TokenUsage(**data)


class AnswerFault(StrEnum):
    """Why a 2xx answer to a chat request is no answer (the call is recorded as failed)."""

    EMPTY_BODY = "empty_body"  # not one byte (llama.cpp's server after an exception inside a stream)
    NO_CHOICES = "no_choices"  # a chat-completions answer without a single choice
    UNTERMINATED = "unterminated"  # a stream that ended without [DONE] or a finish/stop event
    ERROR_OBJECT = "error_object"  # the body, or an event of the stream, is an error object
    # a chat stream that ended with nothing in it and no finish reason: the server stopped without
    # answering (llama.cpp's server does this to a title call when its chat format cannot stream)
    NOTHING = "nothing"


ANSWER_FAULT_WORDS = {
    AnswerFault.EMPTY_BODY: "an empty body",
    AnswerFault.NO_CHOICES: "no choices",
    AnswerFault.UNTERMINATED: "a stream that ended without [DONE] or a finish reason",
    AnswerFault.ERROR_OBJECT: "an error object",
    AnswerFault.NOTHING: "a stream with nothing in it and no finish reason",
}


def answer_fault_error(status: int, fault: AnswerFault, detail: str | None = None) -> str:
    """The call's ``error`` for an answer that is none: what came back, and the server's own words."""
    more = f": {detail}" if detail else ""
    return f"no answer: HTTP {status} with {ANSWER_FAULT_WORDS[fault]}{more}"


class ModelCallRecord(BaseModel):
    """The full record of one call (secrets already redacted); ``to_event()`` gives the live event."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    method: str
    path: str
    upstream_url: str | None = None
    status: int | None = None  # upstream HTTP status; None: no response from upstream
    proxy_status: int | None = None  # what the proxy answered (502 when upstream failed)
    started_at: datetime
    # From the request to the end of the answer, less the time the debugger held the call (the
    # model's time, not the person's): a held call says how long in ``held_s``.
    latency_s: float | None = None
    held_s: float | None = None  # the debugger held the request this long before it went on
    ttfb_s: float | None = None  # first response byte from upstream
    ttft_s: float | None = None  # first generated token (first content/tool-call delta)
    kind: CallKind = "other"
    session_id: str | None = None
    message_id: str | None = None
    model: str | None = None
    stream: bool | None = None
    finish_reason: str | None = None
    usage: TokenUsage = Field(default_factory=TokenUsage)
    request_headers: dict[str, str] = Field(default_factory=dict)
    request_body: Any = None
    response_headers: dict[str, str] = Field(default_factory=dict)
    response_body: Any = None
    response_bytes: int = 0
    truncated: bool = False
    stream_errors: list[str] = Field(default_factory=list)
    client_disconnected: bool = False
    error: str | None = None
    answer_fault: AnswerFault | None = None  # a 2xx that is no answer (``error`` says it in words)
    # The answer carried text, a tool call, reasoning or output tokens; None: not a chat answer.
    produced: bool | None = None
    # The reply was written by a person at a breakpoint (issue 27), not by the model: who wrote it.
    answered_by: str | None = None
    # The model answered, then a person replaced its reply before OpenCode saw it (issue 27): who.
    # ``response_body`` is what OpenCode received; ``model_response_body`` the model's own reply. The
    # usage is the model's (it did spend those tokens).
    edited_by: str | None = None
    model_response_body: Any = None
    # rerun/fork (issue 28): the parent's recorded call this answer was replayed from, not the model's.
    replayed_from: str | None = None
    # model.capture_tokens (core/calls/token_capture.py): the parameters the proxy added to the request
    # it sent upstream (``request_body`` stays what the client sent); None: forwarded as it came.
    capture_params: list[str] | None = None

    @property
    def failed(self) -> bool:
        return call_failed(self.status, self.error)

    def to_event(self) -> ModelCall:
        return ModelCall(
            call_id=self.call_id,
            method=self.method,
            path=self.path,
            status=self.status,
            started_at=self.started_at,
            latency_s=self.latency_s,
            held_s=self.held_s,
            ttft_s=self.ttft_s,
            kind=self.kind,
            session_id=self.session_id,
            message_id=self.message_id,
            tokens_in=self.usage.tokens_in,
            tokens_out=self.usage.tokens_out,
            tokens_cache_read=self.usage.tokens_cache_read,
            tokens_reasoning=self.usage.tokens_reasoning,
            error=self.error,
            answer_fault=self.answer_fault.value if self.answer_fault else None,
            produced=self.produced,
            answered_by=self.answered_by,
            edited_by=self.edited_by,
        )


def assembled_tool_calls(body: Any) -> list[tuple[str, str]]:
    """The tool calls a chat-completions response asked for, as (name, raw arguments), in order.

    Works on a plain JSON response and on a recorded server-sent stream, whose tool calls arrive in
    fragments (name first, arguments in pieces) keyed by their index.
    """
    calls: dict[int, list[str]] = {}

    def take(choice: Any) -> None:
        message = choice.get("delta") or choice.get("message") or {}
        for i, tc in enumerate(message.get("tool_calls") or []):
            slot = calls.setdefault(int(tc.get("index", i)), ["", ""])
            fn = tc.get("function") or {}
            slot[0] += fn.get("name") or ""
            slot[1] += fn.get("arguments") or ""

    chunks: list[Any] = []
    if isinstance(body, dict):
        chunks = [body]
    elif isinstance(body, str):
        for line in body.splitlines():
            data = line.removeprefix("data:").strip()
            if line.startswith("data:") and data and data != "[DONE]":
                try:
                    chunks.append(json.loads(data))
                except ValueError:
                    continue
    for chunk in chunks:
        for choice in chunk.get("choices") or [] if isinstance(chunk, dict) else []:
            if isinstance(choice, dict):
                take(choice)
    return [(name, args) for _, (name, args) in sorted(calls.items())]


def body_excerpt(body: Any, limit: int = 300) -> str | None:
    """The start of a recorded body as one line of text (a JSON body compactly), or None when empty."""
    if body is None or body == "":
        return None
    text = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"), default=str)
    text = " ".join(text.split())
    return text[:limit] + ("…" if len(text) > limit else "")


def failed_call_words(status: int | None, error: str | None, body: Any = None) -> str | None:
    """Why a call failed, in words: the proxy's error, else the upstream's error status and what its
    body said; None for a call that did not fail."""
    if error:
        return error
    if status is None or status < 400:
        return None
    excerpt = body_excerpt(body, 200)
    return f"upstream answered HTTP {status}" + (f": {excerpt}" if excerpt else "")
