"""The server-stream translator on bash parts shaped as OpenCode 1.18.32 sends them (observed in
tests/core/runtime/test_live_stream.py): the live window, gaps, repeats and the final notes."""

from __future__ import annotations

import json
import re

from opencode_tui_core.events import FaultKind, SandboxFault, TerminalOutput, ToolCall
from opencode_tui_core.runtime.stream import LIVE_WINDOW, LIVE_WINDOW_MARK, ServeStreamTranslator


def _bash(status: str, live: str | None = None, final: str | None = None, **metadata) -> dict:
    state: dict = {"status": status, "input": {"command": "make"}}
    if live is not None:
        state["metadata"] = {"output": live, **metadata}
    if final is not None:
        state["output"] = final
    part = {
        "id": "prt_1",
        "callID": "call_1",
        "type": "tool",
        "tool": "bash",
        "sessionID": "s",
        "state": state,
    }
    return {"type": "message.part.updated", "properties": {"sessionID": "s", "part": part}}


def _shown(tr: ServeStreamTranslator, *events: dict) -> str:
    out = []
    for ev in events:
        out += [e.data for e in tr._event(ev) if isinstance(e, TerminalOutput)]
    return "".join(out)


def _window(text: str) -> str:
    return LIVE_WINDOW_MARK + text[-LIVE_WINDOW:]


def _lines(a: int, b: int) -> str:
    return "".join(f"line {n:06d}\n" for n in range(a, b))


def test_short_output_continues_and_repeats_write_nothing():
    tr = ServeStreamTranslator("/app")
    shown = _shown(tr, _bash("running", "a\n"), _bash("running", "a\nb\n"), _bash("running", "a\nb\n"))
    assert shown.endswith("a\nb\n") and shown.count("a\n") == 1 and shown.count("b\n") == 1
    assert shown.startswith("\x1b[1;32m$\x1b[0m \x1b[1mmake")


def test_sliding_window_is_stitched_and_a_real_gap_is_marked():
    tr = ServeStreamTranslator("/app")
    upto_3k = _lines(0, 3_000)  # 36 KB: already past the window
    upto_5k = _lines(0, 5_000)  # 24 KB more: overlaps the previous window
    upto_9k = _lines(0, 9_000)  # 48 KB more: the window has moved past everything shown
    first = _shown(tr, _bash("running", _window(upto_3k)))
    second = _shown(tr, _bash("running", _window(upto_5k)))
    third = _shown(tr, _bash("running", _window(upto_9k)))
    # The first update already came windowed: what came before it was never streamed, and says so.
    assert first.count("⋯ output skipped") == 1 and first.endswith(upto_3k[-LIVE_WINDOW:])
    assert second == _lines(3_000, 5_000)
    assert third.count("⋯ output skipped") == 1 and third.endswith(upto_9k[-LIVE_WINDOW:])
    assert _lines(5_000, 6_000) not in third


def test_a_window_that_starts_inside_a_line_marks_that_line_as_cut():
    tr = ServeStreamTranslator("/app")
    shown_before = _shown(tr, _bash("running", _lines(0, 10)))
    output = _lines(0, 9_000) + "part"  # 4 characters past a line end: the window starts mid-line
    cut = _window(output)[len(LIVE_WINDOW_MARK) :]
    assert not cut.startswith("line")
    after = _shown(tr, _bash("running", _window(output)))
    assert "line 000009" in shown_before
    gap, first_line = after.splitlines()[:2]
    assert "⋯ output skipped" in gap
    assert first_line == f"\x1b[2m…\x1b[0m{cut.splitlines()[0]}"
    assert after.endswith(cut[cut.index("\n") :]) and after.count("part") == 1


def test_final_state_adds_notes_and_the_saved_output_path_once():
    tr = ServeStreamTranslator("/app", data_dir="/tmp/s/xdg/data/opencode")
    _shown(tr, _bash("running", "a\nb"))
    final = _bash(
        "completed",
        "a\nb",
        "a\nb\n\n<shell_metadata>\nshell tool terminated command after exceeding timeout 20000 ms\n",
        truncated=True,
        outputPath="/tmp/s/xdg/data/opencode/tool-output/tool_1",
    )
    events = tr._event(final)
    text = "".join(e.data for e in events if isinstance(e, TerminalOutput))
    assert text.startswith("\n") and "a\nb" not in text  # only the open line is closed
    assert "<shell_metadata>" in text and "timeout 20000 ms" in text
    assert "opencode/data/opencode/tool-output/tool_1 in the run directory" in text
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [c.status for c in calls] == ["completed"]
    assert tr._event(final) == []  # a repeated final update changes nothing


def test_silent_command_shows_the_final_text():
    tr = ServeStreamTranslator("/app")
    final = "(no output)\n\n<shell_metadata>\nterminated after exceeding timeout\n"
    text = _shown(tr, _bash("running", ""), _bash("completed", "", final))
    assert text.count("(no output)") == 1 and text.count("terminated after") == 1


