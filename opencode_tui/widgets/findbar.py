"""A one-line query under a pane: the terminal's search, the model-call table's filter.

Hidden until opened; Enter applies the query (and hands the keys back to the pane), Escape closes it
and clears what it applied. Reopened, it shows the query applied before, selected: typing starts a new
query (it used to append to the old one), an arrow key keeps it to edit.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.message import Message
from textual.widgets import Input
from textual.widgets.input import Selection


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
        # open() selects the previous query itself (focus by a click must not select)
        super().__init__(placeholder=placeholder, id=id, select_on_focus=False)

    def open(self, value: str = "") -> None:
        self.display = True
        self.value = value
        self.selection = Selection(0, len(value))  # the cursor at its end, the query selected
        self.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.display = False
        self.post_message(self.Applied(self, self.value))

    def action_close(self) -> None:
        self.display = False
        self.post_message(self.Closed(self))
