"""A stand-in for vLLM's token fields (vLLM itself cannot run here): a real loopback HTTP server in
front of another OpenAI-compatible server (the scripted model) that forwards every request and, on a
chat-completions answer, adds what vLLM's OpenAI server adds when the request asks for it:

- ``return_token_ids: true`` (vLLM >= 0.10.2): the prompt's ids as a top-level ``prompt_token_ids``
  (on a stream: its first chunk only) and each choice's new ids as ``token_ids`` (on a stream: that
  chunk's ids);
- ``logprobs: true``: ``choices[i].logprobs.content``, one ``{token, logprob, bytes, top_logprobs}``
  per generated token (``top_logprobs`` entries: as many as ``top_logprobs`` asks, here none), and
  with ``return_tokens_as_token_ids: true`` each ``token`` is ``"token_id:<id>"``.

The "tokenizer" is UTF-8 bytes: a prompt's ids are the bytes of its messages as JSON, a chunk's ids the
bytes of the text, reasoning and tool-call fragments it carries, so a test can decode what was
captured and compare it with what was said. Each logprob is a function of its id. ``kind`` picks the
server: ``vllm`` (all of the above), ``vllm-old`` (logprobs only: vLLM before ``return_token_ids``) or
``plain`` (a server that ignores the parameters: answers pass through untouched).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import httpx

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

Kind = Literal["vllm", "vllm-old", "plain"]


def byte_ids(text: str) -> list[int]:
    """The stand-in's tokenizer: a token per UTF-8 byte."""
    return list(text.encode("utf-8"))


def logprob_of(token_id: int) -> float:
    """The logprob the stand-in gives a token: negative, and a function of the id alone."""
    return -round(0.05 + (token_id % 10) / 10, 2)


def prompt_text(body: dict[str, Any]) -> str:
    """What the stand-in tokenizes as a request's prompt: its messages as compact JSON."""
    return json.dumps(body.get("messages") or [], ensure_ascii=False, separators=(",", ":"))


def said(part: dict[str, Any]) -> str:
    """The generated text a delta (or a whole message) carries: text, reasoning, tool-call pieces."""
    out = [str(part.get(k) or "") for k in ("reasoning_content", "content")]
    for call in part.get("tool_calls") or []:
        fn = call.get("function") or {}
        out += [str(fn.get("name") or ""), str(fn.get("arguments") or "")]
    return "".join(out)


class VllmStandIn(HttpService):
    """``async with VllmStandIn(upstream_url) as v:`` → ``v.url``; ``v.requests`` holds the raw body of
    every request it received, in order."""

    def __init__(self, upstream_url: str, kind: Kind = "vllm") -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.kind = kind
        self.host = "127.0.0.1"
        self._port: int | None = 0
        self._unix_path = None
        self._server = HttpServer(self._handle, name="vllm-standin")
        self._client = httpx.AsyncClient(timeout=60)
        self.requests: list[bytes] = []

    async def close(self) -> None:
        await super().close()
        await self._client.aclose()

    def chat_requests(self) -> list[dict[str, Any]]:
        """The chat-completions request bodies received, parsed."""
        return [json.loads(b) for b in self.requests if b and b"messages" in b]

    async def _handle(self, req: Request, reader: BufferedReader, writer: asyncio.StreamWriter) -> bool:
        self.requests.append(req.body)
        rest = req.path[3:] if req.path.startswith("/v1") else req.path
        headers = [
            (k, v) for k, v in req.headers if k.lower() not in ("host", "content-length", "connection")
        ]
        upstream = self._client.build_request(
            req.method, self.upstream_url + rest, headers=headers, content=req.body or None
        )
        resp = await self._client.send(upstream, stream=True)
        try:
            asked = json.loads(req.body) if req.body and rest.endswith("/chat/completions") else None
            if "text/event-stream" in resp.headers.get("content-type", ""):
                await self._stream(resp, asked, writer)
            else:
                data = await resp.aread()
                body = json.loads(data) if data else {}
                if isinstance(asked, dict) and isinstance(body, dict):
                    self._decorate(body, asked, said((body.get("choices") or [{}])[0].get("message") or {}))
                await send_simple(writer, resp.status_code, body)
        finally:
            await resp.aclose()
        return True

    async def _stream(
        self, resp: httpx.Response, asked: dict[str, Any] | None, writer: asyncio.StreamWriter
    ) -> None:
        head = [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")]
        writer.write(head_bytes(resp.status_code, head))
        first, buf = True, b""
        async for data in resp.aiter_raw():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                payload = event.removeprefix(b"data:").strip()
                if isinstance(asked, dict) and payload and payload != b"[DONE]":
                    chunk = json.loads(payload)
                    choices = chunk.get("choices") or []
                    if choices:
                        self._decorate(chunk, asked, said(choices[0].get("delta") or {}), first=first)
                        first = False
                    event = b"data: " + json.dumps(chunk).encode()
                writer.write(chunk_bytes(event + b"\n\n"))
                await writer.drain()
        writer.write(LAST_CHUNK)
        await writer.drain()

    def _decorate(self, obj: dict[str, Any], asked: dict[str, Any], text: str, first: bool = True) -> None:
        """Add vLLM's token fields to a response or a chunk, as far as ``asked`` and ``kind`` say."""
        if self.kind == "plain":
            return
        ids = byte_ids(text)
        choice = obj["choices"][0]
        if self.kind == "vllm" and asked.get("return_token_ids"):
            if first:
                obj["prompt_token_ids"] = byte_ids(prompt_text(asked))
            choice["token_ids"] = ids
        if asked.get("logprobs"):
            as_ids = asked.get("return_tokens_as_token_ids")
            choice["logprobs"] = {
                "content": [
                    {
                        "token": f"token_id:{i}" if as_ids else chr(i),
                        "logprob": logprob_of(i),
                        "bytes": [i],
                        "top_logprobs": [],
                    }
                    for i in ids
                ]
            }
