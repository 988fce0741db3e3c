"""The batch screen: every attempt of a running batch at a glance (``BatchBoard``), its totals, and its
failures grouped (kind × stage × evidence); Enter opens an attempt (live, or its replay), ``c`` /
Ctrl-C cancels the batch (every running episode closed, cleanup confirmed).

Redrawn on a timer from the board's versions: only changed rows (and the running rows' elapsed time)
are written, so a 500-attempt batch stays responsive. Fewer columns below 120 and 160 columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, OptionList, Static
from textual.widgets.option_list import Option

from core.failure_groups import FailureGroup
from opencode_tui import format as fmt
from opencode_tui.batch_board import AttemptRow, BatchBoard

REFRESH_S = 0.5  # how often running rows' elapsed time and the totals are redrawn


@dataclass(frozen=True)
class BatchColumn:
    key: str
    title: str
    width: int
    min_cols: int  # shown from this screen width up


# Widths chosen so the columns shown at each width fit it (a cell is padded by one on each side, and
# the scroll bar takes two): 74 at 80, 96 at 100, 115 at 120, 134 at 140, 156 at 160, 196 at 200.
COLUMNS: tuple[BatchColumn, ...] = (
    BatchColumn("task", "task", 16, 0),
    BatchColumn("attempt", "k/n", 4, 0),
    BatchColumn("provider", "provider", 8, 160),
    BatchColumn("phase", "phase", 12, 0),
    BatchColumn("elapsed", "elapsed", 7, 0),
    BatchColumn("budget", "budget", 7, 140),
    BatchColumn("calls", "calls", 5, 0),
    BatchColumn("tokens", "tokens", 8, 140),
    BatchColumn("compactions", "cmp", 3, 160),
    BatchColumn("health", "hlth", 4, 120),
    BatchColumn("outcome", "outcome", 15, 0),
    BatchColumn("reward", "rew", 4, 0),
    BatchColumn("failure", "failure", 20, 100),
    BatchColumn("cleanup", "cleanup", 11, 120),
    BatchColumn("human", "human", 5, 160),
    BatchColumn("run", "run", 32, 200),
)
# The one outcome longer than its column (the full word is in the replay and the JSON results).
SHORT_OUTCOMES = {"mark_evaluation_error": "mark_eval_error"}


def columns_for(width: int) -> list[BatchColumn]:
    return [c for c in COLUMNS if width >= c.min_cols]


def cells(board: BatchBoard, row: AttemptRow, now: float, columns: list[BatchColumn]) -> list[str]:
    calls, tokens, compactions = board.row_counts(row)
    values = {
        "task": row.task_id,
        "attempt": f"{row.attempt}/{row.attempts}",
        "provider": row.provider or fmt.DASH,
        "phase": row.phase,
        "elapsed": fmt.duration(row.elapsed(now)),
        "budget": fmt.duration(row.budget_s),
        "calls": str(calls) if row.started_at is not None or row.result is not None else "",
        "tokens": fmt.count(tokens) if row.started_at is not None or row.result is not None else "",
        "compactions": str(compactions) if compactions else "",
        "health": f"⚠{row.health}" if row.health else "",
        "outcome": SHORT_OUTCOMES.get(row.outcome, row.outcome),
        "reward": fmt.reward(row.reward) if row.outcome and row.outcome not in ("not started",) else "",
        "failure": row.failure_kind or "",
        "cleanup": row.cleanup,
        "human": "yes" if row.human_intervened else "",
        "run": row.run_id,
    }
    return [values[c.key] for c in columns]


def totals_line(board: BatchBoard, cancelling: str | None = None) -> str:
    """Two lines: the batch and its pace; the attempts by state (each under 80 columns)."""
    t = board.totals()
    rate = board.rate_per_min()
    pace = f"{rate:.1f}/min" if rate is not None else "–/min"
    pace += " · done" if board.ended else f" · ETA {fmt.duration(board.eta_s())}"
    head = f"BATCH {board.batch_id} · {t['tasks']} tasks · ≤{board.attempts} attempts · {pace}"
    if cancelling:
        head += f" · CANCELLING ({cancelling})"
    counts = (
        f"scored {t['scored']} · failed model {t['failed_model']} · failed infra {t['failed_infra']}"
        f" · running {t['running']} · queued {t['queued']}"
        + (f" · resumed {t['resumed']}" if t["resumed"] else "")
    )
    return f"{head}\n{counts}"


def groups_heading(board: BatchBoard) -> str:
    groups = board.groups()
    if not groups:
        return "no failures" + ("" if board.ended else " yet")
    failed = sum(g.count for g in groups)
    return f"{failed} of {len(board.results)} failed (tab: the groups, enter: a group's runs):"


def groups_text(board: BatchBoard) -> str:
    """The heading and one line per group (what the screen shows, as text)."""
    return "\n".join([groups_heading(board), *(f"  {g.words()}" for g in board.groups())])


class GroupRunsScreen(ModalScreen[str | None]):
    """One failure group's runs; Enter opens one (dismissed with its run id, "" for a task never run)."""

    BINDINGS = [Binding("escape,q", "dismiss", "Close", id="group.close")]

    def __init__(self, group: FailureGroup) -> None:
        super().__init__(classes="modal")
        self.group = group

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog detail") as dialog:
            dialog.border_title = self.group.words()
            dialog.border_subtitle = "enter opens the run · esc close"
            table: DataTable[str] = DataTable(id="group-runs", cursor_type="row")
            table.add_columns("task", "run")
            for task, run_id in zip(self.group.task_ids, self.group.run_ids, strict=True):
                table.add_row(task, run_id or "(not started)")
            yield table

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.dismiss(self.group.run_ids[event.cursor_row])


