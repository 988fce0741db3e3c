"""The panel tabs of a small terminal: one line naming the panels, the shown one highlighted.

Below ``COMPACT_WIDTH``×``COMPACT_HEIGHT`` the run screen shows one panel at a time (each gets the whole
height) instead of squeezing five panels into a few lines each; the number keys switch panels.
"""

from __future__ import annotations

from textual.content import Content
from textual.events import Click
from textual.message import Message
from textual.widget import Widget

from opencode_tui.panels import RUN_PANELS

COMPACT_WIDTH = 100
COMPACT_HEIGHT = 30
# (id, title) of the registered panels (opencode_tui.panels): the key is the position (1-based)
PANELS = tuple((p.id, p.title) for p in RUN_PANELS)


def is_compact(width: int, height: int) -> bool:
    return width < COMPACT_WIDTH or height < COMPACT_HEIGHT


class PanelTabs(Widget):
    class Selected(Message):
        def __init__(self, panel: str) -> None:
            self.panel = panel
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.active = PANELS[0][0]
        self.badges: dict[str, str] = {}
        self._spans: list[tuple[int, int, str]] = []

    def show(self, active: str, badges: dict[str, str]) -> None:
        if (active, badges) != (self.active, self.badges):
            self.active, self.badges = active, dict(badges)
            self.refresh()

    def render(self) -> Content:
        parts: list[Content] = []
        self._spans = []
        x = 0
        for i, (pid, title) in enumerate(PANELS, 1):
            badge = self.badges.get(pid, "")
            label = f" {i} {title}{f' {badge}' if badge else ''} "
            style = "bold reverse $primary" if pid == self.active else "$foreground-muted"
            parts.append(Content.styled(label, style))
            self._spans.append((x, x + len(label), pid))
            x += len(label) + 1
        return Content(" ").join(parts).truncate(max(self.content_size.width, 1), ellipsis=True)

    def on_click(self, event: Click) -> None:
        for start, end, pid in self._spans:
            if start <= event.x < end:
                self.post_message(self.Selected(pid))
                return
