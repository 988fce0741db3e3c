"""A Static that redraws only when its content really changed (panels are refreshed per event batch)."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static


class Panel(Static):
    _shown_key: tuple[str, tuple] | None = None

    def show_content(self, content: Content, *, layout: bool = True) -> bool:
        """Update unless identical; ``layout=False`` for fixed-size panels (no screen re-layout)."""
        key = (content.plain, tuple(content.spans))
        if key == self._shown_key:
            return False
        self._shown_key = key
        self.update(content, layout=layout)
        return True
