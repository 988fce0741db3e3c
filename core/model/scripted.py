"""The scripted model: an OpenAI-compatible server that replays a trajectory (the embedded default model).

``POST /v1/chat/completions`` (streaming SSE or plain JSON) and ``GET /v1/models``, on 127.0.0.1 (port 0
picks one) and/or a Unix socket. Each request is classified (core/calls/classify.py):

- title request → a short title (``trajectory.title``);
- compaction request → a structured summary carrying a progress marker (``scripted-progress: N``);
- agent turn → the next trajectory step; once the trajectory is exhausted, ``final_text`` with
  ``finish_reason: stop`` so OpenCode always terminates.

Which step comes next is derived from the request alone, never from a server-side cursor:

1. Tool-call ids name their step: step ``k`` emits ids ``call_s{k}_{i}``. Every assistant tool call that
   OpenCode sends back with the history proves that step ``k`` was served and accepted.
2. A final text step ``k`` is proven by an assistant message whose text equals the step's text.
3. A compaction replaces the history with our own summary, which carries ``scripted-progress: N``
   (steps 0..N-1 were served). For the compaction request itself, N is worked out from the prior
   summary's marker plus the tool calls OpenCode renders into ``<conversation>`` (matched against the
   trajectory in order).

next step = max(marker N, 1 + highest proven step). Consequences: a retry of the same request (after a
429, a dropped stream, a client timeout) carries the same history and gets the same step; a step whose
answer never reached OpenCode is served again; a compaction resets nothing (the marker carries the count)
and does not replay old steps — replaying the huge-usage step that caused the compaction is what made
OpenCode compact in a loop. Faults are the one piece of server state: a per (session, step) attempt
counter, so ``times: 2`` fails the first two attempts at that step, whatever the request looked like.

Because the choice is per request, several sessions can share one server, each at its own step. A
subagent (the ``task`` tool) starts a child session whose history holds none of the parent's ids: its
requests are recognised by their first user message (the task's prompt) and answered from the
trajectory's ``subagents`` script of that prompt, with ids of its own (``call_a{j}s{k}_{i}``).

Usage: a step's explicit ``usage`` wins; otherwise prompt usage is ``base + per_turn * assistant turns in
the request``, which falls after a compaction, as a real model's would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from opencode_tui_core.calls.classify import CallKind, classify_body, content_text
from opencode_tui_core.model._http import (
    LAST_CHUNK,
    BufferedReader,
    HttpServer,
    HttpService,
    Request,
    chunk_bytes,
    head_bytes,
    send_simple,
)
from opencode_tui_core.model.trajectory import Step, Trajectory, Usage, fill_placeholders, load_trajectory

log = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "scripted-model"
PROGRESS_MARKER = "scripted-progress"
_MARKER_RE = re.compile(PROGRESS_MARKER + r":\s*(\d+)")
_CONVERSATION = re.compile(r"<conversation>\n(.*?)\n</conversation>", re.DOTALL)
_RENDERED_CALL = re.compile(r"^\[Assistant tool call\]:\s*([A-Za-z0-9_.:-]+)\(", re.MULTILINE)


MAIN_IDS = "call_s"  # the id prefix of the main script's tool calls; subagent j: ``call_a{j}s``


def tool_call_id(step: int, index: int, prefix: str = MAIN_IDS) -> str:
    return f"{prefix}{step}_{index}"


class Script(Protocol):
    """The steps one session is answered from: the trajectory itself, or one of its subagents."""

    @property
    def steps(self) -> list[Step]: ...

    @property
    def final_text(self) -> str: ...


@dataclass
class ServedCall:
    """One request the scripted model answered (``ScriptedModel.calls``), for tests and diagnostics."""

    seq: int
    at: float  # time.time()
    method: str
    path: str
    kind: CallKind
    status: int
    outcome: str  # step | final | title | summary | fault:<kind> | models | not_found | bad_request
    step: int | None = None
    progress: int | None = None  # steps proven served by the request (the next step index)
    subagent: int | None = None  # the subagent script answering (its index), None for the main one
    session_id: str | None = None
    stream: bool = False
    usage: dict[str, Any] | None = None
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)  # as received; kept in memory only


@dataclass
class _Reply:
    text: str = ""
    reasoning: str | None = None
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments JSON)
    usage: dict[str, Any] | None = None

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


def _assistant_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant"]


def _all_text(body: dict[str, Any]) -> str:
    return "\n".join(
        content_text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict)
    )


def _first_user_text(body: dict[str, Any]) -> str:
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def script_of(
    body: dict[str, Any], trajectory: Trajectory, placeholders: dict[str, str] | None = None
) -> tuple[Script, str, int | None]:
    """The script a request is answered from, its tool-call id prefix and its subagent index: a
    subagent's when the first user message starts with its prompt (a child session starts with it;
    a parent's history only quotes it, inside a tool call), else the main trajectory's (index None).
    A child's own compaction is not followed: its summary replaces that first message."""
    first = _first_user_text(body).strip()
    for j, sub in enumerate(trajectory.subagents):
        if first.startswith(fill_placeholders(sub.prompt, placeholders or {}).strip()):
            return sub, f"call_a{j}s", j
    return trajectory, MAIN_IDS, None


