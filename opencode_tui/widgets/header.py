"""The run header: what runs where, which phase, how long against the budget."""

from __future__ import annotations

from datetime import datetime

from textual.content import Content

from opencode_tui import format as fmt
from opencode_tui.state import RunState
from opencode_tui.widgets.base import Panel

_PHASE_STYLE = {
    "running": "$state-running",
    "ok": "$state-ok",
    "failed": "$state-failed",
    "skipped": "$state-skipped",
    "pending": "$state-pending",
}


class RunHeader(Panel):
    """Two lines: task/provider/sandbox/versions, then phase/elapsed/mode/keep."""

    def show(self, state: RunState, *, mode: str, keep: bool | None, now: datetime | None = None) -> None:
        owned = state.sandbox_owned
        sandbox = state.sandbox_id or "not yet"
        ownership = "" if owned is None else (" (owned)" if owned else " (borrowed)")
        user = f" · user {state.sandbox_user}" if state.sandbox_user else ""
        model = state.started.model if state.started else None
        line1 = Content.from_markup(
            "[b $primary]$task[/] · $provider · sandbox [b]$sandbox[/]$ownership$user · opencode $version"
            " · model $model",
            task=state.task_id or "unknown task",
            provider=state.provider or "?",
            sandbox=sandbox,
            ownership=ownership,
            user=user,
            version=state.opencode_version or "?",
            model=model or "?",
        )
        phase = state.phase
        phase_name = str(phase.phase) if phase else "starting"
        phase_state = str(phase.state) if phase else "pending"
        elapsed = state.elapsed_s(now)
        budget = state.run_budget_s
        if state.outcome is not None:
            outcome = f" · outcome {state.outcome.action}"
            if state.outcome.reward is not None:
                outcome += f" reward {state.outcome.reward:g}"
        else:
            outcome = ""
        keep_text = "" if keep is None else f" · keep sandbox: {'on' if keep else 'off'}"
        human = " · [b $error]human intervened[/]" if state.human_intervened else ""
        style = _PHASE_STYLE.get(phase_state, "$foreground")
        line2 = Content.from_markup(
            f"phase [b {style}]$phase[/] $pstate · elapsed $elapsed / $budget$outcome{human} · [b]$mode[/]$keep",
            phase=phase_name,
            pstate=phase_state,
            elapsed=fmt.duration(elapsed),
            budget=fmt.duration(budget) if budget else "?",
            outcome=outcome,
            mode=mode,
            keep=keep_text,
        )
        self.show_content(Content("\n").join([line1, line2]), layout=False)
