"""The run header: one line, the phase and the outcome first, then what runs where.

It never wraps: the line is cut with an ellipsis at the widget's width, and because the phase, the
outcome, the task and the elapsed time come first they stay visible on an 80-column terminal; the
details (mode, provider, sandbox, versions, model) are what an ellipsis eats.
"""

from __future__ import annotations

from datetime import datetime

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from opencode_tui import format as fmt
from opencode_tui.state import RunState
from opencode_tui_core.failures import Outcome

_PHASE_STYLE = {
    "running": "$state-running",
    "ok": "$state-ok",
    "failed": "$state-failed",
    "skipped": "$state-skipped",
    "pending": "$state-pending",
}


def phase_words(state: RunState) -> tuple[str, str]:
    """What the header says about where the run is, and its style.

    Once the outcome is decided it is the run's last word: a failed or cancelled run is never shown as
    ``done ok`` (the phase ``done`` only says the engine finished); the outcome's own words and colour
    replace the phase state, with the failure kind and the reward when there is one."""
    o = state.outcome
    phase = state.phase
    name = str(phase.phase) if phase else "starting"
    if o is not None:
        in_batch = bool(state.info and state.info.batch_id)
        if o.action is Outcome.RETRY:  # what happened here, and what a batch does (the TUI never retries)
            kind = f"{o.failure_kind}; " if o.failure_kind else ""
            words = f"{name} · " + (
                f"retried by its batch ({kind}attempt failed)"
                if in_batch
                else f"not retried ({kind}a batch would retry)"
            )
        else:
            words = f"{name} · {o.action}" + (f" ({o.failure_kind})" if o.failure_kind else "")
        if o.reward is not None:
            words += f" · reward {o.reward:g}"
        return words, "$state-ok" if o.action is Outcome.SCORED else "$state-failed"
    pstate = str(phase.state) if phase else "pending"
    return f"{name} {pstate}", _PHASE_STYLE.get(pstate, "$foreground")


def held_words(state: RunState, now: datetime | None, *, live: bool) -> str | None:
    """The debugger's hold, as the header says it: ``HELD before call 4 (12 s)`` (None: nothing held).

    Live, it adds that the run deadline keeps counting (a hold spends the run's budget)."""
    held = state.held
    if held is None or state.finished:
        return None
    at = now or state.last_ts
    age = max((at - held.ts).total_seconds(), 0.0) if at is not None else 0.0
    seconds = f"{age:.0f} s" if age < 60 else fmt.duration(age)
    n = held.call_number if held.call_number is not None else "?"
    where = f"reply of call {n} for editing" if held.what == "reply" else f"before call {n}"
    counting = ", run deadline counting" if live else ""
    return f"HELD {where} ({seconds}{counting})"


class RunHeader(Widget):
    """One line: phase/outcome · task · elapsed · mode · keep · provider · version · model · sandbox."""

    # Bound to the run screen's keep (itself bound to the app's): None when there is nothing to keep.
    keep: reactive[bool | None] = reactive(None, init=False)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.line = Content("")
        self._shown: tuple[RunState, str, datetime | None] | None = None
        self._key: tuple[object, ...] | None = None  # the words last shown

    def watch_keep(self) -> None:
        if self._shown is not None:
            state, mode, now = self._shown
            self.show(state, mode=mode, now=now)

    def show(self, state: RunState, *, mode: str, now: datetime | None = None) -> None:
        self._shown = (state, mode, now)
        keep = self.keep
        words, style = phase_words(state)
        held = held_words(state, now, live=mode == "LIVE")
        elapsed = state.elapsed_s(now)
        budget = state.run_budget_s
        owned = state.sandbox_owned
        ownership = "" if owned is None else (" (owned)" if owned else " (borrowed)")
        user = f" · user {state.sandbox_user}" if state.sandbox_user else ""
        model = state.started.model if state.started else None
        # a limit asked for and not enforced (limits.enforce: warn): said where the run is described
        unenforced = state.sandbox.unenforced_limits if state.sandbox else []
        # Called on every redraw while output streams: the markup is parsed only when a word changed
        # (the elapsed time: once a second).
        key = (
            held,
            words,
            style,
            fmt.duration(elapsed),
            budget,
            state.human_intervened,
            tuple(unenforced),
            mode,
            keep,
            state.task_id,
            state.provider,
            state.sandbox_id,
            ownership,
            user,
            state.opencode_version,
            model,
        )
        if key == self._key:
            return
        self._key = key
        line = Content.from_markup(
            # the hold first: at 80 columns it is what must not be cut; then the task right after the
            # outcome (the mode, a replay's run directory name, would otherwise push it into the ellipsis)
            ("[b reverse $warning]$held[/] · " if held else "")
            + f"[b {style}]$words[/] · [b $primary]$task[/] · $elapsed / $budget"
            + (" · [b $error]human intervened[/]" if state.human_intervened else "")
            + (" · [b $warning]$unenforced limit not enforced[/]" if unenforced else "")
            # the sandbox last: a container id is 64 characters, and the ellipsis may take its tail
            + " · [b]$mode[/]$keep · $provider · opencode $version · model $model"
            " · sandbox [b]$sandbox[/]$ownership$user",
            words=words,
            held=held or "",
            unenforced=" and ".join(unenforced),
            elapsed=fmt.duration(elapsed),
            budget=fmt.duration(budget) if budget else "?",
            mode=mode,
            keep="" if keep is None else f" · keep sandbox: {'on' if keep else 'off'}",
            task=state.task_id or "unknown task",
            provider=state.provider or "?",
            sandbox=state.sandbox_id or "not yet",
            ownership=ownership,
            user=user,
            version=state.opencode_version or "?",
            model=model or "?",
        )
        if line.plain != self.line.plain or line.spans != self.line.spans:
            self.line = line
            self.refresh()

    @property
    def plain(self) -> str:
        return self.line.plain

    def render(self) -> Content:
        return self.line.truncate(max(self.content_size.width, 1), ellipsis=True)