def progress_of(body: dict[str, Any], trajectory: Script, prefix: str = MAIN_IDS) -> int:
    """How many steps of a script the request proves were served (= the index of the next step)."""
    id_re = re.compile("^" + re.escape(prefix) + r"(\d+)_(\d+)$")
    best = 0
    for m in _MARKER_RE.finditer(_all_text(body)):
        best = max(best, int(m.group(1)))
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        ids = [tc.get("id") for tc in msg.get("tool_calls") or [] if isinstance(tc, dict)]
        if msg.get("role") == "tool":
            ids.append(msg.get("tool_call_id"))
        for tc_id in ids:
            found = id_re.match(str(tc_id or ""))
            if found:
                best = max(best, int(found.group(1)) + 1)
    texts = {content_text(m.get("content")).strip() for m in _assistant_messages(body)}
    texts.discard("")
    for k, step in enumerate(trajectory.steps):
        if step.final and step.text and step.text.strip() in texts:
            best = max(best, k + 1)
    return best


def compaction_progress(body: dict[str, Any], trajectory: Script, prefix: str = MAIN_IDS) -> int:
    """Progress for a compaction request: marker + structured ids + the rendered conversation."""
    base = progress_of(body, trajectory, prefix)
    text = _all_text(body)
    found = _CONVERSATION.search(text)
    conversation = found.group(1) if found else text
    # Steps proven by the prior summary are not in the conversation; walk the rest in order.
    marker = max((int(m.group(1)) for m in _MARKER_RE.finditer(text)), default=0)
    names = _RENDERED_CALL.findall(conversation)
    pos, k = 0, marker
    while k < len(trajectory.steps):
        step = trajectory.steps[k]
        if step.tool_calls:
            want = [tc.name for tc in step.tool_calls]
            if names[pos : pos + len(want)] != want:
                break
            pos += len(want)
        elif not (step.text and step.text.strip()[:60] in conversation):
            break
        k += 1
    return max(base, k)


def _assistant_turns(body: dict[str, Any]) -> int:
    return len(_assistant_messages(body))


