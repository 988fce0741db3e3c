"""Install progress (OpenCode runtime download) and the warnings line."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Label, ProgressBar

from core.events import Phase
from opencode_tui import format as fmt
from opencode_tui.state import RunState
from opencode_tui.widgets.base import Panel


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


class WarningsBar(Panel):
    """Warnings the engine raised (e.g. ripgrep unavailable); hidden when there are none."""

    def show(self, state: RunState) -> None:
        if self.display != bool(state.warnings):
            self.display = bool(state.warnings)
        if not state.warnings:
            return
        last = state.warnings[-1]
        more = f" (+{len(state.warnings) - 1} more)" if len(state.warnings) > 1 else ""
        self.show_content(
            Content.from_markup(
                "[b $warning]⚠ $code[/] $message$more",
                code=last.code,
                message=fmt.short(last.message, 160),
                more=more,
            )
        )