def test_a_kill_during_a_command_is_said_when_it_happens_and_next_to_the_timeout_note():
    tr = ServeStreamTranslator("/app")
    _shown(tr, _bash("running", ""))
    kill = SandboxFault(
        kind=FaultKind.OOM_KILL,
        source="kernel.log",
        message="the kernel OOM-killed pid 57: python3 -c 'x'",
        pid=57,
        tool_call_id="call_1",
    )
    now = "".join(e.data for e in tr.fault(kill, "+0:05") if isinstance(e, TerminalOutput))
    assert "+0:05 the kernel OOM-killed pid 57" in now
    final = (
        "(no output)\n\n<shell_metadata>\nshell tool terminated command after exceeding timeout 20000 ms\n"
    )
    end = _shown(tr, _bash("completed", "", final))
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in end.splitlines()]
    timeout = next(i for i, line in enumerate(lines) if "exceeding timeout" in line)
    assert "had OOM-killed this command at +0:05 (pid 57)" in lines[timeout + 1], lines
    # Said once: another command's end carries no note.
    assert "OOM" not in _shown(ServeStreamTranslator("/app"), _bash("completed", "", final))


# ---- compaction: an opening marker, the summary folded, sizes when known ---------------------------
# Shaped as OpenCode sends a compaction (session/compaction.ts): a user message with a ``compaction``
# part, an assistant message with agent/mode ``compaction`` and ``summary: true`` whose text streams
# as deltas, then ``session.compacted``.


def _msg(mid: str, role: str, **info) -> dict:
    return {
        "type": "message.updated",
        "properties": {"info": {"id": mid, "role": role, "sessionID": "s", **info}},
    }


def _text(pid: str, mid: str, text: str, ended: bool = False, kind: str = "text") -> dict:
    part = {"id": pid, "messageID": mid, "sessionID": "s", "type": kind, "text": text}
    if ended:
        part["time"] = {"start": 1, "end": 2}
    return {"type": "message.part.updated", "properties": {"sessionID": "s", "part": part}}


def _delta(pid: str, mid: str, delta: str) -> dict:
    props = {"sessionID": "s", "messageID": mid, "partID": pid, "field": "text", "delta": delta}
    return {"type": "message.part.delta", "properties": props}


SUMMARY = "## Objective\nSort the file.\n\n## Progress\n- read notes.txt\n- wrote sort.py\n"


