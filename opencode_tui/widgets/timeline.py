"""The replay timeline: where the cursor is in the event stream, with markers on the bar for model calls,
tool calls, a subagent's model calls, compactions, shells, kernel kills (and a full disk), the debugger's
interventions and failures, and keys (when focused) to jump to the next/previous of each; Enter opens the event at
the cursor (a tool call's step, a model call, a shell's recording).
"""

from __future__ import annotations

from bisect import bisect_left

from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.widget import Widget

from opencode_tui import format as fmt

# kind -> (glyph on the bar, style, next key, words, footer label). Drawn in this order: a later kind wins a shared cell,
# so a failure is never hidden under the model call next to it.
MARKERS: dict[str, tuple[str, str, str, str, str]] = {
    "model_call": ("m", "$secondary", "m", "model call", "Call"),
    "tool_call": ("o", "$foreground-muted", "o", "tool call", "Tool"),
    "shell": ("$", "bold $warning", "h", "shell", "Shell"),
    "subagent": ("a", "bold $accent", "a", "subagent's model call", "Subagent"),
    "compaction": ("C", "bold $warning", "c", "compaction", "Compaction"),
    "health": ("!", "bold $warning", "w", "health warning", "Health"),
    "fault": ("K", "bold $error", "e", "kernel kill or full disk", "Kernel"),
    "intervention": ("I", "bold $accent", "i", "debugger intervention", "Debugger"),
    "failure": ("✗", "bold $error", "x", "failure", "Failure"),
}


class Timeline(Widget, can_focus=True):
    """Displays the cursor the run screen owns; keys ask the screen to move it (``Timeline.Seek``)."""

    BINDINGS = [
        Binding("left", "step(-1)", "Back", show=False, id="timeline.back"),
        Binding("right", "step(1)", "Forward", show=False, id="timeline.forward"),
        Binding("shift+left", "step(-100)", "Back 100", show=False, id="timeline.back-100"),
        Binding("shift+right", "step(100)", "Forward 100", show=False, id="timeline.forward-100"),
        Binding("home", "seek_start", "Start", show=False, id="timeline.start"),
        Binding("end", "seek_end", "End", show=False, id="timeline.end"),
        Binding(
            "enter",
            "open",
            "Open",
            tooltip="Open the event at the cursor: a tool call's step, a model call, a shell's recording",
            id="timeline.open",
        ),
        *(
            b
            for kind, (_g, _s, key, words, label) in MARKERS.items()
            for b in (
                Binding(
                    key,
                    f"jump('{kind}', 1)",
                    f"{label}▶",
                    tooltip=f"Jump to the next {words} ({key.upper()}: the previous)",
                    id=f"timeline-next-{kind}",
                ),
                Binding(
                    key.upper(),
                    f"jump('{kind}', -1)",
                    f"Prev {words}",
                    show=False,
                    id=f"timeline-prev-{kind}",
                ),
            )
        ),
    ]

    class Seek(Message):
        """Move the cursor to ``index`` (``None``: the end, following new events)."""

        def __init__(self, index: int | None) -> None:
            self.index = index
            super().__init__()

        def can_replace(self, message: Message) -> bool:
            # a newer seek waiting behind this one makes it moot (each folds the state up to its event)
            return isinstance(message, Timeline.Seek)

    class Open(Message):
        """Enter: open what the event at the cursor names (the screen decides what that is). It carries
        no index: the screen reads its cursor when the message arrives, after the seeks sent before it
        (keys typed ahead would otherwise open the event the cursor was leaving)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cursor: int | None = None
        self.total = 0
        self.replay_loading = True
        self.summary = ""
        self.when = ""
        self.failures: list[int] = []
        self.markers: dict[str, list[int]] = {}
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
        markers: dict[str, list[int]] | None = None,
    ) -> None:
        self.markers = dict(markers or {})
        self.markers["failure"] = failures
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
        styles: list[str | None] = [None] * width
        if self.total > 0:
            for kind, (glyph, style, *_rest) in MARKERS.items():
                for index in self.markers.get(kind, ()):
                    cell = min(index * width // self.total, width - 1)
                    cells[cell], styles[cell] = glyph, style
            cell = min(max(pos, 0) * width // self.total, width - 1)
            cells[cell], styles[cell] = "●", "bold $accent"
        bar = Content("".join(cells))
        for i, cell_style in enumerate(styles):
            if cell_style is not None:
                bar = bar.stylize(cell_style, i, i + 1)
        return Content("\n").join([head.truncate(width, ellipsis=True), bar])

    def action_step(self, delta: int) -> None:
        if self.total:
            self.post_message(self.Seek(min(max(self.position + delta, 0), self.total - 1)))

    def action_open(self) -> None:
        if self.total:
            self.post_message(self.Open())

    def action_seek_start(self) -> None:
        self.post_message(self.Seek(0))

    def action_seek_end(self) -> None:
        self.post_message(self.Seek(None))

    def next_failure(self, forward: bool = True) -> int | None:
        return self.next_marker("failure", forward)

    def next_marker(self, kind: str, forward: bool = True) -> int | None:
        """The next (previous) event of ``kind`` after (before) the cursor, wrapping around."""
        pos = self.position
        found = self.markers.get(kind) or []
        if not found:
            return None
        if forward:
            i = bisect_left(found, pos + 1)
            return found[i] if i < len(found) else found[0]
        i = bisect_left(found, pos) - 1
        return found[i] if i >= 0 else found[-1]

    def action_jump(self, kind: str, direction: int) -> None:
        target = self.next_marker(kind, direction > 0)
        if target is None:
            self.notify(f"No {MARKERS[kind][3]} in this run.", timeout=3)
            return
        self.post_message(self.Seek(target))
