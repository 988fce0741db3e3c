"""Model calls seen by the recording proxy, one row per call; Enter opens the call's request/response.

``/`` filters the rows (:func:`call_matches`): ``status:error`` (no response, HTTP >= 400, or a 2xx that
was no answer or broke: shown as ``200 failed``),
``status:ok``, ``status:4xx``, ``status:429``, ``status:pending``; ``kind:agent``, ``kind:title``,
``kind:compaction``; alternatives with ``|`` (``status:429|5xx``); other words match the kind, status,
call id, message id, session id or error (``subagent``: a subagent's calls, marked ``↳`` before their
kind). All terms must match.
"""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from opencode_tui import format as fmt
from opencode_tui.format import status_word
from opencode_tui.state import RunState
from opencode_tui.widgets.base import ShowsRunState
from opencode_tui_core.events import ModelCall

# latency and TTFT before the long ids, so they stay on screen at 120 columns
COLUMNS = ("time", "kind", "status", "latency", "TTFT", "tok in", "tok out", "message id")


def _status_is(call: ModelCall, want: str) -> bool:
    status = call.status
    if want == "error":
        return call.failed and (status is not None or bool(call.error))
    if want == "ok":
        return status is not None and not call.failed
    if want == "pending":
        return status is None and not call.error
    if len(want) == 3 and want.endswith("xx") and want[0].isdigit():
        return status is not None and str(status)[0] == want[0]
    return status is not None and str(status) == want


SUBAGENT_MARK = (
    "↳ "  # before the kind of a subagent's call (opencode_tui_core.tally: its session is not the episode's)
)


def call_matches(call: ModelCall, query: str, subagent: bool = False) -> bool:
    """Does ``call`` pass the filter ``query`` (see the module docstring)?"""
    for term in query.lower().split():
        field, _, value = term.partition(":")
        if value and field == "status":
            if not any(_status_is(call, v) for v in value.split("|") if v):
                return False
        elif value and field == "kind":
            if not any(call.kind.startswith(v) for v in value.split("|") if v):
                return False
        else:
            hay = " ".join(
                x or ""
                for x in (
                    call.kind,
                    status_word(call),
                    call.call_id,
                    call.message_id,
                    call.session_id,
                    call.error,
                    "subagent" if subagent else None,
                )
            ).lower()
            if term not in hay:
                return False
    return True


class ModelCallsTable(ShowsRunState, DataTable):
    """Rows follow ``RunState.model_calls`` (a prefix of it when the replay cursor is in the past)."""

    BINDINGS = [
        Binding(
            "enter",
            "select_cursor",
            "Call detail",
            tooltip="Show the call's request and response",
            id="calls.open",
        ),
        Binding(
            "slash",
            "filter",
            "Filter",
            key_display="/",
            tooltip="Filter the calls: status:error|ok|4xx|5xx|429, kind:agent|title|compaction, words",
            id="calls.filter",
        ),
    ]

    class Open(Message):
        def __init__(self, call: ModelCall) -> None:
            self.call = call
            super().__init__()

    class FilterWanted(Message):
        """``/`` was pressed: the screen opens the filter bar under the table."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.all_calls: list[ModelCall] = []  # what the state holds (the rows before filtering)
        self.calls: list[ModelCall] = []  # the rows shown
        self.start: datetime | None = None
        self.filter_text = ""
        self.subagent_ids: set[str] = set()  # calls made in a subagent's session

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name)
        self.border_title = "Model calls"

    def _row(self, call: ModelCall) -> list[Text]:
        colors = self.app.theme_variables
        if call.status is None:
            status = Text(status_word(call), style=colors.get("warning", ""))
        elif call.failed:
            status = Text(status_word(call), style=colors.get("error", ""))
        else:
            status = Text(str(call.status), style=colors.get("success", ""))
        return [
            Text(fmt.offset(call.started_at, self.start)),
            Text(SUBAGENT_MARK + call.kind, style=colors.get("accent", ""))
            if call.call_id in self.subagent_ids
            else Text(call.kind),
            status,
            Text(fmt.seconds(call.latency_s), justify="right"),
            Text(fmt.seconds(call.ttft_s), justify="right"),
            Text(fmt.count(call.tokens_in), justify="right"),
            Text(fmt.count(call.tokens_out), justify="right"),
            Text(call.message_id or fmt.DASH),
        ]

    def show_state(self, state: RunState) -> None:
        subagent = {c.call_id for c in state.model_calls if state.tally.subagent_call(c)}
        changed = subagent != self.subagent_ids
        self.subagent_ids = subagent
        self.sync(state.model_calls, state.start_time, force=changed)

    def sync(self, calls: list[ModelCall], start: datetime | None, force: bool = False) -> None:
        """Make the rows match ``calls`` (filtered): append new ones; rebuild if rows went away or changed."""
        seen = self.all_calls
        rebuild = force or start != self.start or len(calls) < len(seen)
        if not rebuild:
            for i, old in enumerate(seen):
                if calls[i] is not old:
                    rebuild = True
                    break
        self.start = start
        query = self.filter_text
        new = calls if rebuild else calls[len(seen) :]
        self.all_calls = list(calls)
        if rebuild:
            row = self.cursor_row
            self.clear()
            self.calls = []
        for call in new:
            if not query or call_matches(call, query, call.call_id in self.subagent_ids):
                self.add_row(*self._row(call), key=call.call_id)
                self.calls.append(call)
        if rebuild and self.calls:
            self.move_cursor(row=min(row, len(self.calls) - 1), animate=False)
        self._subtitle()

    def _subtitle(self) -> None:
        total = len(self.all_calls)
        if self.filter_text:
            self.border_subtitle = f"{len(self.calls)}/{total} · filter {self.filter_text} (/ to change)"
        else:
            self.border_subtitle = str(total)
        if self.subagent_ids:
            self.border_subtitle += f" · {SUBAGENT_MARK}{len(self.subagent_ids)} by a subagent"

    def set_filter(self, query: str) -> None:
        """Show only the calls that match ``query`` (empty: all)."""
        self.filter_text = " ".join(query.split())
        self.sync(self.all_calls, self.start, force=True)

    def action_filter(self) -> None:
        self.post_message(self.FilterWanted())

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