def _usage_dict(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if usage.prompt_tokens is not None:
        out["prompt_tokens"] = usage.prompt_tokens
    if usage.completion_tokens is not None:
        out["completion_tokens"] = usage.completion_tokens
    if usage.prompt_tokens is not None and usage.completion_tokens is not None:
        out["total_tokens"] = usage.prompt_tokens + usage.completion_tokens
    if usage.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    if usage.reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


def _split(text: str, pieces: int) -> list[str]:
    if not text:
        return []
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


class ScriptedModel(HttpService):
    """Async context manager: ``async with ScriptedModel(traj) as m: ... m.url ...``.

    ``trajectory``: a Trajectory, a path to a YAML file, or a list of step dicts. ``placeholders`` fill
    ``{name}`` in tool-call arguments. ``unix_path`` listens on a Unix socket as well (``port=None``:
    only there). ``chunk_delay`` spaces streamed chunks out (seconds).
    """

    def __init__(
        self,
        trajectory: Trajectory | str | os.PathLike[str] | Sequence[dict[str, Any]],
        host: str = "127.0.0.1",
        port: int | None = 0,
        unix_path: str | os.PathLike[str] | None = None,
        *,
        placeholders: dict[str, str] | None = None,
        model_id: str = DEFAULT_MODEL_ID,
        chunk_delay: float = 0.0,
    ) -> None:
        if isinstance(trajectory, Trajectory):
            self.trajectory = trajectory
        elif isinstance(trajectory, str | os.PathLike):
            self.trajectory = load_trajectory(Path(trajectory))
        else:
            self.trajectory = Trajectory.from_data(list(trajectory))
        self.host = host
        self._port = port
        self._unix_path = unix_path
        self.placeholders = dict(placeholders or {})
        self.model_id = model_id
        self.chunk_delay = chunk_delay
        self.calls: list[ServedCall] = []
        self._fault_attempts: dict[tuple[str, str, int], int] = {}
        self._server = HttpServer(self._handle, name="scripted-model")

    # -- request handling --------------------------------------------------------------------------

    def _log(self, req: Request, **kw: Any) -> ServedCall:
        call = ServedCall(
            seq=len(self.calls) + 1,
            at=time.time(),
            method=req.method,
            path=req.path,
            session_id=req.header("x-session-id"),
            headers={k.lower(): v for k, v in req.headers},
            **kw,
        )
        self.calls.append(call)
        return call

    async def _handle(self, req: Request, reader: BufferedReader, writer: asyncio.StreamWriter) -> bool:
        path = req.path.rstrip("/")
        if req.method == "GET" and path.endswith("/models"):
            self._log(req, kind="other", status=200, outcome="models")
            data = {
                "object": "list",
                "data": [{"id": self.model_id, "object": "model", "created": 0, "owned_by": "scripted"}],
            }
            await send_simple(writer, 200, data)
            return True
        if not path.endswith("/chat/completions"):
            self._log(req, kind="other", status=404, outcome="not_found")
            await send_simple(
                writer, 404, {"error": {"message": f"no route {req.method} {req.path}", "type": "not_found"}}
            )
            return True
        if req.method != "POST":
            self._log(req, kind="other", status=405, outcome="bad_request")
            await send_simple(writer, 405, {"error": {"message": "use POST"}})
            return True
        try:
            body = req.json()
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as exc:
            self._log(req, kind="other", status=400, outcome="bad_request")
            await send_simple(
                writer,
                400,
                {"error": {"message": f"invalid JSON body: {exc}", "type": "invalid_request_error"}},
            )
            return True
        kind = classify_body(body)
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) or not stream
        session = req.header("x-session-id") or ""
        model = str(body.get("model") or self.model_id)

        step_index: int | None = None
        progress: int | None = None
        step: Step | None = None
        script, prefix, subagent = script_of(body, self.trajectory, self.placeholders)
        if kind == "title":
            reply, outcome = self._title_reply(body), "title"
        elif kind == "compaction":
            progress = compaction_progress(body, script, prefix)
            reply, outcome = self._summary_reply(body, progress, len(script.steps)), "summary"
        else:
            progress = progress_of(body, script, prefix)
            if progress < len(script.steps):
                step_index, step = progress, script.steps[progress]
                reply, outcome = self._step_reply(body, step_index, step, prefix), "step"
            else:
                reply, outcome = self._final_reply(body, script.final_text), "final"

        fault = None
        if step is not None and step.fault is not None and step_index is not None:
            key = (session, prefix, step_index)
            done = self._fault_attempts.get(key, 0)
            if done < step.fault.times:
                self._fault_attempts[key] = done + 1
                fault = step.fault
        common = dict(
            kind=kind, step=step_index, progress=progress, subagent=subagent, stream=stream, body=body
        )
        if fault is not None and fault.status is not None:
            self._log(req, status=fault.status, outcome=f"fault:{fault.kind}", **common)
            etype = "rate_limit_error" if fault.status == 429 else "server_error"
            msg = fault.message or f"scripted fault: HTTP {fault.status}"
            extra = [("Retry-After", f"{fault.retry_after:g}")] if fault.retry_after is not None else []
            await send_simple(
                writer,
                fault.status,
                {"error": {"message": msg, "type": etype, "code": fault.status}},
                headers=extra,
            )
            return True
        self._log(
            req,
            status=200,
            outcome=f"fault:{fault.kind}" if fault else outcome,
            usage=reply.usage if include_usage else None,
            **common,
        )
        if step is not None and step.delay:
            await asyncio.sleep(step.delay)
        if fault is not None and fault.empty:
            content_type = "text/event-stream" if stream else "application/json"
            writer.write(head_bytes(200, [("Content-Type", content_type), ("Content-Length", "0")]))
            await writer.drain()
            return True
        if not stream:
            await send_simple(writer, 200, self._completion_json(reply, model))
            return True
        return await self._stream(writer, reply, model, include_usage, fault)

    # -- replies -----------------------------------------------------------------------------------

    def _synth_usage(
        self, body: dict[str, Any], completion_text: str, explicit: Usage | None
    ) -> dict[str, Any]:
        cu = self.trajectory.context_usage
        usage = Usage(
            prompt_tokens=cu.base + cu.per_turn * _assistant_turns(body),
            completion_tokens=max(1, len(completion_text) // 4),
        )
        if explicit is not None:
            usage = usage.model_copy(update=explicit.model_dump(exclude_none=True))
        return _usage_dict(usage)

    def _title_reply(self, body: dict[str, Any]) -> _Reply:
        title = self.trajectory.title
        usage = _usage_dict(
            Usage(prompt_tokens=max(1, len(_all_text(body)) // 4), completion_tokens=max(1, len(title) // 4))
        )
        return _Reply(text=title, usage=usage)

    def _summary_reply(self, body: dict[str, Any], progress: int, total: int) -> _Reply:
        custom = (self.trajectory.summary or "").strip()
        text = (
            "## Objective\n- Finish the scripted task.\n\n"
            "## Important Details\n"
            f"- {PROGRESS_MARKER}: {progress} (of {total} scripted steps)\n"
            + (f"- {custom}\n" if custom else "")
            + "\n## Work State\n### Completed\n"
            + (f"- {progress} scripted step(s)\n" if progress else "- (none)\n")
            + "\n### Active\n- (none)\n\n### Blocked\n- (none)\n\n## Next Move\n"
            + ("1. Continue with the next step.\n" if progress < total else "1. (none)\n")
            + "\n## Relevant Files\n- (none)\n"
        )
        usage = _usage_dict(
            Usage(prompt_tokens=max(1, len(_all_text(body)) // 4), completion_tokens=max(1, len(text) // 4))
        )
        return _Reply(text=text, usage=usage)

    def _step_reply(self, body: dict[str, Any], index: int, step: Step, prefix: str) -> _Reply:
        calls = []
        for i, tc in enumerate(step.tool_calls):
            args = fill_placeholders(tc.arguments, self.placeholders)
            calls.append((tool_call_id(index, i, prefix), tc.name, json.dumps(args, ensure_ascii=False)))
        text = step.text or ""
        completion = text + (step.reasoning or "") + "".join(c[2] for c in calls)
        return _Reply(
            text=text,
            reasoning=step.reasoning,
            tool_calls=calls,
            usage=self._synth_usage(body, completion, step.usage),
        )

    def _final_reply(self, body: dict[str, Any], text: str) -> _Reply:
        return _Reply(text=text, usage=self._synth_usage(body, text, None))

    def _completion_json(self, reply: _Reply, model: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in reply.tool_calls
            ]
        out: dict[str, Any] = {
            "id": f"chatcmpl-scripted-{len(self.calls)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        }
        if reply.usage is not None:
            out["usage"] = reply.usage
        return out

    def _chunks(self, reply: _Reply, model: str, include_usage: bool) -> list[dict[str, Any]]:
        base = {
            "id": f"chatcmpl-scripted-{len(self.calls)}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        out = [chunk({"role": "assistant", "content": ""})]
        for piece in _split(reply.reasoning or "", 3):
            out.append(chunk({"reasoning_content": piece}))
        for piece in _split(reply.text, 4):
            out.append(chunk({"content": piece}))
        for i, (cid, name, args) in enumerate(reply.tool_calls):
            out.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": cid,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for piece in _split(args, 3):
                out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        out.append(chunk({}, reply.finish_reason))
        if include_usage and reply.usage is not None:
            out.append({**base, "choices": [], "usage": reply.usage})
        return out

    async def _stream(
        self, writer: asyncio.StreamWriter, reply: _Reply, model: str, include_usage: bool, fault: Any
    ) -> bool:
        headers = [
            ("Content-Type", "text/event-stream"),
            ("Cache-Control", "no-cache"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "keep-alive"),
        ]
        writer.write(head_bytes(200, headers))
        events = [f"data: {json.dumps(c)}\n\n".encode() for c in self._chunks(reply, model, include_usage)]
        events.append(b"data: [DONE]\n\n")
        for n, ev in enumerate(events):
            writer.write(chunk_bytes(ev))
            await writer.drain()
            if n == 0 and fault is not None:
                if fault.drop:
                    writer.transport.abort()
                    return False
                if fault.malformed:
                    writer.write(
                        chunk_bytes(b'data: {"id": "broken", "choices": [{"delta": {"content": \n\n')
                    )
                    writer.write(chunk_bytes(b"data: [DONE]\n\n") + LAST_CHUNK)
                    await writer.drain()
                    return True
                if fault.stall:
                    await asyncio.sleep(fault.stall)
            elif self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
        writer.write(LAST_CHUNK)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        return True
