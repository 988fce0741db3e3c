"""Install progress (OpenCode runtime download) and the warnings line."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label, ProgressBar

from opencode_tui import format as fmt
from opencode_tui.state import RunState
from opencode_tui.widgets.base import Panel, ShowsRunState
from opencode_tui_core.events import STOPPING_WARNINGS, CleanupStep, Phase, StepState


class InstallProgressBar(Horizontal):
    """Bytes installed across packages; hidden until the first InstallProgress event."""

    _label = ""

    def compose(self) -> ComposeResult:
        yield Label("install", id="install-label")
        yield ProgressBar(total=None, show_eta=False, id="install-bar")

    def show(self, state: RunState, *, compact: bool = False) -> None:
        # On a small terminal a finished install gives its line back once the agent has started.
        past = state.phase is not None and state.phase.phase not in (
            Phase.ADMISSION,
            Phase.SEED,
            Phase.INSTALL,
        )
        done, total = state.install_totals
        visible = bool(state.install) and not (compact and past and total is not None and done >= total)
        if self.display != visible:
            self.display = visible
        if not visible:
            return
        names = ", ".join(f"{p.package}{' (cached)' if p.cached else ''}" for p in state.install.values())
        label = Content.from_markup(
            "[b]install[/] $names $done/$total", names=names, done=fmt.nbytes(done), total=fmt.nbytes(total)
        )
        if label.plain != self._label:
            self._label = label.plain
            self.query_one("#install-label", Label).update(label)
        if total:
            self.query_one(ProgressBar).update(total=total, progress=done)


class WarningsBar(ShowsRunState, Panel):
    """Warnings the engine raised (e.g. ripgrep unavailable) and episode-health warnings, the latest
    one shown (a health warning wins: it is about the agent, not the set-up); without any, the latest
    informational notice (a step the engine took, e.g. ripgrep provisioned) as a plain ℹ line; hidden
    when there is neither."""

    def show_state(self, state: RunState) -> None:
        # "stopping the agent…" is news only until the agent has stopped: then it would read as still
        # under way (what the cancel became is the cleanup panel's and the outcome's to say)
        stopped = _agent_stopped(state)
        warnings = [
            w for w in state.warnings if not w.informational and not (stopped and w.code in STOPPING_WARNINGS)
        ]
        n = len(warnings) + len(state.health)
        notes = [w for w in state.warnings if w.informational]
        shown = bool(n or notes)
        if self.display != shown:
            self.display = shown
        if not shown:
            return
        more = f" (+{n - 1} more)" if n > 1 else ""
        if state.health:
            last_health = state.health[-1]
            self.show_content(
                Content.from_markup(
                    "[b $warning]⚠ health $code[/] $message$more",
                    code=last_health.kind.value,
                    message=fmt.short(last_health.message, 160),
                    more=more,
                )
            )
            return
        if not warnings:
            last_note = notes[-1]
            self.show_content(
                Content.from_markup(
                    "[dim]ℹ $code[/] [dim]$message[/]",
                    code=last_note.code,
                    message=fmt.short(last_note.message, 160),
                )
            )
            return
        last = warnings[-1]
        self.show_content(
            Content.from_markup(
                "[b $warning]⚠ $code[/] $message$more",
                code=last.code,
                message=fmt.short(last.message, 160),
                more=more,
            )
        )


def _agent_stopped(state: RunState) -> bool:
    """The agent is no longer running: the run has ended, or its receipt or release step is decided."""
    if state.finished:
        return True
    done = (StepState.OK, StepState.FAILED, StepState.SKIPPED)
    return any(
        (seen := state.cleanup.get(step)) is not None and seen.state in done
        for step in (CleanupStep.RECEIPT, CleanupStep.SANDBOX_RELEASED)
    )
