"""The server-stream translator on bash parts shaped as OpenCode 1.18.32 sends them (observed in
tests/core/runtime/test_live_stream.py): the live window, gaps, repeats and the final notes."""

from __future__ import annotations

from core.events import TerminalOutput, ToolCall
from core.runtime.stream import LIVE_WINDOW, LIVE_WINDOW_MARK, ServeStreamTranslator


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
    assert first.endswith(upto_3k[-LIVE_WINDOW:]) and "⋯" not in first
    assert second == _lines(3_000, 5_000)
    assert "⋯ output skipped" in third and third.endswith(upto_9k[-LIVE_WINDOW:])
    assert _lines(5_000, 6_000) not in third


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
