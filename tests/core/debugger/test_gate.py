"""The debugger's gate in the real recording proxy, without a sandbox: a real loopback client sends
agent requests through the proxy to the scripted model, and a person's acts come through the real
control socket (a second thread, the ``ctl`` client). No OpenCode here, so ``say``/``abort`` have no
server to reach: they are refused with the reason (the episode tests cover them with OpenCode).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import httpx
import pytest

from opencode_tui_core.breaks import BreakSyntaxError, parse_break
from opencode_tui_core.debugger.client import NotLive, request
from opencode_tui_core.debugger.control_socket import ControlSocket
from opencode_tui_core.debugger.debugger import Debugger
from opencode_tui_core.debugger.protocol import CtlRequest
from opencode_tui_core.events import (
    Event,
    FailureRecorded,
    HealthKind,
    HealthWarning,
    Intervention,
    ModelCall,
    ToolCall,
)
from opencode_tui_core.failures import DEFAULT_POLICY, FailureEvent, FailureStage, decide
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.model.hold import HandAnswer, HandToolCall, HeldCall, Release
from opencode_tui_core.model.proxy import ModelProxy
from opencode_tui_core.model.readable import assemble_response
from opencode_tui_core.model.scripted import ScriptedModel

TRAJECTORY = Path(__file__).resolve().parents[3] / "sample_tasks" / "fix-bug" / "trajectory.yaml"
AGENT_BODY = {
    "model": "scripted",
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [
        {"role": "system", "content": "You are opencode, an interactive CLI tool."},
        {"role": "user", "content": "Fix the bug."},
    ],
    "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
}


@pytest.mark.parametrize(
    ("text", "words"),
    [("next", "next"), ("call:3", "call:3"), (" tool:bash ", "tool:bash"), ("ERROR", "error")],
)
def test_break_conditions_parse(text, words):
    assert parse_break(text).words == words


@pytest.mark.parametrize("text", ["cal:2", "call:0", "call:x", "tool:", "warning:1", ""])
def test_bad_break_conditions_say_what_is_accepted(text):
    with pytest.raises(BreakSyntaxError, match=r"call:N|tool:NAME|takes no argument"):
        parse_break(text)


async def _until(check, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)


async def test_hold_answer_forward_and_release_through_the_control_socket(tmp_path):
    events: list[Event] = []
    intervened: list[str] = []
    debugger = Debugger(
        ["call:1"], emit=events.append, on_intervened=intervened.append, phase=lambda: "agent"
    )
    run_dir = tmp_path / ("r" * 120)  # longer than a Unix socket path may be: the socket is linked
    run_dir.mkdir()
    async with (
        ScriptedModel(TRAJECTORY, placeholders={"workdir": "/app"}) as model,
        ControlSocket(run_dir, debugger) as ctl,
        ModelProxy(model.url, record_dir=run_dir, gate=debugger) as proxy,
        httpx.AsyncClient(base_url=proxy.url, timeout=30) as client,
    ):
        assert ctl.path is not None and stat.S_IMODE(os.stat(ctl.path).st_mode) == 0o600
        assert (run_dir / "control.sock").is_symlink()

        def ctl_says(**kw):
            return asyncio.to_thread(request, run_dir, CtlRequest(**kw))

        first = asyncio.ensure_future(client.post("/chat/completions", json=AGENT_BODY))
        await _until(lambda: debugger.held is not None)
        status = await ctl_says(command="status")
        assert status.status and status.status.held and status.status.held.call_number == 1
        assert "[user] Fix the bug." in status.status.held.conversation
        refused = await ctl_says(command="answer", answer=HandAnswer(tool_calls=[HandToolCall(name="rm")]))
        assert not refused.ok and "offered: bash" in refused.message
        no_server = await ctl_says(command="say", text="hello")
        assert not no_server.ok and "not running yet" in no_server.message
        assert not first.done()  # nothing changed: still held
        answer = HandAnswer(
            text="by hand", tool_calls=[HandToolCall(name="bash", arguments={"command": "ls"})]
        )
        assert (await ctl_says(command="answer", answer=answer)).ok
        resp = await first
        reply = assemble_response(resp.text)
        assert resp.status_code == 200 and reply.text == "by hand"
        assert [(c.name, c.arguments) for c in reply.tool_calls] == [("bash", {"command": "ls"})]

        second = await client.post("/chat/completions", json=AGENT_BODY)  # no break: the model answers
        assert second.status_code == 200 and "by hand" not in second.text

        assert (await ctl_says(command="pause")).ok
        third = asyncio.ensure_future(client.post("/chat/completions", json=AGENT_BODY))
        await _until(lambda: debugger.held is not None)
        debugger.release_all("cancelled by SIGTERM")
        failed = await third
        assert failed.status_code == 503 and "cancelled by SIGTERM" in failed.text
        later = await ctl_says(command="continue")
        assert not later.ok and "not held" in later.message

    records = [json.loads(x) for x in (run_dir / "model_calls.jsonl").read_text().splitlines()]
    assert [r.get("answered_by") for r in records] == ["ctl", None, None]
    assert records[0]["usage"]["tokens_in"] is None and records[1]["usage"]["tokens_in"] is not None
    assert records[2]["proxy_status"] == 503
    assert [e.what for e in events if isinstance(e, Intervention)] == [
        "break",
        "answer",
        "pause",
        "break",
        "release",
    ]
    assert intervened == ["answer"]
    assert not (run_dir / "control.sock").exists()
    with pytest.raises(NotLive):
        request(run_dir, CtlRequest(command="status"))


def _tool(name: str) -> ToolCall:
    return ToolCall(call_id="c1", tool=name, status="completed")


def _failed_call() -> ModelCall:
    return ModelCall(
        call_id="mc-1",
        method="POST",
        path="/v1/chat/completions",
        status=500,
        started_at=utcnow(),
        latency_s=0.1,
    )


def _failure() -> FailureRecorded:
    failure = FailureEvent(kind="model_server_error", stage=FailureStage.AGENT, operation="x", message="x")
    return FailureRecorded(failure=failure, decision=decide(failure, attempt=1, policy=DEFAULT_POLICY))


def _health() -> HealthWarning:
    return HealthWarning(kind=next(iter(HealthKind)), message="m")


@pytest.mark.parametrize(
    ("cond", "other", "event", "reason"),
    [
        ("tool:bash", _tool("read"), _tool("bash"), "tool:bash ran"),
        ("error", _tool("bash"), _failed_call(), "error: call mc-1 failed"),
        ("failure", _failed_call(), _failure(), "failure: model_server_error"),
        ("warning", _failure(), _health(), "warning:"),
    ],
)
async def test_stream_conditions_hold_the_next_call_once(cond, other, event, reason):
    """Real events of the stream arm a condition; the next agent call is held, the one after is not."""
    recorded: list[Event] = []
    debugger = Debugger([cond], emit=recorded.append, on_intervened=lambda _: None, phase=lambda: "agent")
    call = HeldCall(call_id="mc-2", kind="agent", request_body=AGENT_BODY)
    debugger.observe(other)
    assert (await debugger.hold(call)).action is Release.FORWARD  # another event arms nothing
    debugger.observe(event)
    held = asyncio.ensure_future(debugger.hold(call))
    await _until(lambda: debugger.held is not None)
    assert debugger.held is not None and debugger.held.reason.startswith(reason)
    assert debugger.continue_("test").ok
    assert (await held).action is Release.FORWARD
    assert (await debugger.hold(call)).action is Release.FORWARD


async def test_a_held_calls_latency_is_the_models_and_the_hold_is_recorded_apart(tmp_path):
    """A person holds the call for 2 s: the record says so (``held_s``), and its latency is what the
    model took after the release (with the hold in it, the latency would exceed the hold)."""
    debugger = Debugger(
        ["call:1"], emit=lambda _e: None, on_intervened=lambda _w: None, phase=lambda: "agent"
    )
    async with (
        ScriptedModel(TRAJECTORY, placeholders={"workdir": "/app"}) as model,
        ModelProxy(model.url, record_dir=tmp_path, gate=debugger) as proxy,
        httpx.AsyncClient(base_url=proxy.url, timeout=30) as client,
    ):
        first = asyncio.ensure_future(client.post("/chat/completions", json=AGENT_BODY))
        await _until(lambda: debugger.held is not None)
        await asyncio.sleep(2.0)
        assert debugger.continue_("test").ok
        assert (await first).status_code == 200
    [rec] = [json.loads(x) for x in (tmp_path / "model_calls.jsonl").read_text().splitlines()]
    assert rec["held_s"] >= 2.0
    assert rec["latency_s"] is not None and 0 < rec["latency_s"] < rec["held_s"]
    assert 0 < rec["ttft_s"] <= rec["latency_s"]


async def test_a_client_that_hangs_up_while_held_has_its_retry_held(tmp_path):
    """OpenCode gives up on a held call after its request timeout and retries: the retry is held."""
    debugger = Debugger(["call:1"], emit=lambda _: None, on_intervened=lambda _: None, phase=lambda: "agent")
    async with (
        ScriptedModel(TRAJECTORY, placeholders={"workdir": "/app"}) as model,
        ModelProxy(model.url, record_dir=tmp_path, gate=debugger) as proxy,
    ):
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
            first = asyncio.ensure_future(client.post("/chat/completions", json=AGENT_BODY))
            await _until(lambda: debugger.held is not None)
            first.cancel()  # the client's own timeout: it closes the connection
            with pytest.raises(asyncio.CancelledError):
                await first
        await _until(lambda: debugger.held is None)
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
            retry = asyncio.ensure_future(client.post("/chat/completions", json=AGENT_BODY))
            await _until(lambda: debugger.held is not None)
            assert debugger.held is not None and "retried" in debugger.held.reason
            assert debugger.continue_("test").ok
            assert (await retry).status_code == 200


async def test_edit_forwards_the_call_and_holds_the_models_reply(tmp_path):
    """``edit`` sends the held call to the model; its reply is held until a person replaces it (or lets
    it go as it came). The edited call is marked, with the model's own reply and its tokens kept."""
    events: list[Event] = []
    debugger = Debugger(["call:1"], emit=events.append, on_intervened=lambda _: None, phase=lambda: "agent")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    async with (
        ScriptedModel(TRAJECTORY, placeholders={"workdir": "/app"}) as model,
        ControlSocket(run_dir, debugger),
        ModelProxy(model.url, record_dir=run_dir, gate=debugger) as proxy,
        httpx.AsyncClient(base_url=proxy.url, timeout=30) as client,
    ):

        def ctl_says(**kw):
            return asyncio.to_thread(request, run_dir, CtlRequest(**kw))

        first = asyncio.ensure_future(client.post("/chat/completions", json=AGENT_BODY))
        await _until(lambda: debugger.held is not None)
        early = await ctl_says(command="edit", answer=HandAnswer(text="too soon"))
        assert not early.ok and "has no reply yet" in early.message
        assert (await ctl_says(command="edit")).ok
        await _until(lambda: debugger.held is not None and debugger.held.stage == "reply")
        status = await ctl_says(command="status")
        assert status.status and status.status.held and status.status.held.stage == "reply"
        model_reply = status.status.held.reply
        assert model_reply is not None and [c.name for c in model_reply.tool_calls] == ["bash"]
        assert "HELD reply of call 1" in status.message
        assert not first.done()  # OpenCode has seen nothing yet
        again = await ctl_says(command="edit")
        assert not again.ok and "give the edited reply" in again.message
        bad = await ctl_says(command="edit", answer=HandAnswer(tool_calls=[HandToolCall(name="rm")]))
        assert not bad.ok and "edit refused" in bad.message and "offered: bash" in bad.message
        edited = HandAnswer(text="edited by hand")
        assert (await ctl_says(command="edit", answer=edited)).ok
        resp = await first
        reply = assemble_response(resp.text)
        assert resp.status_code == 200 and reply.text == "edited by hand" and not reply.tool_calls

        assert (await ctl_says(command="pause")).ok  # the next reply goes through unedited on continue
        second = asyncio.ensure_future(client.post("/chat/completions", json=AGENT_BODY))
        await _until(lambda: debugger.held is not None)
        assert (await ctl_says(command="edit")).ok
        await _until(lambda: debugger.held is not None and debugger.held.stage == "reply")
        assert (await ctl_says(command="continue")).ok
        unedited = await second
        assert unedited.status_code == 200 and "edited by hand" not in unedited.text
        assert assemble_response(unedited.text).tool_calls  # the model's reply, as it came

    records = [json.loads(x) for x in (run_dir / "model_calls.jsonl").read_text().splitlines()]
    assert [r.get("edited_by") for r in records] == ["ctl", None]
    first_rec = records[0]
    assert "edited by hand" in first_rec["response_body"]
    assert "bash" in first_rec["model_response_body"]  # the model's own reply is kept
    assert first_rec["usage"]["tokens_in"] is not None  # the model did spend these tokens
    assert records[1]["model_response_body"] is None
    assert [e.what for e in events if isinstance(e, Intervention)] == [
        "break",
        "edit",
        "reply",
        "edited",
        "pause",
        "break",
        "edit",
        "reply",
        "continue",
    ]


