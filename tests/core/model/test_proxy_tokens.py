"""Token capture in the recording proxy (``capture_tokens``): real loopback HTTP all the way, httpx →
the proxy → a vLLM stand-in (tests/core/model/vllm_standin.py: vLLM cannot run here; it adds vLLM's
token fields as vLLM documents them) → the scripted model.

Shown: the parameters are added only when capture is on and only where the client left them unset;
streamed and JSON answers' ids and logprobs land in tokens.jsonl attributed to the call's assistant
message; an upstream without the fields yields no token data (never made up); with capture off the
upstream receives the client's bytes unchanged and nothing is recorded.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.calls.records import ModelCallRecord, assembled_tool_calls
from opencode_tui_core.calls.token_capture import CAPTURE_PARAMS
from opencode_tui_core.model.proxy import ModelProxy
from opencode_tui_core.model.scripted import ScriptedModel
from tests.core.model.test_proxy import agent_body, headers, one_step
from tests.core.model.vllm_standin import Kind, VllmStandIn, byte_ids, logprob_of, prompt_text

Rig = tuple[ModelProxy, VllmStandIn, Path]


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Rig]]]:
    opened: list[Any] = []

    async def factory(kind: Kind = "vllm", capture: bool = True) -> Rig:
        model = await ScriptedModel(one_step()).start()
        standin = await VllmStandIn(model.url, kind).start()
        proxy = await ModelProxy(standin.url, record_dir=tmp_path, capture_tokens=capture).start()
        opened.extend([proxy, standin, model])
        return proxy, standin, tmp_path

    yield factory
    for obj in opened:
        await obj.close()


async def _ask(proxy: ModelProxy, body: dict[str, Any] | bytes, message: str = "msg_1") -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as c:
        url, h = f"{proxy.url}/chat/completions", headers(message=message)
        if isinstance(body, bytes):
            resp = await c.post(url, content=body, headers={**h, "Content-Type": "application/json"})
        else:
            resp = await c.post(url, json=body, headers=h)
    assert resp.status_code == 200, resp.text
    return resp


def _generated(rec: ModelCallRecord) -> tuple[list[int], list[float]]:
    """The ids and logprobs the stand-in gave what the call's answer said (its tool call's name and
    arguments: the scripted model's first step)."""
    ids = byte_ids("".join(name + args for name, args in assembled_tool_calls(rec.response_body)))
    return ids, [logprob_of(i) for i in ids]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
async def test_ids_and_logprobs_are_recorded_for_the_message(make_rig, stream: bool) -> None:  # type: ignore[no-untyped-def]
    proxy, standin, run_dir = await make_rig()
    body = agent_body(stream=stream)
    resp = await _ask(proxy, body)
    # The upstream was asked for tokens; the client's own record of the request is what it sent.
    [sent] = standin.chat_requests()
    assert {k: sent[k] for k in CAPTURE_PARAMS} == CAPTURE_PARAMS
    assert {k: v for k, v in sent.items() if k not in CAPTURE_PARAMS} == body
    [rec] = proxy.records
    assert rec.capture_params == list(CAPTURE_PARAMS) and rec.request_body == body
    # What the client received still reads as an answer (the fields ride along, as from vLLM).
    assert ("tool_calls" in resp.text) and (rec.finish_reason == "tool_calls") and rec.error is None
    [line] = RunDirReader(run_dir, check=False).captured_tokens()
    ids, logprobs = _generated(rec)
    assert (line.call_id, line.message_id, line.kind, line.complete) == (rec.call_id, "msg_1", "agent", True)
    assert line.prompt_token_ids == byte_ids(prompt_text(body))
    assert line.completion_token_ids == ids and line.logprobs == logprobs
    assert bytes(ids).decode().startswith('bash{"command": "ls"')
    summary = proxy.token_capture
    assert summary is not None
    assert (summary.calls, summary.calls_with_tokens, summary.completion_token_ids, summary.logprobs) == (
        1,
        1,
        len(ids),
        len(ids),
    )
    assert summary.prompt_token_ids == len(line.prompt_token_ids) > 100


async def test_a_parameter_the_client_set_is_left_as_it_is(make_rig) -> None:  # type: ignore[no-untyped-def]
    proxy, standin, run_dir = await make_rig()
    await _ask(proxy, agent_body(logprobs=False))
    [sent] = standin.chat_requests()
    assert sent["logprobs"] is False and sent["return_token_ids"] is True
    [rec] = proxy.records
    assert rec.capture_params == ["top_logprobs", "return_tokens_as_token_ids", "return_token_ids"]
    [line] = RunDirReader(run_dir, check=False).captured_tokens()
    assert line.logprobs is None  # not asked for, so not there: never filled in
    assert line.completion_token_ids == _generated(rec)[0]


async def test_an_older_vllm_gives_the_ids_through_its_logprob_tokens(make_rig) -> None:  # type: ignore[no-untyped-def]
    """vLLM before ``return_token_ids``: no ``token_ids`` and no prompt ids, but each logprob entry's
    token is ``token_id:N`` (``return_tokens_as_token_ids``)."""
    proxy, _, run_dir = await make_rig("vllm-old")
    await _ask(proxy, agent_body())
    [line] = RunDirReader(run_dir, check=False).captured_tokens()
    ids, logprobs = _generated(proxy.records[0])
    assert line.prompt_token_ids is None
    assert (line.completion_token_ids, line.logprobs) == (ids, logprobs)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "json"])
async def test_an_upstream_without_the_fields_yields_no_tokens(make_rig, stream: bool) -> None:  # type: ignore[no-untyped-def]
    proxy, standin, run_dir = await make_rig("plain")
    await _ask(proxy, agent_body(stream=stream))
    assert standin.chat_requests()[0]["return_token_ids"] is True  # asked, and ignored
    [rec] = proxy.records
    assert rec.error is None and rec.capture_params == list(CAPTURE_PARAMS)
    assert not (run_dir / RunFiles.TOKENS).exists()
    assert list(RunDirReader(run_dir, check=False).captured_tokens()) == []
    assert proxy.token_capture is not None
    assert (proxy.token_capture.calls, proxy.token_capture.calls_with_tokens) == (1, 0)


async def test_off_by_default_the_upstream_gets_the_clients_bytes_and_nothing_is_recorded(
    make_rig,  # type: ignore[no-untyped-def]
) -> None:
    proxy, standin, run_dir = await make_rig(capture=False)
    # Spacing and key order no JSON encoder here would produce: a re-encoded body would differ.
    raw = json.dumps(agent_body(), indent=3, sort_keys=True).encode()
    await _ask(proxy, raw)
    assert standin.requests == [raw]
    assert proxy.token_capture is None
    assert not (run_dir / RunFiles.TOKENS).exists()
    [line] = (run_dir / RunFiles.MODEL_CALLS).read_text().splitlines()
    assert "capture_params" not in json.loads(line)  # the record is as it was before the capture


async def test_only_chat_completions_are_asked(make_rig) -> None:  # type: ignore[no-untyped-def]
    proxy, standin, _ = await make_rig()
    async with httpx.AsyncClient(timeout=10) as c:
        assert (await c.get(f"{proxy.url}/models", headers=headers())).status_code == 200
    assert standin.requests == [b""]
    [rec] = proxy.records
    assert rec.capture_params is None
    assert proxy.token_capture is not None and proxy.token_capture.calls == 0
