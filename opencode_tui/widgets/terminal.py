"""The terminal pane: what a person would have seen, built for megabytes of output.

Raw lines live in a :class:`LineBuffer` (ingest is line splitting only); lines are ANSI-decoded with Rich
only when drawn, through a small LRU cache (Textual's Line API: ``render_line``). Three views:

- ``rendered``: terminal output plus tool calls / assistant text rebuilt from events (the default);
- ``raw``: the harness's stdout/stderr (every ``TerminalOutput``) byte for byte, control characters visible;
- ``cast``: the run directory's ``terminal.cast`` played back (replay only).

``follow`` keeps the view at the bottom as output arrives; scrolling up pauses it (scroll lock).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Literal

from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.events import MouseScrollUp
from textual.geometry import Offset, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.selection import Selection
from textual.strip import Strip

from core.events import Event, OpenCodeEvent, TerminalOutput, ToolCall
from core.runtime.stream import EventRenderer
from opencode_tui.linebuffer import LineBuffer, ansi_line, raw_line

View = Literal["rendered", "raw", "cast"]

# What a person would have seen: the engine's rendering (``display``), a shell's pty and stderr. The
# harness's machine-readable stdout (OpenCode's JSON lines) is for the raw view only.
RENDERED_STREAMS = frozenset({"pty", "display", "stderr"})


class TranscriptFeed:
    """Fills the rendered view: terminal output as it is, and the engine's rendering of the transcript.

    The engine renders every tool call and text on the ``display`` stream (``core.runtime.stream``),
    starting with a header, and that is what is shown. Events recorded without such a rendering (an
    older engine, a scripted event stream) are rendered by the engine's own :class:`EventRenderer`; since
    an older engine rendered right after the event without a header, a renderable event is held back
    until the next event says whether a ``display`` rendering of it follows.
    """

    def __init__(self, buffer: LineBuffer) -> None:
        self.buffer = buffer
        self.renderer = EventRenderer()
        self.engine_renders = False  # set by the first display chunk: from then on only it is shown
        self.pending: Event | None = None  # a renderable event waiting to see what follows it
        self.pending_since = 0.0
        self.on_flush: Callable[[], None] | None = None  # told right after a held-back event is rendered
        self.owner: str | None = None  # who wrote the open line last ("term" or "events")

    def feed(self, event: Event) -> None:
        if isinstance(event, TerminalOutput):
            if event.stream == "display":
                self.engine_renders = True  # the engine renders (a held-back event included)
                self.pending = None
            elif self.pending is not None and event.stream in RENDERED_STREAMS:
                self.flush_pending()
            if event.stream in RENDERED_STREAMS:
                self.owner = "term"
                self.buffer.append(event.data)
            return
        if self.engine_renders or not isinstance(event, ToolCall | OpenCodeEvent):
            return
        if self.pending is not None:
            self.flush_pending()
        if EventRenderer.renders(event):
            self.pending = event
            self.pending_since = time.monotonic()

    def flush_pending(self) -> None:
        """Render the held-back event (no engine rendering of it followed)."""
        event, self.pending = self.pending, None
        if event is None:
            return
        text = self.renderer.render(event)
        if text:
            if self.owner == "term":
                self.buffer.ensure_line_start()
            self.owner = "events"
            self.buffer.append(text)
        if self.on_flush is not None:
            self.on_flush()


RAW_CATCH_UP_CHARS = 4_000_000  # raw view is built lazily, at most this much per refresh
MAX_SELECTION_LINES = 200_000


class TerminalView(ScrollView, can_focus=True):
    """Line-API log of the episode's terminal."""

    BINDINGS = [
        Binding("l", "toggle_follow", "Follow", tooltip="Follow new output / pause (scroll lock)"),
        Binding("r", "toggle_raw", "Raw", tooltip="Show the harness's raw stdout/stderr bytes"),
    ]

    view: reactive[View] = reactive("rendered", init=False)
    follow: reactive[bool] = reactive(True, init=False)

    class FollowChanged(Message):
        def __init__(self, follow: bool) -> None:
            self.follow = follow
            super().__init__()

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.rendered = LineBuffer()
        self.raw = LineBuffer()
        self.cast = LineBuffer()
        self.raw_chunks: list[str] = []
        self._raw_pos = 0
        self.writer = TranscriptFeed(self.rendered)
        self.writer.on_flush = self._pending_rendered
        self._pending_at = 0  # index (in marks) of the event the writer holds back
        self.marks = array("q")  # rendered line count after each event (timeline)
        self.limit: int | None = None  # timeline cursor: show only this many rendered lines
        self._cache: LRUCache[tuple[int, int, int, int], Strip] = LRUCache(1024)
        self.cast_status = ""
        self.border_title = "Terminal"

    # -- ingest --------------------------------------------------------------------------------

    def ingest(self, events: list[Event]) -> None:
        """Feed a batch; call :meth:`refresh_content` afterwards (once per batch, not per event).

        Consecutive terminal chunks are joined and split once; the line count after each event (for the
        timeline) is worked out from newline counts, so per-event work stays a few C-level calls.
        """
        rendered = self.rendered
        writer = self.writer
        marks_append = self.marks.append
        raw_append = self.raw_chunks.append
        joined: list[str] = []
        n = len(rendered.lines)
        open_empty = not rendered.lines[-1]

        def sync() -> None:
            if joined:
                rendered.append("".join(joined))
                writer.owner = "term"
                joined.clear()

        for ev in events:
            kind = type(ev)
            if kind is TerminalOutput:
                data = ev.data
                raw_append(data)
                stream = ev.stream
                if (stream == "display" and not writer.engine_renders) or (
                    writer.pending is not None and stream in RENDERED_STREAMS
                ):
                    sync()
                    # The writer learns that the engine renders / settles its held-back event, then writes.
                    writer.feed(ev)
                    n = len(rendered.lines)
                    open_empty = not rendered.lines[-1]
                elif data and stream in RENDERED_STREAMS:
                    joined.append(data)
                    n += data.count("\n")
                    open_empty = data[-1] == "\n"
            elif kind is ToolCall or kind is OpenCodeEvent:
                sync()
                writer.feed(ev)
                if writer.pending is ev:
                    self._pending_at = len(self.marks)
                n = len(rendered.lines)
                open_empty = not rendered.lines[-1]
            marks_append(n - 1 if open_empty else n)
        sync()

    def _pending_rendered(self) -> None:
        """A held-back event was just rendered: its lines belong to it (and to the events after it, which
        were ingested meanwhile), so the timeline marks from it on are moved up to the new line count."""
        lines = self.rendered.lines
        count = len(lines) if lines[-1] else len(lines) - 1
        marks = self.marks
        for i in range(self._pending_at, len(marks)):
            marks[i] = max(marks[i], count)

    def flush_pending(self, older_than: float = 0.0) -> bool:
        """Render a held-back tool call/text if it has waited ``older_than`` seconds; True if one still waits."""
        writer = self.writer
        if writer.pending is None:
            return False
        if time.monotonic() - writer.pending_since >= older_than:
            writer.flush_pending()
            return False
        return True

    def cast_reset(self) -> None:
        self.cast.clear()
        self._cache.clear()

    def cast_feed(self, text: str) -> None:
        self.cast.append(text)

    # -- view state ----------------------------------------------------------------------------

    @property
    def buffer(self) -> LineBuffer:
        if self.view == "raw":
            return self.raw
        if self.view == "cast":
            return self.cast
        return self.rendered

    @property
    def line_count(self) -> int:
        count = self.buffer.count
        if self.view == "rendered" and self.limit is not None:
            return min(count, self.limit)
        return count

    def refresh_content(self) -> None:
        """Update the scroll extent after new lines (or a new limit/view) and follow the end."""
        if self.view == "raw":
            self._catch_up_raw()
        self._set_virtual_size(Size(self.buffer.width, self.line_count))
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False, force=True)
        # The open (last) line may have grown: its cache key includes its length, so a refresh is enough.
        self.refresh()

    def _set_virtual_size(self, size: Size) -> None:
        """Grow the scroll extent without a screen layout when no scrollbar appears or disappears.

        Setting ``virtual_size`` normally re-lays out the whole screen (tens of ms with this many widgets),
        which would run on every batch of streamed output; only the scrollbars need to know.
        """
        old = self.virtual_size
        if size == old:
            return
        view = self.scrollable_content_region.size
        same_bars = (old.height > view.height) == (size.height > view.height) and (
            old.width > view.width
        ) == (size.width > view.width)
        if not same_bars or not self.is_mounted:
            self.virtual_size = size
            return
        self.set_reactive(TerminalView.virtual_size, size)
        self._scroll_update(size)

    def _catch_up_raw(self) -> None:
        chunks = self.raw_chunks
        budget = RAW_CATCH_UP_CHARS
        while self._raw_pos < len(chunks) and budget > 0:
            chunk = chunks[self._raw_pos]
            self.raw.append(chunk)
            budget -= len(chunk)
            self._raw_pos += 1
        if self._raw_pos < len(chunks):
            self.call_later(self.refresh_content)

    def set_limit(self, limit: int | None) -> None:
        self.limit = limit
        self.refresh_content()

    def watch_view(self) -> None:
        self._cache.clear()
        self._update_title()
        self.refresh_content()

    def watch_follow(self, follow: bool) -> None:
        self._update_title()
        self.post_message(self.FollowChanged(follow))
        if follow:
            self.refresh_content()

    def _update_title(self) -> None:
        names = {"rendered": "Terminal", "raw": "Raw stdout/stderr", "cast": "terminal.cast"}
        self.border_title = names[self.view]
        status = "following" if self.follow else "paused (l: follow)"
        if self.view == "cast" and self.cast_status:
            status = f"{self.cast_status} · {status}"
        self.border_subtitle = status

    def set_cast_status(self, status: str) -> None:
        self.cast_status = status
        self._update_title()

    def on_mount(self) -> None:
        self._update_title()

    # -- actions -------------------------------------------------------------------------------

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow

    def action_toggle_raw(self) -> None:
        self.view = "rendered" if self.view == "raw" else "raw"

    def _pause(self) -> None:
        if self.follow:
            self.follow = False

    def action_scroll_up(self) -> None:
        self._pause()
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self._pause()
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self._pause()
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        super().action_scroll_end()
        self.follow = True

    def _on_mouse_scroll_up(self, event: MouseScrollUp) -> None:
        self._pause()
        super()._on_mouse_scroll_up(event)

    # -- text for copying ----------------------------------------------------------------------

    def _plain(self, start: int, end: int) -> list[str]:
        buf = self.buffer
        end = min(end, self.line_count)
        if self.view == "raw":
            return [raw_line(buf.lines[i]).plain for i in range(max(start, 0), end)]
        return buf.plain(start, end)

    def visible_text(self) -> str:
        top = self.scroll_offset.y
        return "\n".join(self._plain(top, top + self.size.height)).rstrip("\n")

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        count = self.line_count
        if count == 0:
            return None
        start = selection.start or Offset(0, 0)
        end = selection.end or Offset(1 << 30, count - 1)
        last = min(end.y, count - 1, start.y + MAX_SELECTION_LINES)
        lines = self._plain(start.y, last + 1)
        if not lines:
            return None
        if len(lines) == 1:
            lines[0] = lines[0][start.x : end.x]
        else:
            lines[0] = lines[0][start.x :]
            lines[-1] = lines[-1][: end.x]
        return "\n".join(lines), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()

    # -- drawing -------------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if index >= self.line_count:
            return Strip.blank(width, style)
        strip = self._line_strip(index, style)
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, index)

    def _line_strip(self, index: int, style: Style) -> Strip:
        buf = self.buffer
        line = buf.lines[index]
        selection = self.text_selection
        key = (id(buf), buf.version, index, len(line))
        if selection is None:
            cached = self._cache.get(key)
            if cached is not None:
                return cached
        text = raw_line(line) if self.view == "raw" else ansi_line(line)
        if selection is not None:
            span = selection.get_span(index)
            if span is not None:
                start, end = span
                if end == -1:
                    end = len(text)
                text.stylize(self.screen.get_component_rich_style("screen--selection"), start, end)
        strip = Strip(text.render(self.app.console), text.cell_len).apply_style(style)
        if selection is None:
            self._cache[key] = strip
        return strip
