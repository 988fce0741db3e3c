"""What a person would have seen in a terminal, rebuilt from the event stream.

Terminal output (``TerminalOutput`` on the pty/display/stderr streams) is written as is. Tool calls
(``ToolCall``) become a prompt line ``$ command`` followed by the command's output (streamed: repeated
``running`` events carry the output so far, only the new part is written), file edits a short coloured
diff, other tools one dim line. Assistant text comes from OpenCode's own events (``OpenCodeEvent``:
``text``/``reasoning``/``error`` from ``opencode run --format json``, ``message.part.updated`` /
``message.part.delta`` from the server's event stream).

The harness's machine-readable stdout (``TerminalOutput`` stream ``stdout``: OpenCode's JSON lines) is
not part of this view; the raw view shows it byte for byte.

When the engine renders the transcript itself (``core.runtime.stream``: a ``display`` header first, then
a ``display`` chunk for each tool call, text and command output), that rendering is shown and this one
steps aside from the first ``display`` chunk on. Older runs rendered without a header, so a renderable
event is also held back until the next event says whether a ``display`` rendering of it follows.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable
from typing import Any

from core.events import Event, OpenCodeEvent, TerminalOutput, ToolCall
from core.runtime.stream import BOLD, CYAN, DIFF_LINES, DIM, DIM_ITALIC, GREEN, PROMPT, RED, RESET
from opencode_tui.linebuffer import LineBuffer

RENDERED_STREAMS = frozenset({"pty", "display", "stderr"})
EDIT_TOOLS = frozenset({"edit", "multiedit", "write", "patch", "apply_patch"})
TEXT_EVENTS = frozenset(
    {"text", "reasoning", "message.part.updated", "message.part.delta", "error", "session.error"}
)


def _short(value: Any, limit: int = 120) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class TranscriptWriter:
    """Feeds events into a :class:`LineBuffer`; keeps per-call and per-part progress for streaming."""

    def __init__(self, buffer: LineBuffer) -> None:
        self.buffer = buffer
        self.engine_renders = False  # set once a display chunk followed an event we would render
        self.pending: Event | None = None  # a renderable event waiting to see what follows it
        self.pending_since = 0.0
        self.on_flush: Callable[[], None] | None = None  # told right after a held-back event is rendered
        self._printed_output: dict[str, str] = {}  # bash call id -> output written so far
        self._headed: set[str] = set()  # call ids whose prompt/header line is written
        self._done: set[str] = set()
        self._parts: dict[str, str] = {}  # text part id -> text written so far
        self.owner: str | None = None  # who wrote the open line last (a part id, a call id, "term")

    # -- entry point ---------------------------------------------------------------------------

    def feed(self, event: Event) -> None:
        if isinstance(event, TerminalOutput):
            if event.stream == "display":
                self.engine_renders = (
                    True  # the engine renders (a held-back event included): use its rendering
                )
                self.pending = None
            elif self.pending is not None and event.stream in RENDERED_STREAMS:
                self.flush_pending()
            if event.stream in RENDERED_STREAMS:
                self._write("term", event.data)
            return
        if not isinstance(event, ToolCall | OpenCodeEvent):
            return
        if self.engine_renders:
            return
        if self.pending is not None:
            self.flush_pending()
        if _renders(event):
            self.pending = event
            self.pending_since = time.monotonic()

    def flush_pending(self) -> None:
        """Render the held-back event (no engine rendering of it followed)."""
        event, self.pending = self.pending, None
        if event is not None:
            self._render(event)
            if self.on_flush is not None:
                self.on_flush()

    def _render(self, event: Event) -> None:
        if isinstance(event, ToolCall):
            try:
                self._tool(event)
            except Exception as exc:  # a malformed payload must not stop the stream
                self._block(f"{RED}[tool call {event.tool} could not be shown: {exc!r}]{RESET}\n")
        elif isinstance(event, OpenCodeEvent):
            try:
                self._opencode(event)
            except Exception as exc:
                self._block(f"{RED}[opencode event {event.event_type} could not be shown: {exc!r}]{RESET}\n")

    # -- writing helpers -----------------------------------------------------------------------

    def _write(self, owner: str, text: str) -> None:
        if self.owner != owner and self.owner is not None and owner != "term":
            self.buffer.ensure_line_start()
        self.owner = owner
        self.buffer.append(text)

    def _block(self, text: str, owner: str = "block") -> None:
        self.buffer.ensure_line_start()
        self.owner = owner
        self.buffer.append(text)

    # -- tool calls ----------------------------------------------------------------------------

    def _tool(self, ev: ToolCall) -> None:
        if ev.call_id in self._done:
            return
        if ev.tool == "bash":
            self._bash(ev)
        elif ev.tool in EDIT_TOOLS:
            if ev.status != "running":
                self._edit(ev)
        elif ev.status != "running":
            mark = f"{RED}✗" if ev.status == "error" else f"{DIM}⚙"
            self._block(f"{mark} {ev.tool} {_short(ev.title or _tool_subject(ev.input))}{RESET}\n")
            if ev.status == "error" and ev.output:
                self._block(f"{RED}{_short(ev.output, 400)}{RESET}\n")
        if ev.status != "running":
            self._done.add(ev.call_id)

    def _bash(self, ev: ToolCall) -> None:
        cid = ev.call_id
        if cid not in self._headed:
            command = str(ev.input.get("command") or ev.title or "")
            lines = command.splitlines() or [""]
            head = f"{PROMPT}${RESET} {BOLD}{lines[0]}{RESET}\n"
            head += "".join(f"{PROMPT}>{RESET} {BOLD}{line}{RESET}\n" for line in lines[1:])
            self._block(head, owner=cid)
            self._headed.add(cid)
        output = ev.output or ""
        printed = self._printed_output.get(cid, "")
        if output.startswith(printed):
            new = output[len(printed) :]
        else:  # the output was rewritten (not a continuation): show it again in full
            new = output
            self.buffer.ensure_line_start()
        if new:
            self._write(cid, new)
        self._printed_output[cid] = output
        if ev.status != "running":
            self.buffer.ensure_line_start()
            if ev.status == "error":
                self.buffer.append(f"{RED}✗ {ev.title or 'command'} failed{RESET}\n")
            self.owner = None
            self._printed_output.pop(cid, None)

    def _edit(self, ev: ToolCall) -> None:
        inp = ev.input
        path = inp.get("filePath") or inp.get("path") or inp.get("file") or ev.title or "?"
        if ev.status == "error":
            self._block(f"{RED}✗ {ev.tool} {path}: {_short(ev.output or 'failed', 300)}{RESET}\n")
            return
        out = [f"{CYAN}✎ {ev.tool} {path}{RESET}\n"]
        if ev.tool == "write":
            body = str(inp.get("content") or "").splitlines()
            out += [f"{GREEN}+ {line}{RESET}\n" for line in body[:DIFF_LINES]]
            if len(body) > DIFF_LINES:
                out.append(f"{DIM}… {len(body) - DIFF_LINES} more lines{RESET}\n")
        elif ev.tool in ("patch", "apply_patch"):
            body = str(inp.get("patchText") or inp.get("patch") or "").splitlines()
            out += _diff_lines(body)
        else:
            edits = inp.get("edits") if isinstance(inp.get("edits"), list) else [inp]
            diff: list[str] = []
            for edit in edits:
                old = str(edit.get("oldString") or "").splitlines()
                new = str(edit.get("newString") or "").splitlines()
                diff += [
                    line
                    for line in difflib.unified_diff(old, new, lineterm="", n=1)
                    if not line.startswith(("---", "+++"))
                ]
            out += _diff_lines(diff)
        self._block("".join(out))

    # -- OpenCode events -----------------------------------------------------------------------

    def _opencode(self, ev: OpenCodeEvent) -> None:
        payload = ev.payload
        kind = ev.event_type
        if kind in ("text", "reasoning"):
            part = payload.get("part") if isinstance(payload.get("part"), dict) else payload
            self._text_part(part, kind, complete=True)
        elif kind == "message.part.updated":
            props = payload.get("properties", payload)
            part = props.get("part") if isinstance(props, dict) else None
            if isinstance(part, dict) and part.get("type") in ("text", "reasoning"):
                ended = bool((part.get("time") or {}).get("end"))
                self._text_part(part, part["type"], complete=ended)
        elif kind == "message.part.delta":
            props = payload.get("properties", payload)
            if props.get("field", "text") == "text" and isinstance(props.get("delta"), str):
                pid = str(props.get("partID") or props.get("id") or "delta")
                self._parts[pid] = self._parts.get(pid, "") + props["delta"]
                self._write(pid, props["delta"])
        elif kind in ("error", "session.error"):
            err = payload.get("error") or (payload.get("properties") or {}).get("error") or payload
            if isinstance(err, dict):
                data = err.get("data") if isinstance(err.get("data"), dict) else {}
                msg = data.get("message") or err.get("message") or err.get("name") or err
            else:
                msg = err
            self._block(f"{RED}✗ opencode error: {_short(msg, 400)}{RESET}\n")

    def _text_part(self, part: dict[str, Any], kind: str, complete: bool) -> None:
        text = part.get("text")
        if not isinstance(text, str):
            return
        pid = str(part.get("id") or f"{kind}-{len(self._parts)}")
        printed = self._parts.get(pid, "")
        if pid in self._done:
            return
        new = text[len(printed) :] if text.startswith(printed) else "\n" + text
        style = DIM_ITALIC if kind == "reasoning" else ""
        if new:
            self._write(pid, f"{style}{new}{RESET}" if style else new)
        self._parts[pid] = text
        if complete:
            self.buffer.ensure_line_start()
            self.owner = None
            self._done.add(pid)
            self._parts.pop(pid, None)


def _renders(event: Event) -> bool:
    """Would this event write to the terminal (so an engine rendering of it may follow)?"""
    if isinstance(event, ToolCall):
        return event.tool == "bash" or event.status != "running"
    if isinstance(event, OpenCodeEvent):
        return event.event_type in TEXT_EVENTS
    return False


def _tool_subject(inp: dict[str, Any]) -> str:
    for key in ("filePath", "path", "pattern", "url", "query", "description", "command"):
        if inp.get(key):
            return str(inp[key])
    return ""


def _diff_lines(lines: list[str]) -> list[str]:
    changed = [line for line in lines if line and line[0] in "+-@ "]
    out: list[str] = []
    for line in changed[:DIFF_LINES]:
        if line.startswith("+"):
            out.append(f"{GREEN}{line}{RESET}\n")
        elif line.startswith("-"):
            out.append(f"{RED}{line}{RESET}\n")
        elif line.startswith("@"):
            out.append(f"{CYAN}{line}{RESET}\n")
        else:
            out.append(f"{DIM}{line}{RESET}\n")
    if len(changed) > DIFF_LINES:
        out.append(f"{DIM}… {len(changed) - DIFF_LINES} more lines{RESET}\n")
    return out
