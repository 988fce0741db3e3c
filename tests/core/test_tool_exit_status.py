"""A bash call's exit status, as OpenCode reports it (``state.metadata.exit``), and its duration by OpenCode's clock are on its ToolCall event:
the step view and the diff show it. A tool without one (write, task) or a status of another type: None."""

from __future__ import annotations

from opencode_tui_core.events import ToolCall
from opencode_tui_core.runtime.stream import ServeStreamTranslator


def _tool(tool: str, status: str, metadata: dict | None) -> dict:
    state: dict = {"status": status, "input": {"command": "ls missing.txt"}, "output": "no such file\n"}
    if metadata is not None:
        state["metadata"] = metadata
    part = {"id": "prt_1", "callID": "call_1", "type": "tool", "tool": tool, "sessionID": "s", "state": state}
    return {"type": "message.part.updated", "properties": {"sessionID": "s", "part": part}}


def _calls(*events: dict) -> list[ToolCall]:
    tr = ServeStreamTranslator("/app")
    tr.session_id = "s"
    return [e for ev in events for e in tr._event(ev) if isinstance(e, ToolCall)]


def test_a_bash_calls_exit_status_is_on_its_event():
    [running, done] = _calls(
        _tool("bash", "running", {"output": "no such"}),
        _tool("bash", "completed", {"output": "no such file\n", "exit": 2}),
    )
    assert (running.exit_code, done.exit_code) == (None, 2)


def test_no_exit_status_is_not_zero():
    [write] = _calls(_tool("write", "completed", {"filepath": "/app/x"}))
    [odd] = _calls(_tool("bash", "completed", {"exit": True}))
    assert write.exit_code is None and odd.exit_code is None


def test_a_tools_duration_is_opencodes_own_measure():
    timed = _tool("bash", "completed", {"exit": 0})
    timed["properties"]["part"]["state"]["time"] = {"start": 1_795_958_862_329, "end": 1_795_958_862_661}
    [done] = _calls(timed)
    [untimed] = _calls(_tool("bash", "completed", {"exit": 0}))
    assert done.duration_s == 0.332 and untimed.duration_s is None
