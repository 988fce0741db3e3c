"""A call is good only if its answer is (issue 32): the recording proxy judges every 2xx chat answer.

The upstream here is a real loopback HTTP server that sends one canned answer per request, byte for
byte as a broken server would (an empty 200, a stream without choices or without an end, an error
object inside a 200); the client is httpx through the real proxy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.calls.records import AnswerFault
from opencode_tui_core.events import ModelCall
from opencode_tui_core.model.proxy import ModelProxy
from tests.core.model.test_proxy import agent_body, headers

SSE = "text/event-stream"
JSON = "application/json"


def _sse(*events: object, done: bool = True) -> bytes:
    out = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def _delta(content: str | None = None, finish: str | None = None) -> dict:
    delta = {"role": "assistant", "content": content} if content is not None else {}
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class Canned:
    """A loopback HTTP/1.1 server answering every request with (content type, body)."""

    def __init__(self, content_type: str, body: bytes) -> None:
        self.content_type, self.body = content_type, body
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        writer.write(
            f"HTTP/1.1 200 OK\r\nContent-Type: {self.content_type}\r\nContent-Length: {len(self.body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + self.body
        )
        await writer.drain()
        writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"


@pytest.fixture
async def answer(tmp_path: Path) -> AsyncIterator:
    opened: list = []

    async def call(content_type: str, body: bytes, request: dict | None = None) -> tuple:
        canned = Canned(content_type, body)
        canned.server = await asyncio.start_server(canned._serve, "127.0.0.1", 0)
        events: list[ModelCall] = []
        proxy = await ModelProxy(canned.url, record_dir=tmp_path, on_call=events.append).start()
        opened.extend([proxy, canned.server])
        async with httpx.AsyncClient(timeout=10) as c:
            resp = await c.post(
                f"{proxy.url}/chat/completions", json=request or agent_body(), headers=headers()
            )
        return resp, proxy.records[-1], events[-1]

    yield call
    for obj in opened:
        obj.close() if isinstance(obj, asyncio.Server) else await obj.close()


async def test_empty_200_stream_is_a_failed_call_relayed_as_is(answer, tmp_path: Path) -> None:
    resp, rec, ev = await answer(SSE, b"")
    assert resp.status_code == 200 and resp.content == b""  # OpenCode sees what the server sent
    assert rec.status == 200 and rec.answer_fault is AnswerFault.EMPTY_BODY and rec.failed
    assert rec.error == "no answer: HTTP 200 with an empty body" and rec.produced is False
    assert ev.failed and ev.answer_fault == "empty_body" and ev.error == rec.error
    line = json.loads((tmp_path / RunFiles.MODEL_CALLS).read_text().splitlines()[-1])
    assert line["answer_fault"] == "empty_body" and line["error"] == rec.error and line["status"] == 200


async def test_stream_without_choices_is_failed(answer) -> None:
    _, rec, _ = await answer(SSE, _sse({"id": "c", "object": "chat.completion.chunk", "choices": []}))
    assert rec.answer_fault is AnswerFault.NO_CHOICES and rec.failed


async def test_stream_without_done_or_finish_reason_is_failed(answer) -> None:
    _, rec, ev = await answer(SSE, _sse(_delta("Hel"), _delta("lo"), done=False))
    assert rec.answer_fault is AnswerFault.UNTERMINATED and ev.failed
    assert rec.produced is True and rec.ttft_s is not None  # it did say something before it broke off


async def test_error_object_inside_a_200_stream_is_failed_with_the_servers_words(answer) -> None:
    _, rec, _ = await answer(
        SSE, _sse({"error": {"message": "tool streaming is not supported", "code": 500}})
    )
    assert rec.answer_fault is AnswerFault.ERROR_OBJECT
    assert rec.error == "no answer: HTTP 200 with an error object: tool streaming is not supported"


async def test_finish_reason_without_done_is_an_answer(answer) -> None:
    """Some servers end a stream with the finish reason and no [DONE]: that is an ending."""
    _, rec, ev = await answer(SSE, _sse(_delta("Hi"), _delta(finish="stop"), done=False))
    assert rec.answer_fault is None and rec.error is None and not ev.failed and rec.produced is True


async def test_a_complete_stream_with_nothing_in_it_is_good_but_produced_nothing(answer) -> None:
    _, rec, ev = await answer(SSE, _sse(_delta(""), _delta(finish="stop")))
    assert not rec.failed and rec.produced is False and ev.produced is False


async def test_a_stream_with_nothing_in_it_and_no_finish_reason_is_failed(answer) -> None:
    """What llama.cpp's server sends a title call it cannot stream: a role-only chunk, then [DONE]."""
    role_only = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
    }
    _, rec, ev = await answer(SSE, _sse(role_only))
    assert rec.answer_fault is AnswerFault.NOTHING and ev.failed and rec.produced is False
    assert rec.error == "no answer: HTTP 200 with a stream with nothing in it and no finish reason"


async def test_json_answers_judged_too(answer) -> None:
    good = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]
    }
    _, rec, _ = await answer(JSON, json.dumps(good).encode(), agent_body(stream=False))
    assert not rec.failed and rec.produced is True
    _, rec, _ = await answer(JSON, b'{"choices": []}', agent_body(stream=False))
    assert rec.answer_fault is AnswerFault.NO_CHOICES
    _, rec, _ = await answer(JSON, b'{"error": {"message": "bad"}}', agent_body(stream=False))
    assert rec.answer_fault is AnswerFault.ERROR_OBJECT and rec.error.endswith(": bad")
    _, rec, _ = await answer(JSON, b"", agent_body(stream=False))
    assert rec.answer_fault is AnswerFault.EMPTY_BODY


async def test_models_listing_is_not_judged(tmp_path: Path) -> None:
    """Only a chat request's 2xx must carry an answer: ``GET /v1/models`` is not judged."""
    canned = Canned(JSON, b'{"data": []}')
    canned.server = await asyncio.start_server(canned._serve, "127.0.0.1", 0)
    try:
        async with ModelProxy(canned.url, record_dir=tmp_path) as proxy, httpx.AsyncClient(timeout=10) as c:
            await c.get(f"{proxy.url}/models", headers=headers())
        [rec] = proxy.records
        assert rec.answer_fault is None and rec.error is None and rec.produced is None
    finally:
        canned.server.close()


async def test_an_empty_title_answer_is_failed_too(answer) -> None:
    """OpenCode's title request (no tools, the title prompt) is judged like an agent turn."""
    title = {
        "model": "m",
        "stream": True,
        "messages": [
            {"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
            {"role": "user", "content": "hello"},
        ],
    }
    _, rec, ev = await answer(SSE, b"", title)
    assert rec.kind == "title" and rec.answer_fault is AnswerFault.EMPTY_BODY and ev.failed
