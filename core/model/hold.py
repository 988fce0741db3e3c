"""Holding a model call before the recording proxy forwards it (the debugger's breakpoints, issue 27).

The proxy knows nothing of breakpoints: it asks a ``CallGate`` (implemented by ``opencode_tui_core.debugger``)
what to do with each agent call and acts on the ``HoldVerdict``: forward it, answer it with a reply a
person wrote (streamed back in the chat-completions format, never sent to the model), or fail it
(a cancelled run, a passed deadline) with a 503 the agent sees as a failed call. A call forwarded with
``edit_reply`` has its reply held too, once the model answered, and asked of the gate again
(``hold_reply``): the person may replace it before OpenCode sees it.
"""

from __future__ import annotations

import json
import secrets
import time
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.model.readable import assemble_response


class HandToolCall(BaseModel):
    """One tool call a person wrote: the tool's name and its arguments (a JSON object)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class HandAnswer(BaseModel):
    """The model's reply, written by a person: text and/or tool calls."""

    model_config = ConfigDict(extra="forbid")

    text: str = ""
    tool_calls: list[HandToolCall] = Field(default_factory=list)


class Release(StrEnum):
    FORWARD = "forward"  # send it to the model as usual
    ANSWER = "answer"  # reply with ``answer``; the model never sees the request
    FAIL = "fail"  # answer 503 with ``reason`` (the run is ending)


class HoldVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Release = Release.FORWARD
    answer: HandAnswer | None = None
    reason: str | None = None
    by: str | None = None  # who wrote the answer (the intervention's ``who``)
    edit_reply: bool = False  # FORWARD: hold the model's reply for editing (``CallGate.hold_reply``)


FORWARD = HoldVerdict()


class HeldCall(BaseModel):
    """A call the proxy is about to forward, as the gate sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: str
    kind: str
    request_body: Any = None  # the parsed JSON request (None when it is not JSON)


class CallGate(Protocol):
    async def hold(self, call: HeldCall) -> HoldVerdict:
        """Return at once (no break) or when a person (or the run's end) releases the call; cancelled
        when the client goes away."""
        ...

    async def hold_reply(self, call: HeldCall, reply: HandAnswer) -> HoldVerdict:
        """The model's ``reply`` to a call forwarded with ``edit_reply``: FORWARD sends it as it came,
        ANSWER sends the person's edited reply instead, FAIL a 503."""
        ...


def offered_tools(request_body: Any) -> list[str]:
    """The names of the tools a chat-completions request offers."""
    names = []
    tools = request_body.get("tools") if isinstance(request_body, dict) else None
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def answer_problem(answer: HandAnswer, request_body: Any) -> str | None:
    """Why ``answer`` cannot be the reply to this request (None: it can)."""
    if not answer.text and not answer.tool_calls:
        return "an answer needs text or a tool call"
    offered = offered_tools(request_body)
    for call in answer.tool_calls:
        if call.name not in offered:
            listed = ", ".join(offered) if offered else "none"
            return f"the held request does not offer a tool named {call.name!r} (offered: {listed})"
    return None


def reply_of(response_body: Any) -> HandAnswer | None:
    """The model's reply (text and tool calls) from a recorded chat response, for a person to edit;
    None when it is no such reply (an error, reasoning only, a format this cannot rebuild)."""
    resp = assemble_response(response_body)
    if not resp.understood or resp.errors:
        return None
    calls = []
    for c in resp.tool_calls:
        if not isinstance(c.arguments, dict):
            return None  # arguments that are not a JSON object cannot be edited as one
        calls.append(HandToolCall(name=c.name, arguments=c.arguments))
    if not resp.text and not calls:
        return None
    return HandAnswer(text=resp.text, tool_calls=calls)


def answer_chunks(answer: HandAnswer, model: str | None) -> list[dict[str, Any]]:
    """The reply as chat-completions stream chunks (the last one carries the finish reason)."""
    base = {
        "id": f"chatcmpl-hand-{secrets.token_hex(4)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model or "hand-written",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": answer.text})]
    for i, call in enumerate(answer.tool_calls):
        fn = {"name": call.name, "arguments": json.dumps(call.arguments)}
        out.append(
            chunk({"tool_calls": [{"index": i, "id": f"call_hand_{i}", "type": "function", "function": fn}]})
        )
    out.append(chunk({}, "tool_calls" if answer.tool_calls else "stop"))
    return out


def answer_sse(answer: HandAnswer, model: str | None) -> bytes:
    events = [f"data: {json.dumps(c)}\n\n".encode() for c in answer_chunks(answer, model)]
    return b"".join(events) + b"data: [DONE]\n\n"


def answer_json(answer: HandAnswer, model: str | None) -> dict[str, Any]:
    """The reply as one (non-streamed) chat completion."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
    if answer.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_hand_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(answer.tool_calls)
        ]
    finish = "tool_calls" if answer.tool_calls else "stop"
    return {
        "id": f"chatcmpl-hand-{secrets.token_hex(4)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "hand-written",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
