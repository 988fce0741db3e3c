"""Cleanup: the four steps that must be confirmed before anything is exported or verified."""

from __future__ import annotations

from textual.content import Content

from core.events import CleanupStep
from opencode_tui.state import CLEANUP_ORDER, RunState
from opencode_tui.widgets.base import Panel

LABELS = {
    CleanupStep.RECEIPT: "Cleanup receipt",
    CleanupStep.DESCENDANTS: "Descendants drained",
    CleanupStep.TRANSCRIPT_SNAPSHOT: "Transcript snapshot",
    CleanupStep.SANDBOX_RELEASED: "Sandbox released",
}
ICONS = {"pending": "○", "running": "◐", "ok": "✓", "failed": "✗", "skipped": "\u2013"}


class CleanupPanel(Panel):
    """Each step pending / running / ok / failed / skipped, with the engine's reason."""

    def show(self, state: RunState) -> None:
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
