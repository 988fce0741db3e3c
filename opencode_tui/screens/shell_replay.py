"""A person's shell in a replayed run (``shells/shell-N.cast``, opened from the replay: ``H``, or Enter on
a shell marker of the timeline): what the shell showed, played at its pace, and beside it every line the
person typed, with its time. For a run marked ``human_intervened`` what the person typed is the question,
so the typed lines are all listed from the start and the one last played is marked.

Keys: ``p`` play/pause (from where it is), ``f`` fast, ``home`` back to the start, ``end`` the whole
session, ``escape`` back to the run.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Static

from opencode_tui import format as fmt
from opencode_tui.widgets.terminal import TerminalView
from opencode_tui_core.artifacts import Cast
from opencode_tui_core.events import ShellClosed, ShellOpened

TICK = 0.05
FAST = 10.0


def typed_lines(cast: Cast) -> list[tuple[float, str]]:
    """What was typed, one entry per line sent (Enter ends a line; keys between are joined), shown
    readable: control keys as ``^X``, a lone Enter as ``⏎``."""
    out: list[tuple[float, str]] = []
    pending, at = "", None
    for t, text in cast.inputs:
        for ch in text:
            if at is None:
                at = t
            if ch in "\r\n":
                out.append((at, pending or "⏎"))
                pending, at = "", None
            elif ch == "\x7f":
                pending = pending[:-1]
            elif ord(ch) < 32:
                pending += "^" + chr(ord(ch) + 64)
            else:
                pending += ch
    if pending and at is not None:
        out.append((at, pending))
    return out


class ShellCastView(TerminalView):
    """The terminal pane showing a shell's recording (no raw view: a shell has no harness bytes)."""

    def _update_title(self) -> None:
        super()._update_title()
        self.border_title = "What the shell showed"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return (
            False
            if action == "toggle_raw" or action == "open_step"
            else super().check_action(action, parameters)
        )


class ShellReplayScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", tooltip="Back to the run", id="shell-replay.back"),
        Binding(
            "p", "play", "Play/pause", tooltip="Play/pause the shell from where it is", id="shell-replay.play"
        ),
        Binding("f", "fast", "Fast", tooltip=f"1{fmt.TIMES} / fast playback", id="shell-replay.fast"),
        # before the pane's own home/end (scrolling): here they move the playback
        Binding("home", "restart", "Start", show=False, priority=True, id="shell-replay.start"),
        Binding(
            "end",
            "to_end",
            "End",
            show=False,
            tooltip="Show the whole session",
            priority=True,
            id="shell-replay.end",
        ),
    ]

    def __init__(self, opened: ShellOpened, cast: Cast | None, closed: ShellClosed | None = None) -> None:
        super().__init__()
        self.opened = opened
        self.cast = cast
        self.closed = closed
        self.typed = typed_lines(cast) if cast is not None else []
        self.clock = 0.0
        self.frame = 0
        self.playing = False
        self.speed = 1.0

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="shell-replay-title")
        with Horizontal(id="shell-replay-body"):
            yield ShellCastView(id="shell-replay-output")
            yield Static(id="shell-replay-typed")
        yield Footer()

    def _title(self) -> Content:
        o = self.opened
        size = self.cast.size if self.cast is not None else None
        sizes = [f"{size[0]}{fmt.TIMES}{size[1]}"] if size else []
        if self.cast is not None:
            sizes += [f"{c}{fmt.TIMES}{r}" for _, c, r in self.cast.resizes]
        marks = "marks the sample (before verification finished)" if o.marks_sample else "marks nothing"
        took = fmt.duration(self.closed.duration_s) if self.closed else fmt.DASH
        return Content.from_markup(
            "[b]Shell $n[/] · $cast · opened in $phase · $marks$user · size $sizes · $took",
            n=str(o.shell),
            cast=o.cast,
            phase=str(o.phase),
            marks=marks,
            user=f" · as {o.user}" if o.user else "",
            sizes=" → ".join(sizes) or fmt.DASH,
            took=took,
        )

    def on_mount(self) -> None:
        term = self.query_one(TerminalView)
        term.view = "cast"
        self._timer = self.set_interval(TICK, self._tick, pause=True)
        if self.cast is None:
            term.cast_feed(f"The recording {self.opened.cast} is missing from the run directory.\n")
            term.refresh_content()
        else:
            self.action_to_end()  # the whole session at once; p plays it from the start
        self._show_typed()
        term.focus()

    # -- playback --------------------------------------------------------------------------------

    def _status(self) -> str:
        if self.cast is None:
            return ""
        state = "▶" if self.playing else "⏸"
        speed = "fast" if self.speed > 1 else f"1{fmt.TIMES}"
        return f"{state} {speed} {fmt.duration(self.clock)}/{fmt.duration(self.cast.end)}"

    def _feed_to(self, clock: float) -> None:
        assert self.cast is not None
        term = self.query_one(TerminalView)
        frames = self.cast.frames
        while self.frame < len(frames) and frames[self.frame][0] <= clock:
            term.cast_feed(frames[self.frame][1])
            self.frame += 1
        self.clock = clock
        term.refresh_content()
        term.set_cast_status(self._status())
        self._show_typed()

    def _reset(self) -> None:
        self.query_one(TerminalView).cast_reset()
        self.frame = 0
        self.clock = 0.0

    def action_play(self) -> None:
        if self.cast is None:
            return
        if self.playing:
            self.playing = False
            self._timer.pause()
        else:
            if self.clock >= self.cast.end:  # at the end: play it again
                self._reset()
            self.playing = True
            self._timer.resume()
        self._feed_to(self.clock)

    def action_fast(self) -> None:
        self.speed = 1.0 if self.speed > 1 else FAST
        if self.cast is not None:
            self.query_one(TerminalView).set_cast_status(self._status())

    def action_restart(self) -> None:
        if self.cast is None:
            return
        self._reset()
        self._feed_to(0.0)

    def action_to_end(self) -> None:
        if self.cast is None:
            return
        self.playing = False
        self._timer.pause()
        self._feed_to(self.cast.end)

    def _tick(self) -> None:
        if not self.playing or self.cast is None:
            self._timer.pause()
            return
        clock = self.clock + TICK * self.speed
        if clock >= self.cast.end:
            clock = self.cast.end
            self.playing = False
        self._feed_to(clock)

    def _show_typed(self) -> None:
        box = self.query_one("#shell-replay-typed", Static)
        box.border_title = f"Typed ({len(self.typed)})"
        if not self.typed:
            box.update(Content("Nothing was typed." if self.cast is not None else ""))
            return
        lines = []
        for t, text in self.typed:
            played = t <= self.clock
            line = Content.from_markup(
                "[dim]$t[/] $mark$text", t=f"{fmt.duration(t):>6}", mark="› " if played else "  ", text=text
            )
            lines.append(line if played else line.stylize("$foreground-muted"))
        box.update(Content("\n").join(lines))

    def action_back(self) -> None:
        self.app.pop_screen()
