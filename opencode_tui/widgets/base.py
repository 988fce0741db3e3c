"""What the run screen's panels share: the panel protocol (:class:`ShowsRunState`) and a Static that
redraws only when its content really changed (panels are refreshed per event batch)."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from opencode_tui.state import RunState


class ShowsRunState:
    """The panel protocol: a panel that shows the folded run state declares it by mixing this in.

    The run screen binds its ``view_state`` (the run as of the timeline's cursor; live: now) into the
    panel's (``data_bind``); each change, or each batch folded into it in place, calls :meth:`show_state`.
    """

    # always_update: the state is folded in place, so "the same object" still means "redraw"
    view_state: reactive[RunState | None] = reactive(None, init=False, always_update=True, repaint=False)

    def watch_view_state(self, state: RunState | None) -> None:
        if state is not None:
            self.show_state(state)

    def show_state(self, state: RunState) -> None:
        raise NotImplementedError


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
