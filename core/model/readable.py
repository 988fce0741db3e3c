"""A recorded model call made readable: the request as a conversation, the response assembled.

The proxy records bodies as they went over the wire (``opencode_tui_core.calls.records.ModelCallRecord``): the
request as JSON, a streamed response as its raw server-sent events, tool arguments in fragments. These
functions turn them into what a person debugging an episode reads: who said what (the system prompt and
tool list apart, since they are long and the same on every call), and what the model answered (its
text, its reasoning, each tool call with its arguments parsed).

Understood: OpenAI chat completions (plain and streamed) and Anthropic messages (plain and streamed).
Anything else is reported as not understood, and the raw body is the reference.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ToolCallMade(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    name: str
    arguments_raw: str = ""
    arguments: Any = None  # parsed JSON; None when the raw text is not JSON (then it is shown as is)

    @property
    def parsed(self) -> bool:
        return self.arguments is not None


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str
    text: str = ""
    tool_calls: list[ToolCallMade] = Field(default_factory=list)
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None
    other_parts: list[str] = Field(default_factory=list)  # e.g. "image_url": named, not shown


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    parameters: Any = None


class Conversation(BaseModel):
    """A request: the system prompt(s), the tools offered, the messages, the sampling settings."""

    model_config = ConfigDict(extra="forbid")

    understood: bool = True
    model: str | None = None
    system: list[str] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    messages: list[Message] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)  # max_tokens, stream, tool_choice, …


class AssembledResponse(BaseModel):
    """A response as the client assembled it from the stream (or read it from the JSON body)."""

    model_config = ConfigDict(extra="forbid")

    understood: bool = True
    streamed: bool = False
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallMade] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    errors: list[str] = Field(default_factory=list)  # error events in the stream, bad chunks
    chunks: int = 0


def _json(body: Any) -> Any:
    if isinstance(body, str | bytes):
        try:
            return json.loads(body)
        except ValueError:
            return body
    return body


def _text_of(content: Any) -> tuple[str, list[str]]:
    """Text of a message's content (a string or a list of parts) and the names of non-text parts."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    other: list[str] = []
    for part in content if isinstance(content, list) else [content]:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            kind = str(part.get("type", "?"))
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "tool_result":
                inner, _ = _text_of(part.get("content"))
                texts.append(inner)
            elif kind not in ("tool_use",):
                other.append(kind)
    return "\n".join(texts), other


def _call(name: Any, raw: Any, call_id: Any = None) -> ToolCallMade:
    if isinstance(raw, str):
        text = raw
        try:
            parsed = json.loads(raw) if raw.strip() else {}
        except ValueError:
            parsed = None
    else:  # Anthropic gives the input already parsed
        parsed = raw if raw is not None else {}
        text = json.dumps(parsed)
    return ToolCallMade(
        id=str(call_id) if call_id is not None else None,
        name=str(name or "?"),
        arguments_raw=text,
        arguments=parsed,
    )


def conversation(body: Any) -> Conversation:
    """The request ``body`` (a recorded ``request_body``) as a conversation."""
    body = _json(body)
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return Conversation(understood=False)
    out = Conversation(model=body.get("model") if isinstance(body.get("model"), str) else None)
    system = body.get("system")  # Anthropic: top level
    if system is not None:
        text, _ = _text_of(system)
        out.system.append(text)
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        fn = v if isinstance(v := tool.get("function"), dict) else tool
        out.tools.append(
            ToolSpec(
                name=str(fn.get("name") or "?"),
                description=str(fn.get("description") or ""),
                parameters=fn.get("parameters", fn.get("input_schema")),
            )
        )
    for m in body["messages"]:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role") or "?")
        text, other = _text_of(m.get("content"))
        if role == "system":
            out.system.append(text)
            continue
        msg = Message(role=role, text=text, other_parts=other, name=m.get("name"))
        msg.tool_call_id = m.get("tool_call_id")
        for tc in m.get("tool_calls") or []:  # OpenAI: an assistant's calls
            fn = tc.get("function") or {}
            msg.tool_calls.append(_call(fn.get("name"), fn.get("arguments") or "", tc.get("id")))
        if isinstance(m.get("content"), list):  # Anthropic: tool_use / tool_result blocks
            for part in m["content"]:
                if isinstance(part, dict) and part.get("type") == "tool_use":
                    msg.tool_calls.append(_call(part.get("name"), part.get("input"), part.get("id")))
                elif isinstance(part, dict) and part.get("type") == "tool_result":
                    msg.tool_call_id = str(part.get("tool_use_id"))
        out.messages.append(msg)
    skip = {"messages", "tools", "system", "model"}
    out.settings = {k: v for k, v in body.items() if k not in skip}
    return out


