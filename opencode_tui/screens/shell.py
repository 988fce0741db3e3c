"""An interactive shell in the sandbox, inside the TUI (pyte over ``EpisodeControl.open_shell``).

Every key goes to the shell except ``ctrl+]``, which returns to the run screen (like telnet), and the
app's priority bindings (``ctrl+q``). The episode keeps streaming into the run screen meanwhile.

When the shell ends on its own, the title says what ended it: the person (``exit``), or the run (its
deadline, a cancel: the close drains every process in the sandbox, this shell's too).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Static

from opencode_tui import format as fmt
from opencode_tui.messages import ShellStateChanged
from opencode_tui.state import RunState
from opencode_tui.widgets.pty import EXITED, OpenPty, PtyTerminal
from opencode_tui_core.events import FailureRecorded, Phase

# The run's events reach its screen in batches: what closed the shell may be folded in a moment later.
RECHECK_S = 1.0
RUNNING = (Phase.ADMISSION, Phase.SEED, Phase.INSTALL, Phase.AGENT)


def run_ended_it(state: RunState) -> str | None:
    """Why the run (not the person) closed the shell, when it did: the run has left the agent phase
    (its close drains every process in the sandbox) and, if one was recorded, the failure that ended it."""
    if state.phase is None or state.phase.phase in RUNNING:
        return None
    failure = next((f.failure for f in reversed(state.failures) if isinstance(f, FailureRecorded)), None)
    if failure is not None:
        return f"the run ended it ({failure.kind}: {fmt.short(failure.message, 60)})"
    return f"the run ended it (the episode had moved on to {state.phase.phase})"


class ShellScreen(Screen[None]):
    BINDINGS = [
        Binding(
            "ctrl+right_square_bracket", "leave", "Back to the run (ctrl+])", priority=True, id="shell.leave"
        )
    ]

    def __init__(self, open_pty: OpenPty, sandbox: str) -> None:
        super().__init__()
        self.open_pty = open_pty
        self.sandbox = sandbox

    def compose(self) -> ComposeResult:
        yield Static(
            Content.from_markup(
                "[b]Shell in sandbox $sb[/] · [dim]ctrl+] returns to the run; the episode keeps running[/]",
                sb=self.sandbox,
            ),
            id="shell-title",
        )
        yield PtyTerminal(self.open_pty, id="pty")

    def on_mount(self) -> None:
        self.query_one(PtyTerminal).focus()
        self.app.post_message(ShellStateChanged("opening", self.sandbox))

    def on_pty_terminal_opened(self) -> None:
        self.app.post_message(ShellStateChanged("open", self.sandbox))

    def on_pty_terminal_closed(self, event: PtyTerminal.Closed) -> None:
        failed = event.reason.startswith("could not")
        reason = self._why(event.reason)
        self.app.post_message(ShellStateChanged("failed" if failed else "closed", reason))
        self._show_closed(reason)
        if failed:
            self.notify(event.reason, severity="error", timeout=6)
        elif event.reason == EXITED and reason == EXITED:
            self.set_timer(RECHECK_S, self._recheck)

    def _run_state(self) -> RunState | None:
        for screen in reversed(self.app.screen_stack):
            state = getattr(screen, "state", None)
            if isinstance(state, RunState):
                return state
        return None

    def _why(self, reason: str) -> str:
        """``reason``, or what the run says ended the shell when it merely saw it exit."""
        state = self._run_state()
        ended = run_ended_it(state) if reason == EXITED and state is not None else None
        return ended or reason

    def _recheck(self) -> None:
        reason = self._why(EXITED)
        if reason != EXITED:
            self.app.post_message(ShellStateChanged("closed", reason))
            self._show_closed(reason)

    def _show_closed(self, reason: str) -> None:
        self.query_one("#shell-title", Static).update(
            Content.from_markup("[b]Shell closed[/]: $r · [dim]ctrl+] returns to the run[/]", r=reason)
        )

    async def action_leave(self) -> None:
        pty = self.query_one(PtyTerminal)
        await pty.close()
        self.workers.cancel_node(pty)
        self.app.pop_screen()
