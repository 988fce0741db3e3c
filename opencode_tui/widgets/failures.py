"""Failure events with their classification and the policy's action, the failures a provider
recovered from (a "recovered" row: no class, never the outcome) and episode-health warnings (a
"health" row: a warning, never the outcome) and kernel kills or a full disk seen live (a "live" row,
at the time it happened); Enter opens the detail."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from opencode_tui.format import action_words, recovery_label
from opencode_tui.state import RunState
from opencode_tui.widgets.base import ShowsRunState
from opencode_tui_core.events import FailureRecorded, FailureRecovered, HealthWarning, SandboxFault

Problem = FailureRecorded | FailureRecovered | HealthWarning | SandboxFault

COLUMNS = ("kind", "stage", "class", "action", "evidence")


class FailuresTable(ShowsRunState, DataTable):
    BINDINGS = [
        Binding(
            "enter",
            "select_cursor",
            "Failure detail",
            tooltip="Message, cause chain, evidence",
            id="failures.open",
        )
    ]

    class Open(Message):
        def __init__(self, record: Problem) -> None:
            self.record = record
            super().__init__()

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.records: list[Problem] = []
        self.in_batch = False  # the run is a batch's attempt: a ``retry`` decision was carried out

    def on_mount(self) -> None:
        for name in COLUMNS:
            self.add_column(name, key=name)
        self.border_title = "Failures"
        self.border_subtitle = "0"

    def _row(self, rec: Problem) -> list[Text]:
        colors = self.app.theme_variables
        if isinstance(rec, HealthWarning):
            return [
                Text(rec.kind.value, style=colors.get("warning", "")),
                Text("agent"),
                Text("health", style="dim"),
                Text("warning", style=colors.get("warning", "")),
                Text(rec.message),
            ]
        if isinstance(rec, SandboxFault):  # seen live: what the close decides is a failure row of its own
            return [
                Text(rec.kind.value, style=f"bold {colors.get('error', '')}"),
                Text("agent"),
                Text("live", style="dim"),
                Text(f"seen {rec.ts:%H:%M:%S}", style=colors.get("error", "")),
                Text(rec.message),
            ]
        if isinstance(rec, FailureRecovered):
            f = rec.failure
            sources = ", ".join(dict.fromkeys(e.source for e in f.evidence)) or "none"
            return [
                Text(f.kind, style=colors.get("warning", "")),
                Text(str(f.stage)),
                Text("—", style="dim"),
                Text(f"recovered: {recovery_label(rec.recovery)}", style=colors.get("success", "")),
                Text(sources),
            ]
        f, d = rec.failure, rec.decision
        cls_style = {"model": colors.get("warning", ""), "evaluation": colors.get("error", "")}.get(
            str(d.failure_class), ""
        )
        # each source once, in order (a source often reports several observations, e.g. two OOM events)
        sources = ", ".join(dict.fromkeys(e.source for e in f.evidence)) or "none"
        return [
            Text(f.kind, style=f"bold {colors.get('error', '')}"),
            Text(str(f.stage)),
            Text(str(d.failure_class), style=cls_style),
            # a warning (an optional artifact lost) decides nothing once the verifier graded
            Text(f"warning ({d.action})", style=colors.get("warning", ""))
            if d.warning
            else Text(action_words(d.action, self.in_batch), style="bold"),
            Text(sources),
        ]

    def show_state(self, state: RunState) -> None:
        in_batch = bool(state.info and state.info.batch_id)
        force, self.in_batch = in_batch != self.in_batch, in_batch
        self.sync(state.problems, force=force)

    def sync(self, records: Sequence[Problem], force: bool = False) -> None:
        mine = self.records
        rebuild = force or len(records) < len(mine) or any(records[i] is not r for i, r in enumerate(mine))
        if rebuild:
            self.clear()
            mine = self.records = []
        for i, rec in enumerate(records[len(mine) :], start=len(mine)):
            self.add_row(*self._row(rec), key=str(i))
            mine.append(rec)
        self.border_subtitle = str(len(records))

    @property
    def selected(self) -> Problem | None:
        if not self.records or not 0 <= self.cursor_row < len(self.records):
            return None
        return self.records[self.cursor_row]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        rec = self.selected
        if rec is not None:
            self.post_message(self.Open(rec))
