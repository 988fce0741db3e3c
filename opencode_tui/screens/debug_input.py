"""The debugger's input box (issue 27): what to say to the agent, or the model's reply to write or edit.

A small modal: a title, one line of help, the text, Send and Cancel. ``say`` is one line (Enter sends);
``answer`` and ``edit`` take several lines (a reply, or a tool call as JSON), sent with ctrl+s.
Dismissed with the text (Send) or None (Cancel, Esc): nothing is sent on cancel.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea


class DebugInputScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="debug-input.cancel"),
        Binding("ctrl+s", "send", "Send", priority=True, id="debug-input.send"),
    ]

    def __init__(self, title: str, help_text: str, *, text: str = "", multiline: bool = False) -> None:
        super().__init__(classes="modal")
        self.title_text = title
        self.help_text = help_text
        self.initial = text
        self.multiline = multiline

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog debug-input" + (" -multiline" if self.multiline else "")):
            yield Label(Content.from_markup("[b]$t[/]", t=self.title_text), id="debug-title")
            yield Static(Content(self.help_text), id="debug-help")
            if self.multiline:
                area = TextArea(self.initial, id="debug-text", soft_wrap=True, show_line_numbers=False)
                area.cursor_blink = False
                yield area
            else:
                yield Input(self.initial, id="debug-text", placeholder="type, then Enter")
            with Horizontal(id="buttons"):
                yield Button(
                    "Send (ctrl+s)" if self.multiline else "Send (enter)", variant="primary", id="send"
                )
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#debug-text").focus()

    @property
    def text(self) -> str:
        if self.multiline:
            return self.query_one("#debug-text", TextArea).text
        return self.query_one("#debug-text", Input).value

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.action_send()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "send":
            self.action_send()
        else:
            self.action_cancel()

    def action_send(self) -> None:
        self.dismiss(self.text)

    def action_cancel(self) -> None:
        self.dismiss(None)
