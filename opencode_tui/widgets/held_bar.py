"""The debugger's bar (issue 27): under the header while the live agent's call is held, the keys that
act on it, in one line that fits 80 columns (the footer cannot list them all beside the panels' keys).
Hidden when nothing is held, and in a replay (nothing there can be acted on)."""

from __future__ import annotations

from textual.content import Content

from opencode_tui.state import RunState
from opencode_tui.widgets.base import Panel, ShowsRunState

KEYS_BEFORE = "g continue · n step · h request · m say · a answer · e edit reply · x abort"
KEYS_REPLY = "e edit the reply · g send it as it came · h request · m say · x abort"


class HeldBar(ShowsRunState, Panel):
    def __init__(self, *, live: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.live = live
        self.display = False

    def show_state(self, state: RunState) -> None:
        held = state.held if self.live and not state.finished else None
        shown = held is not None
        if self.display != shown:
            self.display = shown
        if held is None:
            return
        keys = KEYS_REPLY if held.what == "reply" else KEYS_BEFORE
        self.show_content(Content.from_markup("[b $warning]⏸[/] $keys", keys=keys))
