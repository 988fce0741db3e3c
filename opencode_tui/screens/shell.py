"""An interactive shell in the sandbox, inside the TUI (pyte over ``EpisodeControl.open_shell``).

Every key goes to the shell except ``ctrl+]``, which returns to the run screen (like telnet), and the
app's priority bindings (``ctrl+q``). The episode keeps streaming into the run screen meanwhile.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Static

from opencode_tui.messages import ShellStateChanged
from opencode_tui.widgets.pty import OpenPty, PtyTerminal


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
        self.app.post_message(ShellStateChanged("failed" if failed else "closed", event.reason))
        self.query_one("#shell-title", Static).update(
            Content.from_markup("[b]Shell closed[/]: $r · [dim]ctrl+] returns to the run[/]", r=event.reason)
        )
        if failed:
            self.notify(event.reason, severity="error", timeout=6)

    async def action_leave(self) -> None:
        pty = self.query_one(PtyTerminal)
        await pty.close()
        self.workers.cancel_node(pty)
        self.app.pop_screen()
