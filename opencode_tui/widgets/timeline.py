"""The replay timeline: where the cursor is in the event stream, with failures marked on the bar."""

from __future__ import annotations

from bisect import bisect_left

from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.widget import Widget

from opencode_tui import format as fmt


class Timeline(Widget, can_focus=True):
    """Displays the cursor the run screen owns; keys ask the screen to move it (``Timeline.Seek``)."""

    BINDINGS = [
        Binding("left", "step(-1)", "Back", show=False),
        Binding("right", "step(1)", "Forward", show=False),
        Binding("shift+left", "step(-100)", "Back 100", show=False),
        Binding("shift+right", "step(100)", "Forward 100", show=False),
        Binding("home", "seek_start", "Start", show=False),
        Binding("end", "seek_end", "End", show=False),
    ]

    class Seek(Message):
        """Move the cursor to ``index`` (``None``: the end, following new events)."""

        def __init__(self, index: int | None) -> None:
            self.index = index
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cursor: int | None = None
        self.total = 0
        self.replay_loading = True
        self.summary = ""
        self.when = ""
        self.failures: list[int] = []
        self.playback = ""
        self.border_title = "Timeline"

    def show(
        self,
        *,
        cursor: int | None,
        total: int,
        loading: bool,
        summary: str,
        when: str,
        failures: list[int],
        playback: str = "",
    ) -> None:
        self.cursor, self.total, self.replay_loading = cursor, total, loading
        self.summary, self.when, self.failures, self.playback = summary, when, failures, playback
        self.refresh()

    @property
    def position(self) -> int:
        return self.total - 1 if self.cursor is None else self.cursor

    def render(self) -> Content:
        width = max(self.size.width, 10)
        pos = self.position
        state = "loading… " if self.replay_loading else ""
        at = "end (following)" if self.cursor is None else f"{pos + 1:,}"
        head = Content.from_markup(
            "[b]$state$at[/] / $total events · $when · $summary$playback",
            state=state,
            at=at,
            total=f"{self.total:,}",
            when=self.when or fmt.DASH,
            summary=self.summary,
            playback=f" · {self.playback}" if self.playback else "",
        )
        cells = ["─"] * width
        if self.total > 0:
            for f in self.failures:
                cells[min(f * width // self.total, width - 1)] = "✗"
            cells[min(max(pos, 0) * width // self.total, width - 1)] = "●"
        bar = Content("".join(cells))
        for i, ch in enumerate(cells):
            if ch == "✗":
                bar = bar.stylize("bold $error", i, i + 1)
            elif ch == "●":
                bar = bar.stylize("bold $accent", i, i + 1)
        return Content("\n").join([head.truncate(width, ellipsis=True), bar])

    def action_step(self, delta: int) -> None:
        if self.total:
            self.post_message(self.Seek(min(max(self.position + delta, 0), self.total - 1)))

    def action_seek_start(self) -> None:
        self.post_message(self.Seek(0))

    def action_seek_end(self) -> None:
        self.post_message(self.Seek(None))

    def next_failure(self, forward: bool = True) -> int | None:
        pos = self.position
        if not self.failures:
            return None
        if forward:
            i = bisect_left(self.failures, pos + 1)
            return self.failures[i] if i < len(self.failures) else self.failures[0]
        i = bisect_left(self.failures, pos) - 1
        return self.failures[i] if i >= 0 else self.failures[-1]
