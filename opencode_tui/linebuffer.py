"""Append-only terminal text, kept as raw lines: nothing is decoded until a line is drawn.

Ingest is plain ``str.split("\\n")`` (tens of MB/s); ANSI decoding happens per visible line in the
terminal widget, through a small cache. The last element of ``lines`` is always the open (unfinished)
line, possibly empty.
"""

from __future__ import annotations

import re

from rich.ansi import AnsiDecoder
from rich.style import Style
from rich.text import Span, Text

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


# An escape sequence: CSI (SGR when it ends in ``m``), OSC (ended by BEL or ST, or cut at the line's end),
# a character-set designation (ESC ( B), or any other two-character escape.
_ESCAPE = re.compile(r"\x1b(?:\[([0-?]*)[ -/]*([@-~])|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[()*+][ -~]?|[ -~])")
# (style before, SGR parameters) -> style after. Terminal output repeats a handful of colours, so this
# stays small; it is emptied if a program emits an unusual variety.
_SGR_STYLES: dict[tuple[Style | None, str], Style | None] = {}
_SGR_STYLES_MAX = 4096


def _sgr_style(style: Style | None, params: str) -> Style | None:
    key = (style, params)
    found = _SGR_STYLES.get(key, _SGR_STYLES)
    if found is not _SGR_STYLES:
        return found  # type: ignore[return-value]
    # Rich's decoder says what the parameters mean (colours, attributes, resets), once per pair.
    decoder = AnsiDecoder()
    decoder.style = style or Style.null()
    decoder.decode_line(f"\x1b[{params}m")
    after = decoder.style or None
    if len(_SGR_STYLES) >= _SGR_STYLES_MAX:
        _SGR_STYLES.clear()
    _SGR_STYLES[key] = after
    return after


def ansi_line(raw: str) -> Text:
    """One line with its ANSI colours decoded (cursor movement and other sequences dropped).

    This runs for every line that scrolls into view while output floods in, so it is a single regex
    pass with the style of each SGR sequence looked up, not worked out (``Text.from_ansi`` parses every
    sequence again: about half of a frame's cost)."""
    if "\r" in raw:
        raw = collapse_cr(raw).rstrip("\r")
    if len(raw) > MAX_LINE_CHARS:
        raw = raw[:MAX_LINE_CHARS]
    if "\x1b" not in raw:
        text = Text(raw, end="", no_wrap=True)
    else:
        parts: list[str] = []
        spans: list[Span] = []
        style: Style | None = None
        at = pos = 0
        for m in _ESCAPE.finditer(raw):
            start = m.start()
            if start > at:
                chunk = raw[at:start]
                parts.append(chunk)
                if style is not None:
                    spans.append(Span(pos, pos + len(chunk), style))
                pos += len(chunk)
            at = m.end()
            if m.group(2) == "m":
                style = _sgr_style(style, m.group(1))
        if at < len(raw):
            parts.append(raw[at:])
            if style is not None:
                spans.append(Span(pos, pos + len(raw) - at, style))
        text = Text("".join(parts), end="", no_wrap=True, spans=spans)
    if "\t" in raw:
        text.expand_tabs(8)
    return text


def raw_line(raw: str) -> Text:
    """One line exactly as received, control characters (ESC, CR, TAB...) shown as visible symbols."""
    if len(raw) > MAX_LINE_CHARS:
        raw = raw[:MAX_LINE_CHARS]
    return Text(raw.translate(_CONTROL_PICTURES), end="", no_wrap=True)
