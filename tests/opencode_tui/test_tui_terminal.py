"""The terminal pane: line buffer, the engine's transcript rendering in it, and drawing only the visible lines."""

from __future__ import annotations

from textual.app import App, ComposeResult

from opencode_tui import linebuffer
from opencode_tui.linebuffer import LineBuffer, ansi_line, collapse_cr, raw_line
from opencode_tui.widgets.terminal import TerminalView, TranscriptFeed
from opencode_tui_core.events import OpenCodeEvent, TerminalOutput, ToolCall


def test_line_buffer_joins_chunks_and_keeps_an_open_line():
    buf = LineBuffer()
    buf.append("hel")
    buf.append("lo\nwor")
    assert buf.count == 2 and buf.lines == ["hello", "wor"]
    buf.append("ld\n")
    assert buf.count == 2 and buf.at_line_start
    buf.append("\n\n")
    assert buf.count == 4
    assert buf.chars == len("hello\nworld\n\n\n")


def test_carriage_returns_show_the_last_overwrite():
    buf = LineBuffer()
    for pct in (10, 50, 90):
        buf.append(f"progress {pct}%\r")
    assert buf.lines == ["progress 90%\r"]  # collapsed while it is the open line: no unbounded growth
    buf.append("\n")
    assert ansi_line(buf.lines[0]).plain == "progress 90%"
    assert collapse_cr("a\rb\r") == "b\r"
    assert ansi_line("crlf line\r").plain == "crlf line"


def test_ansi_is_decoded_only_when_drawn_and_raw_shows_escapes():
    text = ansi_line("\x1b[31mred\x1b[0m plain\tx")
    assert text.plain == "red plain       x"
    assert [(s.start, s.end, s.style.color.number) for s in text.spans] == [(0, 3, 1)]  # ANSI red
    assert raw_line("\x1b[31mred\x1b[0m\r").plain == "␛[31mred␛[0m␍"


def _tool(call_id, status, command="ls", output=None, tool="bash", **inp):
    return ToolCall(
        call_id=call_id, tool=tool, status=status, input={"command": command, **inp}, output=output
    )


def test_bash_calls_render_as_prompt_and_streamed_output():
    buf = LineBuffer()
    w = TranscriptFeed(buf)
    w.feed(_tool("t1", "running", "make test", output=""))
    w.feed(_tool("t1", "running", "make test", output="step 1\n"))
    w.feed(_tool("t1", "running", "make test", output="step 1\nstep 2\n"))
    w.feed(_tool("t1", "completed", "make test", output="step 1\nstep 2\nok\n"))
    w.feed(_tool("t1", "completed", "make test", output="step 1\nstep 2\nok\n"))  # repeated: ignored
    w.flush_pending()  # the last event is held back until the next one (see the engine-rendering test)
    assert buf.plain(0, buf.count) == ["$ make test", "step 1", "step 2", "ok"]


def test_failed_command_and_edits_and_other_tools():
    buf = LineBuffer()
    w = TranscriptFeed(buf)
    w.feed(_tool("t1", "error", "false", output="boom"))
    w.feed(
        ToolCall(
            call_id="t2",
            tool="edit",
            status="completed",
            input={"filePath": "a.py", "oldString": "x = 1\ny = 2", "newString": "x = 1\ny = 3"},
        )
    )
    w.feed(ToolCall(call_id="t3", tool="read", status="completed", input={"filePath": "b.py"}, title="b.py"))
    w.flush_pending()
    lines = buf.plain(0, buf.count)
    # the engine's rendering (opencode_tui_core.runtime.stream.render_tool), not one of the TUI's own
    assert lines[:3] == ["$ false", "boom", "✖ command failed"]
    assert "--- a.py" in lines and "-y = 2" in lines and "+y = 3" in lines
    assert lines[-1] == "• read b.py"