def _compaction_run(summary_info: dict) -> str:
    import re

    tr = ServeStreamTranslator("/app")
    step_tokens = {"input": 90_000, "output": 1_000, "reasoning": 0, "cache": {"read": 9_000, "write": 0}}
    shown = _shown(
        tr,
        _msg("m1", "assistant", agent="build", mode="build", tokens=step_tokens),
        _msg("m2", "user"),
        {
            "type": "message.part.updated",
            "properties": {
                "sessionID": "s",
                "part": {"id": "p2", "messageID": "m2", "sessionID": "s", "type": "compaction", "auto": True},
            },
        },
        _msg("m3", "assistant", **summary_info),
        _text("p3", "m3", ""),
        _delta("p3", "m3", SUMMARY[:20]),
        _delta("p3", "m3", SUMMARY[20:]),
        _text("p3", "m3", SUMMARY, ended=True),
        _msg(
            "m3",
            "assistant",
            tokens={"input": 100_000, "output": 1_234, "cache": {"read": 0}},
            **summary_info,
        ),
        {"type": "session.compacted", "properties": {"sessionID": "s"}},
        _msg("m4", "assistant", agent="build", mode="build"),
        _text("p4", "m4", "Continuing.", ended=True),
        _msg(
            "m4",
            "assistant",
            agent="build",
            mode="build",
            tokens={"input": 3_000, "output": 20, "cache": {"read": 500, "write": 0}},
        ),
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", shown)


def test_compaction_has_an_opening_marker_and_a_folded_summary():
    shown = _compaction_run({"agent": "compaction", "mode": "compaction", "summary": True})
    lines = shown.splitlines()
    assert lines[0] == "── compacting context (auto) · 100,000 tokens in context ──"
    assert lines[1] == f"▸ summary: ## Objective … 6 lines, {len(SUMMARY)} chars folded"
    # the size left is what the next call was sent, once it says so (not the summary's 1,234 tokens)
    assert lines[2] == "── context compacted (was 100,000 tokens) ──"
    assert lines[3] == "Continuing."
    assert lines[4] == "── context after the compaction: 3,500 tokens (the next call's input) ──"
    assert "1,234" not in shown
    assert "Sort the file." not in shown  # the summary's body is not streamed as if it were output


def test_summary_found_without_its_flags_after_a_compaction_part():
    """An older OpenCode may not flag the summary message: the first assistant message after the
    compaction part is the summary."""
    shown = _compaction_run({})
    assert "▸ summary: ## Objective" in shown and "Sort the file." not in shown


def test_event_renderer_renders_recorded_events_as_the_translator_did():
    """One renderer: a tool call or text recorded without its display rendering is rendered by
    EventRenderer exactly as the translator rendered it live (what the TUI shows for such events)."""
    from opencode_tui_core.events import TerminalOutput, ToolCall
    from opencode_tui_core.runtime.stream import EventRenderer, RunStreamTranslator

    lines = [
        {
            "type": "tool_use",
            "part": {
                "type": "tool",
                "callID": "c1",
                "tool": "edit",
                "state": {
                    "status": "completed",
                    "input": {"filePath": "/app/a.py", "oldString": "x = 1", "newString": "x = 2"},
                    "output": "ok",
                },
            },
        },
        {"type": "text", "part": {"id": "p1", "type": "text", "text": "All done.\n"}},
    ]
    events = RunStreamTranslator("/app").feed(b"".join(json.dumps(x).encode() + b"\n" for x in lines))
    shown = [e.data for e in events if isinstance(e, TerminalOutput)][1:]  # after the header
    renderer = EventRenderer("/app")
    rendered = [renderer.render(e) for e in events if not isinstance(e, TerminalOutput)]
    assert [r for r in rendered if r] == shown
    assert "--- a.py" in shown[0]
    # a bash call streamed in pieces: the prompt once, then only what is new
    r = EventRenderer()
    call = {"call_id": "b1", "tool": "bash", "input": {"command": "make"}}
    out = [
        r.render(ToolCall(status="running", output="", **call)),
        r.render(ToolCall(status="running", output="a\n", **call)),
        r.render(ToolCall(status="completed", output="a\nb\n", **call)),
        r.render(ToolCall(status="completed", output="a\nb\n", **call)),
    ]
    assert out[1:] == ["a\n", "b\n", ""] and "make" in out[0]


def test_notes_already_in_the_live_copy_are_not_repeated():
    """A silent command cut at its timeout: OpenCode's last live copy is the final text, notes included
    (seen in the recorded oom run, where the note was shown twice)."""
    tr = ServeStreamTranslator("/app")
    final = "(no output)\n\n<shell_metadata>\nshell tool terminated command after exceeding timeout\n</shell_metadata>"
    text = _shown(tr, _bash("running", ""), _bash("completed", final, final))
    assert text.count("<shell_metadata>") == 1 and text.count("(no output)") == 1


def test_a_subagents_work_is_shown_nested_once_and_not_counted_as_the_episodes():
    """Events of a child session (OpenCode's ``task`` tool) as the serve runner relays them: finished
    tool calls and texts shown under one marker; running updates, repeats and its prompt are not."""
    tr = ServeStreamTranslator("/app")
    tr._event({"type": "runner.session", "properties": {"sessionID": "s"}})
    task = _bash("running")
    task["properties"]["part"].update(tool="task")
    task["properties"]["part"]["state"]["input"] = {"description": "Write it", "prompt": "p"}
    started = tr._event(task)
    assert "▸ delegating to a subagent: Write it" in "".join(
        e.data for e in started if isinstance(e, TerminalOutput)
    )

    def child(part: dict) -> dict:
        part = {"sessionID": "child", "messageID": "m2", **part}
        return {"type": "message.part.updated", "properties": {"sessionID": "child", "part": part}}

    tr._event(
        {
            "type": "message.updated",
            "properties": {"info": {"id": "m1", "role": "user", "sessionID": "child"}},
        }
    )
    tr._event(
        {
            "type": "message.updated",
            "properties": {"info": {"id": "m2", "role": "assistant", "sessionID": "child"}},
        }
    )
    write = {"id": "p2", "type": "tool", "tool": "write", "callID": "c2"}
    state = {"input": {"filePath": "/app/a.txt", "content": "x\n"}}
    events = [
        child({"id": "p0", "messageID": "m1", "type": "text", "text": "p", "time": {"end": 1}}),  # the prompt
        child({**write, "state": {**state, "status": "running"}}),
        child({**write, "state": {**state, "status": "completed", "output": "ok"}}),
        child({**write, "state": {**state, "status": "completed", "output": "ok"}}),  # repeated
        child({"id": "p3", "type": "text", "text": "Done wri", "time": {}}),  # still streaming
        child({"id": "p3", "type": "text", "text": "Done writing.", "time": {"end": 2}}),
    ]
    out = [e for ev in events for e in tr._event(ev)]
    text = re.sub(r"\x1b\[[0-9;]*m", "", "".join(e.data for e in out if isinstance(e, TerminalOutput)))
    assert text == "┌ subagent session child\n│ +++ a.txt (new, 1 lines)\n│ +x\n│ Done writing.\n"
    assert not [e for e in out if isinstance(e, ToolCall)]
