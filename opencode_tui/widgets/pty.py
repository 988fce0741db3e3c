"""An interactive terminal inside the TUI: a pyte screen over a sandbox PTY handle.

Human-paced (pyte parses at well under 1 MB/s, plenty for typing); the episode's own output goes through
the much faster line-based :class:`~opencode_tui.widgets.terminal.TerminalView` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pyte
from rich.segment import Segment
from rich.style import Style
from textual import events, work
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from opencode_tui_core.sandbox import PtyHandle

OpenPty = Callable[[int, int], Awaitable[PtyHandle]]
EXITED = "the shell exited"  # its output ended: ``exit``, or its process was killed (the screen says which)

KEYS: dict[str, str] = {
    "enter": "\r",
    "tab": "\t",
    "shift+tab": "\x1b[Z",
    "backspace": "\x7f",
    "escape": "\x1b",
    "up": "\x1b[A",
    "down": "\x1b[B",
    "right": "\x1b[C",
    "left": "\x1b[D",
    "home": "\x1b[H",
    "end": "\x1b[F",
    "pageup": "\x1b[5~",
    "pagedown": "\x1b[6~",
    "insert": "\x1b[2~",
    "delete": "\x1b[3~",
    "ctrl+space": "\x00",
    "ctrl+@": "\x00",
    "f1": "\x1bOP",
    "f2": "\x1bOQ",
    "f3": "\x1bOR",
    "f4": "\x1bOS",
    "f5": "\x1b[15~",
    "f6": "\x1b[17~",
    "f7": "\x1b[18~",
    "f8": "\x1b[19~",
    "f9": "\x1b[20~",
    "f10": "\x1b[21~",
    "f11": "\x1b[23~",
    "f12": "\x1b[24~",
}


def key_bytes(key: str, character: str | None) -> bytes | None:
    """What a terminal sends for a Textual key event (None: nothing to send)."""
    if key in KEYS:
        return KEYS[key].encode()
    if key.startswith("ctrl+") and len(key) == 6 and key[5].isalpha():
        return bytes([ord(key[5].lower()) - 96])
    if character and (character.isprintable() or character in "\t\r\x1b"):
        return character.encode("utf-8")
    if character and len(character) == 1 and ord(character) < 32:
        return character.encode()
    return None


def _color(name: str) -> str | None:
    if name == "default":
        return None
    if len(name) == 6 and all(c in "0123456789abcdefABCDEF" for c in name):
        return f"#{name}"
    name = name.replace("brown", "yellow")
    if name.startswith("bright"):
        return f"bright_{name[6:]}"
    return name


class PtyTerminal(Widget, can_focus=True):
    """Keys go to the PTY (except the app's priority bindings); output is drawn from the pyte screen."""

    class Closed(Message):
        def __init__(self, reason: str) -> None:
            self.reason = reason
            super().__init__()

    class Opened(Message):
        pass

    def __init__(self, open_pty: OpenPty, **kwargs) -> None:
        super().__init__(**kwargs)
        self._open_pty = open_pty
        self.handle: PtyHandle | None = None
        self.screen_buffer = pyte.Screen(80, 24)
        self.stream = pyte.ByteStream(self.screen_buffer)
        self._styles: dict[tuple, Style] = {}
        self.closed = False
        self.bytes_read = 0

    def on_mount(self) -> None:
        # Opened once laid out: the PTY (and its recording's header) get the widget's real size, not
        # a placeholder of a widget that has no size yet.
        self.call_after_refresh(self._run)

    @work(exclusive=True, group="pty")
    async def _run(self) -> None:
        cols, rows = max(self.size.width, 20), max(self.size.height, 5)
        self.screen_buffer.resize(rows, cols)
        try:
            self.handle = await self._open_pty(cols, rows)
        except Exception as exc:
            self.closed = True
            self.post_message(self.Closed(f"could not open a shell: {exc}"))
            return
        # The widget may have been laid out (and resized) while the terminal was opening: the size
        # asked for at mount can be a placeholder, so bring the PTY to the current size now.
        now_cols, now_rows = max(self.size.width, 20), max(self.size.height, 5)
        if (now_cols, now_rows) != (cols, rows):
            self.screen_buffer.resize(now_rows, now_cols)
            try:
                await self.handle.resize(now_cols, now_rows)
            except Exception:
                pass
        self.post_message(self.Opened())
        reason = EXITED
        try:
            while True:
                data = await self.handle.read()
                if not data:
                    break
                self.bytes_read += len(data)
                self.stream.feed(data)
                self.refresh()
        except asyncio.CancelledError:
            reason = "closed"
            raise
        except Exception as exc:
            reason = f"the terminal failed: {exc}"
        finally:
            self.closed = True
            self.refresh()
            if reason != "closed":
                self.post_message(self.Closed(reason))

    async def on_unmount(self) -> None:
        await self.close()  # leaving the screen (or the app) never leaves a shell open in the sandbox

    async def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                await handle.close()
            except Exception:
                pass

    async def send(self, data: bytes) -> None:
        if self.handle is not None and not self.closed:
            await self.handle.write(data)

    async def on_key(self, event: events.Key) -> None:
        data = key_bytes(event.key, event.character)
        if data is None:
            return
        event.stop()
        event.prevent_default()
        await self.send(data)

    async def on_paste(self, event: events.Paste) -> None:
        event.stop()
        await self.send(event.text.encode("utf-8"))

    async def on_resize(self, event: events.Resize) -> None:
        cols, rows = max(event.size.width, 20), max(event.size.height, 5)
        self.screen_buffer.resize(rows, cols)
        if self.handle is not None and not self.closed:
            try:
                await self.handle.resize(cols, rows)
            except Exception:
                pass
        self.refresh()

    def display_lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen_buffer.display]

    def _style(self, char: pyte.screens.Char) -> Style:
        key = (char.fg, char.bg, char.bold, char.italics, char.underscore, char.strikethrough, char.reverse)
        style = self._styles.get(key)
        if style is None:
            style = Style(
                color=_color(char.fg),
                bgcolor=_color(char.bg),
                bold=char.bold or None,
                italic=char.italics or None,
                underline=char.underscore or None,
                strike=char.strikethrough or None,
                reverse=char.reverse or None,
            )
            self._styles[key] = style
        return style

    def render_line(self, y: int) -> Strip:
        screen = self.screen_buffer
        width = self.size.width
        base = self.rich_style
        if y >= screen.lines:
            return Strip.blank(width, base)
        row = screen.buffer[y]
        cursor = screen.cursor
        show_cursor = self.has_focus and not self.closed and not cursor.hidden and cursor.y == y
        segments: list[Segment] = []
        run: list[str] = []
        run_style: Style | None = None
        for x in range(min(screen.columns, width)):
            char = row[x]
            style = self._style(char)
            if show_cursor and x == cursor.x:
                style = style + Style(reverse=True)
            if style is not run_style and run:
                segments.append(Segment("".join(run), base + run_style if run_style else base))
                run = []
            run_style = style
            run.append(char.data or " ")
        if run:
            segments.append(Segment("".join(run), base + run_style if run_style else base))
        return Strip(segments).extend_cell_length(width, base)
