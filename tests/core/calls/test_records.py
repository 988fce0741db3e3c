"""Tool calls assembled from recorded responses: a real recorded stream (the oom fixture run) and a
plain JSON response."""

from __future__ import annotations

import json
from pathlib import Path

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.calls.records import assembled_tool_calls

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"


def test_streamed_tool_call_fragments_are_assembled():
    agent = [r for r in RunDirReader(RUNS / "oom").model_calls() if r.kind == "agent"]
    calls = [assembled_tool_calls(r.response_body) for r in agent]
    [(name, args)] = calls[0]
    assert name == "bash"
    assert json.loads(args)["command"].startswith("python3 -c 'import time; blocks")
    assert calls[1][0][0] == "write" and calls[-1] == []


def test_plain_json_response_and_garbage():
    body = {
        "choices": [
            {"message": {"tool_calls": [{"function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}}
        ]
    }
    assert assembled_tool_calls(body) == [("bash", '{"command": "ls"}')]
    assert assembled_tool_calls("data: {not json\n\ndata: [DONE]\n") == []
    assert assembled_tool_calls(None) == []
