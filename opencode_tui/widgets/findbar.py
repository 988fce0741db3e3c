"""A one-line query under a pane: the terminal's search, the model-call table's filter.

Hidden until opened; Enter applies the query (and hands the keys back to the pane), Escape closes it
and clears what it applied.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input


class FindBar(Input):
    BINDINGS = [Binding("escape", "close", "Close", show=False, id="find.close")]

    class Applied(Message):
        def __init__(self, bar: FindBar, query: str) -> None:
            self.bar = bar
            self.query = query
            super().__init__()

        @property
        def control(self) -> FindBar:
            return self.bar

    class Closed(Message):
        def __init__(self, bar: FindBar) -> None:
            self.bar = bar
            super().__init__()

        @property
        def control(self) -> FindBar:
            return self.bar

    def __init__(self, placeholder: str = "", *, id: str | None = None) -> None:
        # reopened with the query applied before: typing continues it (no select-all on focus)
        super().__init__(placeholder=placeholder, id=id, select_on_focus=False)

    def open(self, value: str = "") -> None:
        self.display = True
        self.value = value
        self.cursor_position = len(value)
        self.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.display = False
        self.post_message(self.Applied(self, self.value))

    def action_close(self) -> None:
        self.display = False
        self.post_message(self.Closed(self))