async def test_edit_a_json_reply(tmp_path):
    """A call that is not streamed: the held reply is a JSON completion; the edit is one too."""
    debugger = Debugger(["call:1"], emit=lambda _: None, on_intervened=lambda _: None, phase=lambda: "agent")
    body = {**AGENT_BODY, "stream": False}
    body.pop("stream_options")
    async with (
        ScriptedModel(TRAJECTORY, placeholders={"workdir": "/app"}) as model,
        ModelProxy(model.url, record_dir=tmp_path, gate=debugger) as proxy,
        httpx.AsyncClient(base_url=proxy.url, timeout=30) as client,
    ):
        first = asyncio.ensure_future(client.post("/chat/completions", json=body))
        await _until(lambda: debugger.held is not None)
        assert debugger.edit(None, "test").ok
        await _until(lambda: debugger.held is not None and debugger.held.stage == "reply")
        assert debugger.held is not None and debugger.held.reply is not None
        assert debugger.held.reply.tool_calls[0].name == "bash"
        edited = HandAnswer(tool_calls=[HandToolCall(name="bash", arguments={"command": "echo edited"})])
        assert debugger.edit(edited, "test").ok
        resp = await first
        data = resp.json()
        assert resp.status_code == 200 and data["object"] == "chat.completion"
        call = data["choices"][0]["message"]["tool_calls"][0]["function"]
        assert json.loads(call["arguments"]) == {"command": "echo edited"}
        assert (await client.post("/chat/completions", json=body)).json()["choices"]  # no hold: as is
    [rec, plain] = [json.loads(x) for x in (tmp_path / "model_calls.jsonl").read_text().splitlines()]
    assert rec["edited_by"] == "test" and rec["model_response_body"]["object"] == "chat.completion"
    assert plain.get("edited_by") is None
