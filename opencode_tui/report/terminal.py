"""The terminal recording (``terminal.cast``) as HTML lines, decoded the way the TUI's cast view draws it.

Why not a terminal emulator (pyte): the recording is the harness's line-oriented output (OpenCode's tool
calls, command output, progress bars redrawn with carriage returns), not a full-screen program, and the
TUI shows it as lines with their colours. Decoding it with the TUI's own ``LineBuffer``/``ansi_line``
gives the report the same text a person saw in the cast pane, keeps every line (an emulator keeps a
screen and whatever scrolls off it), and runs at line-splitting speed on recordings of hundreds of MB,
where an emulator processes each character.

A long recording is cut to its first ``head`` and last ``tail`` lines; the page says how many were left out.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from rich.style import Style
from rich.terminal_theme import MONOKAI

from opencode_tui.linebuffer import LineBuffer, ansi_line
from opencode_tui_core.artifacts import Cast
from opencode_tui_core.redaction import redact_text

HEAD_LINES = 300
TAIL_LINES = 3000


@dataclass
class TerminalLines:
    """HTML of the kept lines, and how many lines the recording had."""

    head: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    total: int = 0
    duration_s: float = 0.0
    size: str = ""

    @property
    def elided(self) -> int:
        return self.total - len(self.head) - len(self.tail)


_CSS: dict[Style, str] = {}


def _css(style: Style) -> str:
    css = _CSS.get(style)
    if css is None:
        css = _CSS[style] = style.get_html_style(MONOKAI)
    return css


def line_html(raw: str) -> str:
    """One recorded line: redacted, colours as inline styles, cursor movement dropped."""
    text = ansi_line(redact_text(raw))
    plain = text.plain
    if not text.spans:
        return html.escape(plain)
    out: list[str] = []
    at = 0
    for span in sorted(text.spans, key=lambda s: s.start):
        if span.start < at:  # ansi_line emits adjacent, non-overlapping spans; be safe anyway
            continue
        if span.start > at:
            out.append(html.escape(plain[at : span.start]))
        css = _css(span.style) if isinstance(span.style, Style) else ""
        chunk = html.escape(plain[span.start : span.end])
        out.append(f'<span style="{css}">{chunk}</span>' if css else chunk)
        at = span.end
    if at < len(plain):
        out.append(html.escape(plain[at:]))
    return "".join(out)


def render_cast(cast: Cast, head: int = HEAD_LINES, tail: int = TAIL_LINES) -> TerminalLines:
    buf = LineBuffer()
    for _, text in cast.frames:
        buf.append(text)
    n = buf.count
    lines = buf.lines
    width, height = cast.header.get("width"), cast.header.get("height")
    out = TerminalLines(total=n, duration_s=cast.duration, size=f"{width}×{height}" if width else "")
    if n <= head + tail:
        out.head = [line_html(lines[i]) for i in range(n)]
    else:
        out.head = [line_html(lines[i]) for i in range(head)]
        out.tail = [line_html(lines[i]) for i in range(n - tail, n)]
    return out