class AttemptOpened(Message):
    """Enter on a row: the app opens that attempt (live, or its replay)."""

    def __init__(self, row: AttemptRow) -> None:
        super().__init__()
        self.row = row


class BatchCancelWanted(Message):
    """``c`` on the batch screen: the app asks, then cancels the whole batch."""


class BatchScreenResumed(Message):
    """The batch screen is on top again (Esc from an opened attempt)."""


class BatchScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "enter", "open_row", "Open", tooltip="Open the attempt: live, or its replay", id="batch.open"
        ),
        Binding(
            "c", "cancel_batch", "Cancel batch", tooltip="Close every running episode", id="batch.cancel"
        ),
    ]

    def __init__(self, board: BatchBoard, clock_now: object = None) -> None:
        super().__init__()
        self.board = board
        self.cancelling: str | None = None
        self._drawn: dict[int, int] = {}  # id(row) → version drawn
        self._order: list[int] = []  # id(row) per table row, as drawn
        self._columns: list[BatchColumn] = []
        self._group_words: list[str] = []
        self._groups: list[FailureGroup] = []

    def compose(self) -> ComposeResult:
        yield Static(id="batch-totals")
        table: DataTable[str] = DataTable(id="batch-rows", cursor_type="row", zebra_stripes=False)
        yield table
        yield Static(id="batch-groups-heading")
        yield OptionList(id="batch-groups")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw(full=True)
        self.query_one(DataTable).focus()
        self.set_interval(REFRESH_S, self.redraw)

    def on_screen_resume(self) -> None:
        self.post_message(BatchScreenResumed())

    def on_resize(self) -> None:
        if columns_for(self.app.size.width) != self._columns:
            self.redraw(full=True)

    @property
    def table(self) -> DataTable[str]:
        return self.query_one("#batch-rows", DataTable)

    def redraw(self, full: bool = False) -> None:
        board = self.board
        now = board.clock()
        table = self.table
        columns = columns_for(self.app.size.width)
        order = [id(r) for r in board.rows]
        if full or columns != self._columns or order != self._order:
            cursor = table.cursor_row
            table.clear(columns=True)
            self._columns = columns
            for c in columns:
                table.add_column(c.title, width=c.width, key=c.key)
            for row in board.rows:
                table.add_row(*cells(board, row, now, columns), key=str(id(row)))
                self._drawn[id(row)] = row.version
            self._order = order
            if board.rows:
                table.move_cursor(row=min(cursor, len(board.rows) - 1))
        else:
            for row in board.rows:
                if self._drawn.get(id(row)) == row.version and not row.running:
                    continue
                self._drawn[id(row)] = row.version
                for c, value in zip(columns, cells(board, row, now, columns), strict=True):
                    table.update_cell(str(id(row)), c.key, value)
        self.query_one("#batch-totals", Static).update(totals_line(board, self.cancelling))
        self.query_one("#batch-groups-heading", Static).update(groups_heading(board))
        groups = board.groups()
        words = [g.words() for g in groups]
        if words != self._group_words:
            self._group_words = words
            self._groups = groups
            options = self.query_one("#batch-groups", OptionList)
            highlighted = options.highlighted
            options.set_options(Option(w) for w in words)
            if words and highlighted is not None:
                options.highlighted = min(highlighted, len(words) - 1)

    def selected(self) -> AttemptRow | None:
        table = self.table
        if not self.board.rows or table.cursor_row < 0:
            return None
        i = table.cursor_row
        return self.board.rows[i] if i < len(self.board.rows) else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open_row()

    def action_open_row(self) -> None:
        row = self.selected()
        if row is not None:
            self.post_message(AttemptOpened(row))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        group = self._groups[event.option_index]
        self.app.push_screen(GroupRunsScreen(group), self._open_run)

    def _open_run(self, run_id: str | None) -> None:
        if not run_id:
            return
        for i, row in enumerate(self.board.rows):
            if row.run_id == run_id:
                self.table.move_cursor(row=i)
                self.post_message(AttemptOpened(row))
                return

    def action_cancel_batch(self) -> None:
        self.post_message(BatchCancelWanted())
