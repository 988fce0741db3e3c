"""The terminal pane: what a person would have seen, built for megabytes of output.

Raw lines live in a :class:`LineBuffer` (ingest is line splitting only); lines are ANSI-decoded with Rich
only when drawn, through a small LRU cache (Textual's Line API: ``render_line``). Three views:

- ``rendered``: terminal output plus tool calls / assistant text rebuilt from events (the default);
- ``raw``: the harness's stdout/stderr (every ``TerminalOutput``) byte for byte, control characters visible;
- ``cast``: the run directory's ``terminal.cast`` played back (replay only).

``follow`` keeps the view at the bottom as output arrives; scrolling up pauses it (scroll lock).

Search (``/``; the run screen's ctrl+f): the matches of a query in the shown view (rendered or raw), all
highlighted, ``n``/``N`` moving to the next/previous one. Only lines that can hold the query are decoded
(a cheap test on the raw text first), so searching a million lines stays quick.
"""

from __future__ import annotations

import re
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from typing import ClassVar, Literal

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.cache import LRUCache
from textual.events import MouseScrollUp
from textual.geometry import Offset, Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.selection import Selection
from textual.strip import Strip

from opencode_tui.linebuffer import LineBuffer, ansi_line, raw_line
from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.events import Event, OpenCodeEvent, TerminalOutput, ToolCall
from opencode_tui_core.runtime import EventRenderer

View = Literal["rendered", "raw", "cast"]

# What a person would have seen: the engine's rendering (``display``), a shell's pty and stderr. The
# harness's machine-readable stdout (OpenCode's JSON lines) is for the raw view only.
RENDERED_STREAMS = frozenset({"pty", "display", "stderr"})


