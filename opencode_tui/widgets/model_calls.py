"""Model calls seen by the recording proxy, one row per call; Enter opens the call's request/response."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from core.events import ModelCall
from opencode_tui import format as fmt

COLUMNS = ("time", "kind", "message id", "status", "tok in", "tok out", "latency", "TTFT")


class ModelCallsTable(DataTable):
    """Rows follow ``RunState.model_calls`` (a prefix of it when the replay cursor is in the past)."""

    BINDINGS = [
        Binding("enter", "select_cursor", "Call detail", tooltip="Show the call's request and response")
    ]

    class Open(Message):
        def __init__(self, call: ModelCall) -> None:
            self.call = call
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.calls: list[ModelCall] = []
        self.start: datetime | None = None

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name)
        self.border_title = "Model calls"

    def _row(self, call: ModelCall) -> list[Text]:
        colors = self.app.theme_variables
        if call.status is None:
            status = Text("error" if call.error else "pending", style=colors.get("warning", ""))
        elif call.status >= 400:
            status = Text(str(call.status), style=colors.get("error", ""))
        else:
            status = Text(str(call.status), style=colors.get("success", ""))
        right = {"justify": "right"}
        return [
            Text(fmt.offset(call.started_at, self.start)),
            Text(call.kind),
            Text(call.message_id or fmt.DASH),
            status,
            Text(fmt.count(call.tokens_in), **right),
            Text(fmt.count(call.tokens_out), **right),
            Text(fmt.seconds(call.latency_s), **right),
            Text(fmt.seconds(call.ttft_s), **right),
        ]

    def sync(self, calls: list[ModelCall], start: datetime | None, force: bool = False) -> None:
        """Make the rows match ``calls``: append new ones; rebuild if rows went away or changed."""
        mine = self.calls
        rebuild = force or start != self.start or len(calls) < len(mine)
        if not rebuild:
            for i, old in enumerate(mine):
                if calls[i] is not old:
                    rebuild = True
                    break
        self.start = start
        if rebuild:
            row = self.cursor_row
            self.clear()
            mine = self.calls = []
            for call in calls:
                self.add_row(*self._row(call), key=call.call_id)
                mine.append(call)
            if calls:
                self.move_cursor(row=min(row, len(calls) - 1), animate=False)
            self.border_subtitle = str(len(calls))
            return
        for call in calls[len(mine) :]:
            self.add_row(*self._row(call), key=call.call_id)
            mine.append(call)
        self.border_subtitle = str(len(calls))

    @property
    def selected(self) -> ModelCall | None:
        if not self.calls or not 0 <= self.cursor_row < len(self.calls):
            return None
        return self.calls[self.cursor_row]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        call = self.selected
        if call is not None:
            self.post_message(self.Open(call))

    def select_call(self, call_id: str) -> None:
        for i, call in enumerate(self.calls):
            if call.call_id == call_id:
                self.move_cursor(row=i, animate=False)
                return
