"""Cleanup: the four steps that must be confirmed before anything is exported or verified."""

from __future__ import annotations

from textual.binding import Binding
from textual.content import Content
from textual.message import Message

from opencode_tui import format as fmt
from opencode_tui.state import CLEANUP_ORDER, RunState
from opencode_tui.widgets.base import Panel, ShowsRunState

# Kept under these names for the screens that import them from here.
LABELS = fmt.CLEANUP_LABELS
ICONS = fmt.STEP_ICONS


class CleanupPanel(ShowsRunState, Panel, can_focus=True):
    """Each step pending / running / ok / failed / skipped, with the engine's reason; Enter shows each
    step's detail (the receipt's fields, what was destroyed or disconnected)."""

    BINDINGS = [
        Binding(
            "enter",
            "open",
            "Cleanup detail",
            tooltip="Each step's detail, with the receipt",
            id="cleanup.open",
        )
    ]

    class Open(Message):
        """Enter (or a click) on the panel: the screen shows the cleanup detail."""

    def action_open(self) -> None:
        self.post_message(self.Open())

    def on_click(self) -> None:
        self.post_message(self.Open())

    def show_state(self, state: RunState) -> None:
        rows = []
        for step in CLEANUP_ORDER:
            seen = state.cleanup.get(step)
            st = str(seen.state) if seen else "pending"
            reason = (seen.reason or "") if seen else ""
            rows.append(
                Content.from_markup(
                    f"[$state-{st}]$icon[/] [b]$label[/] [$state-{st}]$state[/]$reason",
                    icon=ICONS.get(st, "?"),
                    label=f"{LABELS[step]:<20}",
                    state=st,
                    reason=f" — {reason}" if reason else "",
                )
            )
        self.show_content(Content("\n").join(rows))

    def step_states(self, state: RunState) -> dict[str, str]:
        return {
            str(s): str(state.cleanup[s].state) if s in state.cleanup else "pending" for s in CLEANUP_ORDER
        }