def _sse_data(body: str) -> list[str]:
    return [
        line.removeprefix("data:").strip()
        for line in body.splitlines()
        if line.startswith("data:") and line.removeprefix("data:").strip() not in ("", "[DONE]")
    ]


def assemble_response(body: Any) -> AssembledResponse:
    """The response ``body`` (a recorded ``response_body``: JSON, or the raw server-sent events)."""
    if isinstance(body, str) and body.lstrip().startswith(("data:", "event:")):
        return _assemble_stream(body)
    data = _json(body)
    if not isinstance(data, dict):
        return AssembledResponse(understood=False)
    out = AssembledResponse(usage=data.get("usage") if isinstance(data.get("usage"), dict) else None)
    if isinstance(data.get("error"), dict | str):
        out.errors.append(json.dumps(data["error"]) if isinstance(data["error"], dict) else data["error"])
    choices = data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):  # OpenAI chat
        choice = choices[0]
        msg = choice.get("message") or {}
        out.text, _ = _text_of(msg.get("content"))
        out.reasoning = str(msg.get("reasoning_content") or msg.get("reasoning") or "")
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function") or {}
            out.tool_calls.append(_call(fn.get("name"), fn.get("arguments") or "", tc.get("id")))
        out.finish_reason = choice.get("finish_reason")
        return out
    if isinstance(data.get("content"), list):  # Anthropic messages
        for part in data["content"]:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                out.text += str(part.get("text") or "")
            elif part.get("type") == "thinking":
                out.reasoning += str(part.get("thinking") or "")
            elif part.get("type") == "tool_use":
                out.tool_calls.append(_call(part.get("name"), part.get("input"), part.get("id")))
        out.finish_reason = data.get("stop_reason")
        return out
    out.understood = bool(out.errors)
    return out


def _assemble_stream(body: str) -> AssembledResponse:
    out = AssembledResponse(streamed=True)
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]
    blocks: dict[int, dict[str, Any]] = {}  # Anthropic content blocks by index
    for data in _sse_data(body):
        try:
            chunk = json.loads(data)
        except ValueError:
            out.errors.append(f"not JSON: {data[:200]}")
            continue
        if not isinstance(chunk, dict):
            continue
        out.chunks += 1
        if isinstance(chunk.get("usage"), dict):
            out.usage = chunk["usage"]
        if "error" in chunk:
            out.errors.append(json.dumps(chunk["error"]))
        for choice in chunk.get("choices") or []:  # OpenAI chat
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                out.text += delta["content"]
            for key in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    out.reasoning += delta[key]
            for i, tc in enumerate(delta.get("tool_calls") or []):
                slot = calls.setdefault(int(tc.get("index", i)), ["", "", ""])
                if tc.get("id"):
                    slot[0] = str(tc["id"])
                fn = tc.get("function") or {}
                slot[1] += fn.get("name") or ""
                slot[2] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
        kind = chunk.get("type")  # Anthropic events
        if kind == "content_block_start" and isinstance(chunk.get("content_block"), dict):
            block = dict(chunk["content_block"])
            block.setdefault("partial", "")
            blocks[int(chunk.get("index", len(blocks)))] = block
        elif kind == "content_block_delta" and isinstance(chunk.get("delta"), dict):
            delta = chunk["delta"]
            block = blocks.setdefault(int(chunk.get("index", 0)), {"type": "text", "partial": ""})
            if delta.get("type") == "text_delta":
                out.text += str(delta.get("text") or "")
            elif delta.get("type") == "thinking_delta":
                out.reasoning += str(delta.get("thinking") or "")
            elif delta.get("type") == "input_json_delta":
                block["partial"] += str(delta.get("partial_json") or "")
        elif kind == "message_delta" and isinstance(chunk.get("delta"), dict):
            out.finish_reason = chunk["delta"].get("stop_reason") or out.finish_reason
    for _, (cid, name, args) in sorted(calls.items()):
        out.tool_calls.append(_call(name, args, cid or None))
    for _, block in sorted(blocks.items()):
        if block.get("type") == "tool_use":
            out.tool_calls.append(_call(block.get("name"), block.get("partial") or "{}", block.get("id")))
    out.understood = out.chunks > 0
    return out