def test_assistant_text_from_run_json_and_server_events():
    buf = LineBuffer()
    w = TranscriptFeed(buf)
    w.feed(OpenCodeEvent(event_type="text", payload={"part": {"id": "p1", "type": "text", "text": "Hello."}}))
    w.feed(
        OpenCodeEvent(
            event_type="message.part.delta",
            payload={"properties": {"partID": "p2", "field": "text", "delta": "Stream"}},
        )
    )
    w.feed(
        OpenCodeEvent(
            event_type="message.part.delta",
            payload={"properties": {"partID": "p2", "field": "text", "delta": "ing"}},
        )
    )
    w.feed(
        OpenCodeEvent(
            event_type="message.part.updated",
            payload={
                "properties": {
                    "part": {"id": "p2", "type": "text", "text": "Streaming done.", "time": {"end": 1}}
                }
            },
        )
    )
    w.feed(
        OpenCodeEvent(
            event_type="error", payload={"error": {"name": "APIError", "data": {"message": "nope"}}}
        )
    )
    w.feed(OpenCodeEvent(event_type="step_finish", payload={"part": {"type": "step-finish"}}))
    assert not w.engine_renders
    assert buf.plain(0, buf.count) == ["Hello.", "Streaming done.", "✖ nope"]


def test_engine_rendering_on_the_display_stream_is_used_instead_of_our_own():
    """opencode_tui_core.runtime.stream renders each tool call/text on the display stream (older runs: right after the
    event): the TUI then shows that rendering once, not a second one."""
    buf = LineBuffer()
    w = TranscriptFeed(buf)
    w.feed(TerminalOutput(stream="display", data="[supervisor] starting\n"))
    w.feed(OpenCodeEvent(event_type="tool_use", payload={"part": {"type": "tool"}}))
    w.feed(_tool("t1", "completed", "cat a", output="A\n"))
    w.feed(TerminalOutput(stream="display", data="$ cat a (engine)\nA\n"))
    assert w.engine_renders
    w.feed(OpenCodeEvent(event_type="text", payload={"part": {"id": "p1", "type": "text", "text": "Done."}}))
    w.feed(TerminalOutput(stream="display", data="Done. (engine)\n"))
    w.flush_pending()
    assert buf.plain(0, buf.count) == ["[supervisor] starting", "$ cat a (engine)", "A", "Done. (engine)"]


def test_malformed_payloads_never_break_the_stream():
    buf = LineBuffer()
    w = TranscriptFeed(buf)
    w.feed(OpenCodeEvent(event_type="message.part.updated", payload={"properties": "not a dict"}))
    w.feed(ToolCall(call_id="x", tool="edit", status="completed", input={"edits": [{"oldString": 5}]}))
    w.feed(TerminalOutput(stream="stdout", data="machine readable\n"))  # raw view only
    w.flush_pending()
    assert "machine readable" not in buf.plain(0, buf.count)


class TerminalApp(App):
    def compose(self) -> ComposeResult:
        yield TerminalView()


async def test_only_visible_lines_are_decoded(monkeypatch):
    decoded: list[str] = []
    real = linebuffer.ansi_line

    def counting(raw: str):
        decoded.append(raw)
        return real(raw)

    monkeypatch.setattr("opencode_tui.widgets.terminal.ansi_line", counting)
    app = TerminalApp()
    async with app.run_test(size=(100, 30)) as pilot:
        term = app.query_one(TerminalView)
        chunk = "".join(f"\x1b[3{i % 8}mline {i}\x1b[0m\n" for i in range(200_000))
        term.ingest([TerminalOutput(stream="pty", data=chunk)])
        term.refresh_content()
        await pilot.pause()
        assert term.line_count == 200_000
        assert term.scroll_offset.y == term.max_scroll_y  # following the end
        assert len(decoded) <= 2 * 30, len(decoded)
        assert decoded and decoded[-1].endswith("line 199999\x1b[0m")
        # scrolling up pauses following; the selection copies plain text of those lines only
        await pilot.press("pageup")
        assert not term.follow
        from textual.geometry import Offset
        from textual.selection import Selection

        text, _ = term.get_selection(Selection(Offset(2, 10), Offset(6, 12)))
        assert text == "ne 10\nline 11\nline 1"