class TranscriptFeed:
    """Fills the rendered view: terminal output as it is, and the engine's rendering of the transcript.

    The engine renders every tool call and text on the ``display`` stream (``opencode_tui_core.runtime.stream``),
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
MAX_MATCHES = 100_000  # a search stops counting here (the status says so)
_SGR = re.compile(r"\x1b\[[0-9;]*m")


class TerminalView(ScrollView, can_focus=True):
    """Line-API log of the episode's terminal."""

    BINDINGS = [
        Binding(
            "l",
            "toggle_follow",
            "Follow",
            tooltip="Follow new output / pause (scroll lock)",
            id="terminal.follow",
        ),
        Binding(
            "r", "toggle_raw", "Raw", tooltip="Show the harness's raw stdout/stderr bytes", id="terminal.raw"
        ),
        Binding("slash", "find", "Search", key_display="/", tooltip="Search this view", id="terminal.find"),
        # n/N only while a search is active; otherwise they fall through to the screen (failures)
        Binding("n", "find_next(1)", "Next match", id="terminal.next-match"),
        Binding("N", "find_next(-1)", "Prev match", show=False, id="terminal.prev-match"),
        Binding("escape", "clear_search", "Clear search", show=False, id="terminal.clear-search"),
        Binding(
            "enter",
            "open_step",
            "Step",
            show=False,
            tooltip="The latest tool call on screen in full: command, output, exit status, its model call",
            id="terminal.step",
        ),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {"terminal--match", "terminal--match-current"}
    DEFAULT_CSS = """
    TerminalView > .terminal--match { background: $warning 40%; }
    TerminalView > .terminal--match-current { background: $accent; color: $background; text-style: bold; }
    """

    view: reactive[View] = reactive("rendered", init=False)
    follow: reactive[bool] = reactive(True, init=False)
    # The search text. It hides Widget.query (a DOM query this widget never runs on itself); the run
    # screen reads it under this name.
    query: str  # type: ignore[assignment]

    class FollowChanged(Message):
        def __init__(self, follow: bool) -> None:
            self.follow = follow
            super().__init__()

    class FindWanted(Message):
        """``/`` was pressed: the screen opens its search bar for this pane."""

    class StepWanted(Message):
        """Enter was pressed: the screen opens the latest tool call shown on or above ``line``."""

        def __init__(self, line: int) -> None:
            self.line = line
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
        self._cache: LRUCache[tuple[int, ...], Strip] = LRUCache(1024)
        # what the lines of a frame share (style, selection, line count, buffer, width, scroll), while
        # one is drawn (render_lines)
        self._frame: tuple[Style, Selection | None, int, LineBuffer, int, int, int] | None = None
        self.cast_status = ""
        self.border_title = "Terminal"
        # search: matches as (line, start, end) in the shown view's plain text, in order
        self.query = ""
        self.matches: list[tuple[int, int, int]] = []
        self._match_lines = array("q")  # the line of each match (bisect)
        self._by_line: dict[int, list[tuple[int, int]]] = {}
        self.current = -1  # index in matches of the current one
        self._searched: tuple[int, int, int] = (0, 0, 0)  # (buffer id, version, lines) searched
        self._search_key = 0  # bumped when matches change (part of the line cache key)

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
            if isinstance(ev, TerminalOutput):
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
        if self.query:  # new output is searched as it arrives (only the new lines)
            self._search_new_lines()
            self._update_title()
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
        overflow_x, overflow_y = self.styles.overflow_x, self.styles.overflow_y

        def bars(extent: Size) -> tuple[bool, bool]:
            # a scrollbar that is always there (overflow: scroll) never changes the layout
            return (
                overflow_x == "scroll" or (overflow_x == "auto" and extent.width > view.width),
                overflow_y == "scroll" or (overflow_y == "auto" and extent.height > view.height),
            )

        if bars(old) != bars(size) or not self.is_mounted:
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
        self.refresh_content()
        if self.query:  # the same query in the other view
            self._run_search(keep_position=True)
        self._update_title()

    def watch_follow(self, follow: bool) -> None:
        self._update_title()
        self.post_message(self.FollowChanged(follow))
        if follow:
            self.refresh_content()

    def _update_title(self) -> None:
        names = {"rendered": "Terminal", "raw": "Raw stdout/stderr", "cast": RunFiles.CAST}
        self.border_title = names[self.view]
        status = "following" if self.follow else "paused (l: follow)"
        if self.view == "cast" and self.cast_status:
            status = f"{self.cast_status} · {status}"
        if self.query:
            status = f"{self.search_status} · {status}"
        self.border_subtitle = status

    # -- search --------------------------------------------------------------------------------

    @property
    def search_status(self) -> str:
        if not self.query:
            return ""
        if not self.matches:
            return f"/{self.query}: no match"
        more = "+" if len(self.matches) >= MAX_MATCHES else ""
        at = "–" if self.current < 0 else str(self.current + 1)  # none chosen yet: n picks one
        return f"/{self.query}: {at}/{len(self.matches)}{more} (n/N)"

    def search(self, query: str) -> int:
        """Find ``query`` (case-insensitive) in the shown view; go to the first match from the top of the
        view down. Returns the number of matches (an empty query clears the search)."""
        self.query = query
        self._run_search(keep_position=False)
        self._update_title()
        return len(self.matches)

    def clear_search(self) -> None:
        self.search("")

    def _line_text(self, index: int) -> str:
        """Line ``index`` of the shown view as plain text, as drawn (the match offsets are into this)."""
        raw = self.buffer.lines[index]
        return raw_line(raw).plain if self.view == "raw" else ansi_line(raw).plain

    def _scan(self, start: int, end: int) -> None:
        needle = self.query.lower()
        lines = self.buffer.lines
        raw_view = self.view == "raw"
        for i in range(start, end):
            raw = lines[i]
            # cheap test first: the query must be in the line once colours are stripped
            probe = raw if raw_view or "\x1b" not in raw else _SGR.sub("", raw)
            if needle not in probe.lower():
                continue
            text = self._line_text(i).lower()
            at = text.find(needle)
            while at != -1:
                self.matches.append((i, at, at + len(needle)))
                self._match_lines.append(i)
                self._by_line.setdefault(i, []).append((at, at + len(needle)))
                if len(self.matches) >= MAX_MATCHES:
                    return
                at = text.find(needle, at + len(needle))

    def _run_search(self, keep_position: bool) -> None:
        old_line = (
            self.matches[self.current][0] if keep_position and 0 <= self.current < len(self.matches) else None
        )
        self.matches, self._match_lines, self._by_line = [], array("q"), {}
        self.current = -1
        self._search_key += 1
        self._cache.clear()
        if self.view == "raw":
            self._catch_up_raw()
        count = self.line_count
        self._searched = (id(self.buffer), self.buffer.version, count)
        if self.query:
            self._scan(0, count)
        self.refresh()
        if not self.matches:
            return
        top = old_line if old_line is not None else self.scroll_offset.y
        self.current = min(bisect_left(self._match_lines, top), len(self.matches) - 1)
        self._show_current()

    def _search_new_lines(self) -> None:
        """Output arrived since the search: scan what is new (the open line again, it may have grown)."""
        buf_id, version, done = self._searched
        if (buf_id, version) != (id(self.buffer), self.buffer.version):
            self._run_search(keep_position=True)
            return
        count = self.line_count
        if count == done and (
            count == 0 or not self.buffer.lines[count - 1] or count < len(self.buffer.lines)
        ):
            return  # nothing new, and the last searched line is complete
        start = max(min(done, count) - 1, 0)  # fewer lines: the timeline moved back
        cut = bisect_left(self._match_lines, start)
        for i in range(cut, len(self.matches)):
            self._by_line.pop(self.matches[i][0], None)
        del self.matches[cut:]
        del self._match_lines[cut:]
        self._scan(start, count)
        self._searched = (buf_id, version, count)
        self._search_key += 1
        self.current = min(self.current, len(self.matches) - 1)

    def action_find(self) -> None:
        self.post_message(self.FindWanted())

    def action_find_next(self, direction: int) -> None:
        if not self.query:
            return
        self._search_new_lines()
        if not self.matches:
            self._update_title()
            return
        line = self.matches[self.current][0] if self.current >= 0 else self.scroll_offset.y
        if direction > 0:
            nxt = self.current + 1 if self.current >= 0 else bisect_left(self._match_lines, line)
            self.current = nxt % len(self.matches)
        else:
            prv = self.current - 1 if self.current >= 0 else bisect_right(self._match_lines, line) - 1
            self.current = prv % len(self.matches)
        self._show_current()

    def action_clear_search(self) -> None:
        self.clear_search()

    def _show_current(self) -> None:
        line, start, end = self.matches[self.current]
        self._pause()
        height = self.scrollable_content_region.height
        width = self.scrollable_content_region.width
        y = self.scroll_offset.y
        if not y <= line < y + height:
            y = max(line - height // 3, 0)
        x = self.scroll_offset.x
        if not x <= start and end <= x + width:
            x = max(end - width + 1, 0) if end > width else 0
        self.scroll_to(x=x, y=y, animate=False, immediate=True)
        self._search_key += 1
        self.refresh()
        self._update_title()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("find_next", "clear_search"):
            return bool(self.query)
        return True

    def set_cast_status(self, status: str) -> None:
        self.cast_status = status
        self._update_title()

    def on_mount(self) -> None:
        self._update_title()

    # -- actions -------------------------------------------------------------------------------

    def action_open_step(self) -> None:
        bottom = self.scroll_offset.y + self.scrollable_content_region.height
        self.post_message(self.StepWanted(min(bottom, self.line_count)))

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

    def render_lines(self, crop: Region) -> list[Strip]:
        # What every line of a frame shares is worked out once per frame, not once per line: while output
        # floods in, every line of every frame is new, and ``rich_style`` (it walks the ancestors'
        # backgrounds) and ``text_selection`` per line were a third of a frame's cost.
        self._frame = self._frame_state()
        try:
            return super().render_lines(crop)
        finally:
            self._frame = None

    def _frame_state(self) -> tuple[Style, Selection | None, int, LineBuffer, int, int, int]:
        scroll_x, scroll_y = self.scroll_offset
        return (
            self.rich_style,
            self.text_selection,
            self.line_count,
            self.buffer,
            self.size.width,
            scroll_x,
            scroll_y,
        )

    def render_line(self, y: int) -> Strip:
        style, selection, count, buf, width, scroll_x, scroll_y = self._frame or self._frame_state()
        index = scroll_y + y
        if index >= count:
            return Strip.blank(width, style)
        strip = self._line_strip(index, style, selection, buf)
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, index)

    def _line_strip(
        self, index: int, style: Style, selection: Selection | None = None, buf: LineBuffer | None = None
    ) -> Strip:
        buf = buf if buf is not None else self.buffer
        line = buf.lines[index]
        found = self._by_line.get(index) if self.query else None
        key = (id(buf), buf.version, index, len(line), self._search_key if found else 0)
        if selection is None:
            cached = self._cache.get(key)
            if cached is not None:
                return cached
        text = raw_line(line) if buf is self.raw else ansi_line(line)
        if found:
            match_style = self.get_component_rich_style("terminal--match")
            current = self.matches[self.current] if 0 <= self.current < len(self.matches) else None
            for start, end in found:
                is_current = current is not None and current == (index, start, end)
                text.stylize(
                    self.get_component_rich_style("terminal--match-current") if is_current else match_style,
                    start,
                    end,
                )
        if selection is not None:
            span = selection.get_span(index)
            if span is not None:
                start, end = span
                if end == -1:
                    end = len(text)
                text.stylize(self.screen.get_component_rich_style("screen--selection"), start, end)
        strip = Strip(Segment.apply_style(text.render(self.app.console), style), text.cell_len)
        if selection is None:
            self._cache[key] = strip
        return strip
