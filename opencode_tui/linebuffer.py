"""Append-only terminal text, kept as raw lines: nothing is decoded until a line is drawn.

Ingest is plain ``str.split("\\n")`` (tens of MB/s); ANSI decoding happens per visible line in the
terminal widget, through a small cache. The last element of ``lines`` is always the open (unfinished)
line, possibly empty.
"""

from __future__ import annotations

from rich.text import Text

# Lines longer than this are drawn cut (the rest is still kept and copied).
MAX_LINE_CHARS = 4000

# Raw view: control characters made visible (U+2400 block), so escape sequences can be read.
_CONTROL_PICTURES = {c: 0x2400 + c for c in range(32)} | {0x7F: 0x2421}


class LineBuffer:
    """Raw text split into lines; ``count`` lines are shown (the open line only when non-empty)."""

    __slots__ = ("chars", "lines", "version", "width")

    def __init__(self) -> None:
        self.lines: list[str] = [""]
        self.width = 0
        self.chars = 0
        self.version = 0  # bumped on clear, so caches keyed on (version, index) stay correct

    def __len__(self) -> int:
        return self.count

    @property
    def count(self) -> int:
        lines = self.lines
        return len(lines) if lines[-1] else len(lines) - 1

    @property
    def at_line_start(self) -> bool:
        return not self.lines[-1]

    def clear(self) -> None:
        self.lines = [""]
        self.width = 0
        self.chars = 0
        self.version += 1

    def append(self, text: str) -> None:
        if not text:
            return
        self.chars += len(text)
        lines = self.lines
        if "\n" not in text:
            line = lines[-1] + text
            if "\r" in text:
                line = collapse_cr(line)
            lines[-1] = line
            if len(line) > self.width:
                self.width = min(len(line), MAX_LINE_CHARS)
            return
        parts = text.split("\n")
        first = lines[-1] + parts[0]
        lines[-1] = first
        lines.extend(parts[1:])
        widest = max(len(first), max(map(len, parts)))
        if widest > self.width:
            self.width = min(widest, MAX_LINE_CHARS)

    def ensure_line_start(self) -> None:
        if self.lines[-1]:
            self.append("\n")

    def plain(self, start: int, end: int) -> list[str]:
        """Lines ``start``..``end`` (exclusive) without escape sequences."""
        return [ansi_line(self.lines[i]).plain for i in range(max(start, 0), min(end, len(self.lines)))]


def collapse_cr(line: str) -> str:
    """What a terminal shows after carriage returns: the text after the last ``\\r`` (a trailing one, as
    in ``\\r\\n``, is ignored). Overwrites that leave a longer tail are approximated."""
    end = len(line) - 1 if line.endswith("\r") else len(line)
    cut = line.rfind("\r", 0, end)
    if cut < 0:
        return line
    return line[cut + 1 :]


def ansi_line(raw: str) -> Text:
    """One line with its ANSI colours decoded (cursor movement and other sequences dropped)."""
    if "\r" in raw:
        raw = collapse_cr(raw).rstrip("\r")
    if len(raw) > MAX_LINE_CHARS:
        raw = raw[:MAX_LINE_CHARS]
    if "\x1b" not in raw:
        text = Text(raw, end="", no_wrap=True)
    else:
        text = Text.from_ansi(raw, end="", no_wrap=True)
    if "\t" in raw:
        text.expand_tabs(8)
    return text


def raw_line(raw: str) -> Text:
    """One line exactly as received, control characters (ESC, CR, TAB...) shown as visible symbols."""
    if len(raw) > MAX_LINE_CHARS:
        raw = raw[:MAX_LINE_CHARS]
    return Text(raw.translate(_CONTROL_PICTURES), end="", no_wrap=True)
