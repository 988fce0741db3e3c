"""The recording proxy, over real loopback HTTP (and a Unix socket) in front of the scripted model.

Faults come from the scripted model; every call must be visible in the proxy's records with the status
OpenCode saw. One slow test runs the real OpenCode binary through the proxy.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.calls.records import ModelCallRecord, parse_usage
from opencode_tui_core.events import ModelCall
from opencode_tui_core.model.proxy import MESSAGE_ID_HEADER, ModelProxy, ProxyConfigError
from opencode_tui_core.model.scripted import ScriptedModel
from opencode_tui_core.model.trajectory import Trajectory

AGENT_SYSTEM = "You are opencode, an interactive CLI tool that helps users with software engineering tasks."
TITLE_SYSTEM = "You are a title generator. You output ONLY a thread title. Nothing else."
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
UPSTREAM_KEY = "sk-upstream-secret-0123456789abcdefXYZ"
CLIENT_KEY = "sk-sandbox-dummy-9876543210fedcbaQRS"


def agent_body(stream: bool = True, include_usage: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "scripted-model",
        "messages": [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": "go"}],
        "tools": TOOLS,
        "stream": stream,
        **extra,
    }
    if stream and include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


def headers(session: str = "ses_test1", message: str | None = None) -> dict[str, str]:
    h = {"x-session-id": session, "x-session-affinity": session, "Authorization": f"Bearer {CLIENT_KEY}"}
    if message:
        h[MESSAGE_ID_HEADER] = message
    return h


def one_step(fault: str | None = None, usage: str | None = None) -> Trajectory:
    text = "- tool_calls: [{name: bash, arguments: {command: ls, description: list}}]\n"
    if fault:
        text += f"  fault: {fault}\n"
    if usage:
        text += f"  usage: {usage}\n"
    return Trajectory.from_yaml(text + "- text: Finished.\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rig:
    def __init__(self, model: ScriptedModel, proxy: ModelProxy, events: list[ModelCall], path: Path) -> None:
        self.model, self.proxy, self.events, self.dir = model, proxy, events, path

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.dir / RunFiles.MODEL_CALLS).read_text().splitlines()]


async def rig(
    tmp_path: Path, traj: Trajectory, **proxy_kw: Any
) -> tuple[ScriptedModel, ModelProxy, list[ModelCall]]:
    events: list[ModelCall] = []
    model = await ScriptedModel(traj).start()
    proxy = await ModelProxy(model.url, record_dir=tmp_path, on_call=events.append, **proxy_kw).start()
    return model, proxy, events


@pytest.fixture
async def make_rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    opened: list[Any] = []

    async def factory(traj: Trajectory, **proxy_kw: Any) -> Rig:
        model, proxy, events = await rig(tmp_path, traj, **proxy_kw)
        opened.extend([proxy, model])
        return Rig(model, proxy, events, tmp_path)

    yield factory
    for obj in opened:
        await obj.close()


# -- normal calls, usage, events -----------------------------------------------------------------------


async def test_session_id_from_opencodes_own_header(make_rig) -> None:  # type: ignore[no-untyped-def]
    """OpenCode 1.18.32 sends its session as ``x-opencode-session`` (tests/fixtures/runs/*/model_calls.jsonl
    recorded it on every call while ``session_id`` stayed empty): the record and the event carry it."""
    r = await make_rig(one_step())
    sent = {"x-opencode-session": "ses_dd88", "Authorization": f"Bearer {CLIENT_KEY}"}
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=sent)
        assert resp.status_code == 200
    [rec] = r.proxy.records
    assert rec.session_id == "ses_dd88" and r.events[0].session_id == "ses_dd88"


async def test_streamed_call_recorded_with_usage_event_and_ids(make_rig) -> None:  # type: ignore[no-untyped-def]
    r = await make_rig(
        one_step(
            usage="{prompt_tokens: 5000, completion_tokens: 70, cached_tokens: 4096, reasoning_tokens: 12}"
        )
    )
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.post(
            f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers(message="msg_abc")
        )
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "text/event-stream"
        assert "call_s0_0" in resp.text and resp.text.rstrip().endswith("data: [DONE]")
    [rec] = r.proxy.records
    assert (rec.kind, rec.status, rec.proxy_status, rec.method, rec.path) == (
        "agent",
        200,
        200,
        "POST",
        "/v1/chat/completions",
    )
    assert rec.session_id == "ses_test1" and rec.message_id == "msg_abc"
    assert rec.model == "scripted-model" and rec.stream is True and rec.finish_reason == "tool_calls"
    assert (
        rec.usage.tokens_in,
        rec.usage.tokens_out,
        rec.usage.tokens_cache_read,
        rec.usage.tokens_reasoning,
    ) == (5000, 70, 4096, 12)
    assert rec.latency_s is not None and rec.ttfb_s is not None and rec.ttft_s is not None
    assert 0 <= rec.ttfb_s <= rec.ttft_s <= rec.latency_s
    assert rec.error is None and not rec.stream_errors
    # The attribution header is ours: it is recorded, not forwarded upstream.
    assert MESSAGE_ID_HEADER.lower() not in r.model.calls[0].headers
    [ev] = r.events
    assert isinstance(ev, ModelCall)
    assert (ev.call_id, ev.kind, ev.status, ev.message_id, ev.tokens_in, ev.tokens_cache_read) == (
        rec.call_id,
        "agent",
        200,
        "msg_abc",
        5000,
        4096,
    )
    [line] = r.lines()
    assert ModelCallRecord.model_validate(line) == rec
    assert list(RunDirReader(r.dir, check=False).model_calls()) == [rec]


async def test_unknown_usage_stays_none_and_json_usage_is_parsed(make_rig) -> None:  # type: ignore[no-untyped-def]
    r = await make_rig(one_step())
    async with httpx.AsyncClient(timeout=10) as c:
        # Streaming without include_usage: the model sends no usage chunk.
        await c.post(
            f"{r.proxy.url}/chat/completions", json=agent_body(include_usage=False), headers=headers()
        )
        # Non-streaming: usage comes from the JSON body.
        resp = await c.post(
            f"{r.proxy.url}/chat/completions", json=agent_body(stream=False), headers=headers()
        )
        assert resp.json()["choices"][0]["finish_reason"] == "tool_calls"
        # A title request and a GET are classified too.
        title = {"model": "m", "messages": [{"role": "system", "content": TITLE_SYSTEM}], "stream": False}
        await c.post(f"{r.proxy.url}/chat/completions", json=title, headers=headers())
        assert (await c.get(f"{r.proxy.url}/models")).status_code == 200
    streamed, plain, title_rec, models = r.proxy.records
    assert streamed.usage.tokens_in is None and streamed.usage.tokens_out is None
    assert streamed.usage.tokens_cache_read is None and streamed.finish_reason == "tool_calls"
    assert plain.usage.tokens_in == 1500 and plain.usage.tokens_cache_read is None
    assert isinstance(plain.response_body, dict) and plain.ttft_s == plain.ttfb_s
    assert (title_rec.kind, models.kind, models.method, models.status) == ("title", "other", "GET", 200)
    on_disk = r.lines()
    assert on_disk[0]["usage"]["tokens_in"] is None  # never 0


def test_parse_usage_shapes() -> None:
    assert parse_usage(None) is None and parse_usage({"foo": 1}) is None
    oa = parse_usage({"prompt_tokens": 10, "completion_tokens": 2})
    assert oa is not None and (oa.tokens_total, oa.tokens_cache_read) == (12, None)
    anth = parse_usage({"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 100})
    assert anth is not None and (anth.tokens_in, anth.tokens_cache_read, anth.tokens_total) == (105, 100, 108)
    resp = parse_usage(
        {
            "input_tokens": 9,
            "output_tokens": 4,
            "total_tokens": 13,
            "output_tokens_details": {"reasoning_tokens": 2},
        }
    )
    assert resp is not None and (resp.tokens_in, resp.tokens_reasoning) == (9, 2)


# -- faults --------------------------------------------------------------------------------------------


async def test_429_then_success_is_two_calls_and_the_proxy_never_retries(make_rig) -> None:  # type: ignore[no-untyped-def]
    r = await make_rig(one_step(fault="{status: 429, times: 1, retry_after: 2}"))
    async with httpx.AsyncClient(timeout=10) as c:
        first = await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers())
        assert first.status_code == 429 and first.headers["retry-after"] == "2"
        assert first.json()["error"]["type"] == "rate_limit_error"
        assert len(r.model.calls) == 1  # no retry behind the client's back
        second = await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers())
        assert second.status_code == 200
    assert [(x.status, x.kind) for x in r.proxy.records] == [(429, "agent"), (200, "agent")]
    assert r.proxy.records[0].usage.tokens_in is None and r.proxy.records[1].usage.tokens_in == 1500
    assert [e.status for e in r.events] == [429, 200]
    assert [(x.status, x.outcome) for x in r.model.calls] == [(429, "fault:status_429"), (200, "step")]


async def test_500_is_forwarded_and_recorded(make_rig) -> None:  # type: ignore[no-untyped-def]
    r = await make_rig(one_step(fault="{status: 500, message: boom}"))
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers())
    assert resp.status_code == 500 and resp.json()["error"]["message"] == "boom"
    [rec] = r.proxy.records
    assert (rec.status, rec.proxy_status, rec.error) == (500, 500, None)
    assert rec.response_body["error"]["message"] == "boom"
    assert len(r.model.calls) == 1


async def test_after_refuse_no_call_reaches_the_model_and_each_is_a_recorded_503(make_rig) -> None:  # type: ignore[no-untyped-def]
    """The episode stopped its agent (no progress): what OpenCode asks while it is being stopped is
    answered 503 by the proxy itself, recorded as a failed call, and never reaches the model."""
    r = await make_rig(one_step())
    async with httpx.AsyncClient(timeout=10) as c:
        first = await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers())
        r.proxy.refuse("the agent was stopped (model_empty_response)")
        later = [
            await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers())
            for _ in range(3)
        ]
    assert first.status_code == 200 and [x.status_code for x in later] == [503, 503, 503]
    assert "the agent was stopped (model_empty_response)" in later[0].json()["error"]["message"]
    assert len(r.model.calls) == 1  # only the call before the refusal was the model's
    assert [(x.proxy_status, x.failed) for x in r.proxy.records[1:]] == [(503, True)] * 3
    assert len(r.lines()) == 4 and len(r.events) == 4


async def test_stall_client_timeout_fires_and_is_recorded(make_rig) -> None:  # type: ignore[no-untyped-def]
    r = await make_rig(one_step(fault="{stall: 5}"))
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=0.5)) as c:
        with pytest.raises(httpx.ReadTimeout):
            async with c.stream(
                "POST", f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers()
            ) as resp:
                assert resp.status_code == 200
                async for _ in resp.aiter_bytes():
                    pass
    for _ in range(100):  # the proxy notices the client leaving without waiting for the stall
        if r.proxy.records:
            break
        await asyncio.sleep(0.05)
    [rec] = r.proxy.records
    assert rec.status == 200 and rec.client_disconnected
    assert rec.error is not None and "client disconnected" in rec.error
    assert rec.latency_s is not None and rec.latency_s < 4
    assert rec.ttfb_s is not None and rec.usage.tokens_in is None
    assert r.events[0].error == rec.error


async def test_malformed_chunk_is_relayed_and_noted(make_rig) -> None:  # type: ignore[no-untyped-def]
    r = await make_rig(one_step(fault="{malformed: true}"))
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers())
    assert resp.status_code == 200 and '"id": "broken"' in resp.text  # relayed as is
    [rec] = r.proxy.records
    assert rec.status == 200 and rec.error is None
    assert len(rec.stream_errors) == 1 and "malformed SSE data" in rec.stream_errors[0]
    assert rec.usage.tokens_in is None


async def test_dropped_connection_breaks_the_client_stream_too(make_rig) -> None:  # type: ignore[no-untyped-def]
    r = await make_rig(one_step(fault="{drop: true}"))
    async with httpx.AsyncClient(timeout=10) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers())
        # The retry (by the client) gets the same step, complete this time.
        again = await c.post(f"{r.proxy.url}/chat/completions", json=agent_body(), headers=headers())
        assert again.status_code == 200 and "call_s0_0" in again.text
    dropped, ok = r.proxy.records
    assert dropped.status == 200 and dropped.error is not None and "upstream stream broken" in dropped.error
    assert ok.error is None and ok.usage.tokens_in == 1500
    assert [x.step for x in r.model.calls] == [0, 0]


async def test_upstream_down_answers_502_and_records_the_error(tmp_path: Path) -> None:
    events: list[ModelCall] = []
    port = free_port()
    async with ModelProxy(f"http://127.0.0.1:{port}/v1", record_dir=tmp_path, on_call=events.append) as proxy:
        async with httpx.AsyncClient(timeout=10) as c:
            resp = await c.post(f"{proxy.url}/chat/completions", json=agent_body(), headers=headers())
    assert resp.status_code == 502
    assert resp.json()["error"]["type"] == "proxy_upstream_error"
    [rec] = proxy.records
    assert rec.status is None and rec.proxy_status == 502
    assert rec.error is not None and "ConnectError" in rec.error
    assert rec.usage.tokens_in is None and rec.kind == "agent"
    assert events[0].status is None and events[0].error == rec.error
    assert json.loads((tmp_path / RunFiles.MODEL_CALLS).read_text())["status"] is None


# -- secrets -------------------------------------------------------------------------------------------


async def test_api_key_injected_upstream_and_never_on_disk(make_rig, monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TEST_UPSTREAM_KEY", UPSTREAM_KEY)
    r = await make_rig(one_step(), api_key_env="TEST_UPSTREAM_KEY")
    body = agent_body()
    body["messages"].append({"role": "user", "content": f"my key is {CLIENT_KEY} and {UPSTREAM_KEY}"})
    body["api_key"] = "plain-looking-secret-value"
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.post(f"{r.proxy.url}/chat/completions", json=body, headers=headers())
    assert resp.status_code == 200
    # Upstream saw the configured key, not the sandbox's dummy key.
    assert r.model.calls[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    text = (tmp_path / RunFiles.MODEL_CALLS).read_text()
    for secret in (UPSTREAM_KEY, CLIENT_KEY, "plain-looking-secret-value", "Bearer sk-"):
        assert secret not in text
    rec = json.loads(text)
    assert rec["request_headers"]["Authorization"] == "[REDACTED]"
    assert rec["request_body"]["api_key"] == "[REDACTED]"
    assert rec["request_headers"]["x-session-id"] == "ses_test1"
    assert (tmp_path / RunFiles.MODEL_CALLS).stat().st_mode & 0o777 == 0o600
    assert UPSTREAM_KEY not in repr(r.proxy.records) and UPSTREAM_KEY not in repr(r.events)


async def test_access_token_required_on_another_address_and_wrong_ones_never_forwarded(
    tmp_path: Path,
) -> None:
    """A proxy on 127.0.0.2 with an episode token (as a worker pod serving sandboxes in other pods would
    run it): calls without the token, or with another, get 401, are recorded as refused and never
    reach the upstream; the token itself is redacted from the record."""
    token = "episode-token-0123456789abcdef"
    async with ScriptedModel(one_step()) as model:
        async with ModelProxy(model.url, record_dir=tmp_path, host="127.0.0.2", access_token=token) as proxy:
            assert proxy.url.startswith("http://127.0.0.2:")
            async with httpx.AsyncClient(timeout=10) as c:
                url = f"{proxy.url}/chat/completions"
                missing = await c.post(url, json=agent_body(), headers={"x-session-id": "ses_x"})
                wrong = await c.post(url, json=agent_body(), headers=headers())  # Bearer CLIENT_KEY
                by_key = await c.post(url, json=agent_body(), headers={"x-api-key": token})
                right = await c.post(url, json=agent_body(), headers={"Authorization": f"Bearer {token}"})
    assert [missing.status_code, wrong.status_code] == [401, 401]
    assert missing.json()["error"]["type"] == "proxy_unauthorized"
    assert by_key.status_code == 200 and right.status_code == 200
    assert len(model.calls) == 2  # only the two with the token were forwarded
    refused = [r for r in proxy.records if r.proxy_status == 401]
    assert len(refused) == 2 and all(r.status == 401 and "token" in (r.error or "") for r in refused)
    text = (tmp_path / RunFiles.MODEL_CALLS).read_text()
    assert token not in text and len(text.splitlines()) == 4


async def test_missing_key_variable_is_refused(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TEST_UPSTREAM_KEY_MISSING", raising=False)
    proxy = ModelProxy("http://127.0.0.1:9/v1", record_dir=tmp_path, api_key_env="TEST_UPSTREAM_KEY_MISSING")
    with pytest.raises(ProxyConfigError, match="TEST_UPSTREAM_KEY_MISSING"):
        await proxy.start()
    with pytest.raises(ProxyConfigError):
        ModelProxy("ftp://example/v1")


# -- transports ----------------------------------------------------------------------------------------


async def test_proxy_over_unix_socket_and_keep_alive(tmp_path: Path) -> None:
    sock = tmp_path / "proxy.sock"
    async with (
        ScriptedModel(one_step()) as model,
        ModelProxy(model.url, record_dir=tmp_path / "rec", port=None, unix_path=sock) as proxy,
    ):
        assert proxy.port is None and proxy.unix_path == str(sock)
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(transport=transport, timeout=10) as c:
            for _ in range(3):  # one connection, several requests
                resp = await c.post(
                    "http://localhost/v1/chat/completions", json=agent_body(), headers=headers()
                )
                assert resp.status_code == 200 and "call_s0_0" in resp.text
    assert [x.status for x in proxy.records] == [200, 200, 200]
    assert len((tmp_path / "rec" / RunFiles.MODEL_CALLS).read_text().splitlines()) == 3
    assert os.stat(tmp_path / "rec").st_mode & 0o777 == 0o700
    assert not sock.exists()


async def test_upstream_on_a_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "model.sock"
    async with (
        ScriptedModel(one_step(), port=None, unix_path=sock) as model,
        ModelProxy(model.url, record_dir=tmp_path, upstream_uds=sock) as proxy,
        httpx.AsyncClient(timeout=10) as c,
    ):
        resp = await c.post(f"{proxy.url}/chat/completions", json=agent_body(), headers=headers())
        assert resp.status_code == 200
    assert proxy.records[0].upstream_url == "http://localhost/v1/chat/completions"


# -- the real OpenCode ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_real_opencode_through_proxy_to_scripted_model(
    opencode_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2E_UPSTREAM_KEY", UPSTREAM_KEY)
    dirs = {name: tmp_path / name for name in ("home", "config", "data", "cache", "state", "work", "run")}
    for d in dirs.values():
        d.mkdir()
    traj = Trajectory.from_yaml(
        """
title: Write hello file
steps:
  - tool_calls:
      - name: write
        arguments: {filePath: "{workdir}/hello.txt", content: "hello from opencode\\n"}
  - text: I wrote hello.txt.
"""
    )
    events: list[ModelCall] = []
    async with (
        ScriptedModel(traj, placeholders={"workdir": str(dirs["work"])}) as model,
        ModelProxy(
            model.url, record_dir=dirs["run"], on_call=events.append, api_key_env="E2E_UPSTREAM_KEY"
        ) as proxy,
    ):
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": "scripted/scripted-model",
            "provider": {
                "scripted": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Scripted",
                    "options": {"baseURL": proxy.url, "apiKey": CLIENT_KEY},
                    "models": {
                        "scripted-model": {"name": "Scripted", "limit": {"context": 200000, "output": 8192}}
                    },
                }
            },
        }
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("OPENCODE_") and k != "E2E_UPSTREAM_KEY"
        }
        env.update(
            HOME=str(dirs["home"]),
            XDG_CONFIG_HOME=str(dirs["config"]),
            XDG_DATA_HOME=str(dirs["data"]),
            XDG_CACHE_HOME=str(dirs["cache"]),
            XDG_STATE_HOME=str(dirs["state"]),
            PWD=str(dirs["work"]),  # OpenCode takes the session directory from $PWD, not the real cwd
            OPENCODE_CONFIG_CONTENT=json.dumps(config),
            OPENCODE_DISABLE_AUTOUPDATE="1",
            OPENCODE_DISABLE_PROJECT_CONFIG="1",
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_DISABLE_SHARE="1",
        )
        proc = await asyncio.create_subprocess_exec(
            str(opencode_bin),
            "run",
            "--format",
            "json",
            cwd=dirs["work"],
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(b"Write hello.txt, then stop."), 300)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        # The title request runs alongside the agent turns; let a late one finish.
        for _ in range(50):
            if len(proxy.records) >= len(model.calls):
                break
            await asyncio.sleep(0.1)

    assert proc.returncode == 0, stderr.decode(errors="replace")[-3000:]
    out = [json.loads(line) for line in stdout.decode().splitlines() if line.strip()]
    written = dirs["work"] / "hello.txt"
    assert written.exists(), f"stdout: {stdout.decode()[-3000:]}\nstderr: {stderr.decode()[-2000:]}"
    assert written.read_text() == "hello from opencode\n"
    tools = [e["part"]["tool"] for e in out if e["type"] == "tool_use"]
    assert tools == ["write"]
    assert any(e["type"] == "text" and e["part"]["text"] == "I wrote hello.txt." for e in out)

    records = list(RunDirReader(dirs["run"], check=False).model_calls())
    kinds = sorted(r.kind for r in records)
    assert kinds == ["agent", "agent", "title"], kinds
    assert len(records) == len(model.calls) == len(events)
    assert all(r.status == 200 and r.error is None for r in records)
    session_ids = {r.session_id for r in records}
    assert len(session_ids) == 1 and next(iter(session_ids), "").startswith("ses_")
    agent = [r for r in records if r.kind == "agent"]
    assert all(r.usage.tokens_in is not None and r.usage.tokens_out is not None for r in agent)
    assert [c.outcome for c in model.calls if c.kind == "agent"] == ["step", "step"]
    assert all(c.headers["authorization"] == f"Bearer {UPSTREAM_KEY}" for c in model.calls)
    on_disk = (dirs["run"] / RunFiles.MODEL_CALLS).read_text()
    assert UPSTREAM_KEY not in on_disk and CLIENT_KEY not in on_disk
