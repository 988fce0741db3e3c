"""Recorded model calls made readable: the recorded runs' real OpenCode requests and scripted-model
streams (tests/fixtures/runs), and the Anthropic shapes (constructed bodies: no Anthropic upstream here)."""

from __future__ import annotations

import json
from pathlib import Path

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.calls.records import assembled_tool_calls
from opencode_tui_core.model.readable import assemble_response, conversation

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"


def test_recorded_requests_read_as_conversations():
    agent = [r for r in RunDirReader(RUNS / "oom").model_calls() if r.kind == "agent"]
    last = conversation(agent[-1].request_body)
    body = agent[-1].request_body
    assert last.understood and last.model == body["model"]
    assert last.system == [m["content"] for m in body["messages"] if m["role"] == "system"]
    assert [t.name for t in last.tools] == [t["function"]["name"] for t in body["tools"]]
    roles = [m.role for m in last.messages]
    assert roles == [m["role"] for m in body["messages"] if m["role"] != "system"]
    calls = [c for m in last.messages for c in m.tool_calls]
    assert calls and all(c.parsed for c in calls) and calls[0].name == "bash"
    results = [m for m in last.messages if m.role == "tool"]
    assert results[0].tool_call_id == calls[0].id
    assert "tools" not in last.settings and "max_tokens" in last.settings


def test_recorded_streams_assemble_like_the_client():
    for record in RunDirReader(RUNS / "oom").model_calls():
        got = assemble_response(record.response_body)
        assert got.understood and got.streamed and got.chunks > 1
        assert got.finish_reason == record.finish_reason
        expected = [(n, json.loads(a)) for n, a in assembled_tool_calls(record.response_body)]
        assert [(c.name, c.arguments) for c in got.tool_calls] == expected
        assert got.usage is not None and got.usage["completion_tokens"] == record.usage.tokens_out
        if not expected:
            assert got.text.strip()  # a text answer, put back together from its pieces


def test_anthropic_shapes_and_garbage():
    request = {
        "model": "claude",
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "tu1", "name": "bash", "input": {"c": 1}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "ok"}]},
        ],
    }
    c = conversation(request)
    assert c.system == ["Be brief."] and c.tools[0].parameters == {"type": "object"}
    assert c.messages[1].tool_calls[0].arguments == {"c": 1} and c.messages[2].tool_call_id == "tu1"
    events = [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t", "name": "ls"},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"p'},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '": 1}'},
        },
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
    ]
    stream = "".join(f"event: x\ndata: {json.dumps(e)}\n\n" for e in events)
    got = assemble_response(stream)
    assert got.reasoning == "hmm" and [(t.name, t.arguments) for t in got.tool_calls] == [("ls", {"p": 1})]
    assert got.finish_reason == "tool_use"
    broken = assemble_response(
        'data: {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "x", "arguments": "{\\"a"}}]}}]}\n\n'
    )
    assert broken.tool_calls[0].arguments is None and broken.tool_calls[0].arguments_raw == '{"a'
    assert not conversation("not json").understood and not assemble_response(None).understood
