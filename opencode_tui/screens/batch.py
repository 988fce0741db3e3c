"""The batch screen: every attempt of a running batch at a glance (``BatchBoard``), its totals, and its
failures grouped (kind × stage × evidence); Enter opens an attempt (live, or its replay), ``c`` /
Ctrl-C cancels the batch (every running episode closed, cleanup confirmed).

The attempts are a virtual list (``AttemptList``): a redraw (on a timer, and on each key) draws the
lines on screen from the board, so a 500-attempt batch stays responsive. Fewer columns below 200, 160,
140, 120 and 100 columns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.geometry import Size
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import DataTable, Footer, OptionList, Static
from textual.widgets.option_list import Option

from opencode_tui import format as fmt
from opencode_tui.batch_board import AttemptRow, BatchBoard
from opencode_tui_core.failure_groups import FailureGroup

REFRESH_S = 0.5  # how often running rows' elapsed time and the totals are redrawn


@dataclass(frozen=True)
class BatchColumn:
    key: str
    title: str
    width: int
    min_cols: int  # shown from this screen width up


# Widths chosen so the columns shown at each width fit it (cells one space apart, and
# room for the scroll bar): 71 at 80, 92 at 100, 109 at 120, 126 at 140, 145 at 160, 184 at 200; a
# remote batch's (columns_for): 74, 95, 112, 129, 149, 188.
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
    BatchColumn("run", "run", 38, 200),
)
# The one outcome longer than its column (the full word is in the replay and the JSON results).
SHORT_OUTCOMES = {"mark_evaluation_error": "mark_eval_error"}


# A remote batch's rows show their node instead of the provider (one for the whole batch), at every
# width: below 160 columns the task column narrows and the calls column makes room for it.
NODE_COLUMN = BatchColumn("node", "node", 12, 0)
NARROW_TASK = 12


def columns_for(width: int, remote: bool = False) -> list[BatchColumn]:
    shown = [c for c in COLUMNS if width >= c.min_cols]
    if not remote:
        return shown
    out: list[BatchColumn] = []
    for c in shown:
        if c.key == "provider" or (c.key == "calls" and width < 160):
            continue
        out.append(replace(c, width=NARROW_TASK) if c.key == "task" and width < 160 else c)
        if c.key == "task":
            out.append(NODE_COLUMN)
    return out


def cells(board: BatchBoard, row: AttemptRow, now: float, columns: list[BatchColumn]) -> list[str]:
    calls, tokens, compactions = board.row_counts(row)
    values = {
        "task": row.task_id,
        "attempt": f"{row.attempt}/{row.attempts}",
        "provider": row.provider or fmt.DASH,
        "node": row.node,
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
        head += f" · cancelled by {cancelling}" if board.ended else f" · CANCELLING ({cancelling})"
    counts = (
        f"scored {t['scored']}"
        + (f" ({t['zero']} as zero)" if t["zero"] else "")
        + f" · failed model {t['failed_model']} · failed infra {t['failed_infra']}"
        f" · running {t['running']} · queued {t['queued']}"
        + (f" · resumed {t['resumed']}" if t["resumed"] else "")
    )
    return f"{head}\n{counts}"


def groups_heading(board: BatchBoard) -> str:
    groups = board.groups()
    if not groups:
        return "no failures" + ("" if board.ended else " yet")
    failed = sum(g.count for g in groups)
    return f"failures in {failed} of {len(board.results)} (tab: the groups, enter: a group's runs):"


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


class AttemptList(ScrollView, can_focus=True):
    """The attempts as a virtual table: a header line that stays, then one line per attempt, drawn only
    when on screen and straight from the board (a line is its cells joined: no per-cell rendering), so a
    redraw costs the lines on screen, never the batch's size."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "cursor_to(0)", "First", show=False),
        Binding("end", "cursor_to(-1)", "Last", show=False),
        Binding("enter", "select", "Open", tooltip="Open the attempt: live, or its replay"),
    ]

    def __init__(self, board: BatchBoard, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.board = board
        self.cursor_row = 0
        self.columns: list[BatchColumn] = columns_for(80, board.remote)

    def reset(self, width: int) -> None:
        self.columns = columns_for(width, self.board.remote)
        total = sum(c.width + 1 for c in self.columns) + 1
        self.virtual_size = Size(total, len(self.board.rows) + 1)
        self.cursor_row = min(self.cursor_row, max(len(self.board.rows) - 1, 0))
        self.refresh()

    @property
    def row_count(self) -> int:
        return len(self.board.rows)

    @property
    def _rows_shown(self) -> int:
        return max(self.scrollable_content_region.height - 1, 1)

    def get_row_at(self, row: int) -> list[str]:
        return cells(self.board, self.board.rows[row], self.board.clock(), self.columns)

    def move_cursor(self, row: int) -> None:
        if not self.board.rows:
            return
        self.cursor_row = min(max(row, 0), len(self.board.rows) - 1)
        top, height = round(self.scroll_y), self._rows_shown
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + height:
            self.scroll_to(y=self.cursor_row - height + 1, animate=False)
        self.refresh()

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(self._rows_shown - 1, 1))

    def action_cursor_to(self, row: int) -> None:
        self.move_cursor(row if row >= 0 else len(self.board.rows) - 1)

    def action_select(self) -> None:
        if self.board.rows:
            self.post_message(AttemptOpened(self.board.rows[self.cursor_row]))

    def on_click(self, event: events.Click) -> None:
        row = round(self.scroll_y) + event.y - 1
        if 0 <= row < len(self.board.rows):
            self.focus()
            if row == self.cursor_row and event.chain == 2:
                self.action_select()
            self.move_cursor(row)

    def _line(self, values: list[str]) -> str:
        return " " + " ".join(v.ljust(c.width)[: c.width] for v, c in zip(values, self.columns, strict=True))

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            text, style = self._line([c.title for c in self.columns]), base + Style(bold=True, dim=True)
        else:
            i = round(self.scroll_y) + y - 1
            if i >= len(self.board.rows):
                return Strip.blank(width, base)
            text = self._line(cells(self.board, self.board.rows[i], self.board.clock(), self.columns))
            style = base
            if i == self.cursor_row:
                style = base + (Style(reverse=True) if self.has_focus else Style(bold=True, underline=True))
        x = round(self.scroll_x)
        return Strip([Segment(text[x : x + width].ljust(width), style)], width)


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
            "c", "cancel_batch", "Cancel batch", tooltip="Close every running episode", id="batch.cancel"
        ),
    ]

    def __init__(self, board: BatchBoard) -> None:
        super().__init__()
        self.board = board
        self.cancelling: str | None = None
        self._group_words: list[str] = []
        self._groups: list[FailureGroup] = []
        self._rows = -1  # the row count drawn (a retry adds one)

    def compose(self) -> ComposeResult:
        yield Static(id="batch-totals")
        yield AttemptList(self.board, id="batch-rows")
        yield Static(id="batch-groups-heading")
        yield OptionList(id="batch-groups")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw(full=True)
        self.table.focus()
        self.set_interval(REFRESH_S, self.redraw)

    def on_screen_resume(self) -> None:
        self.post_message(BatchScreenResumed())

    def on_resize(self) -> None:
        self.redraw(full=True)

    @property
    def table(self) -> AttemptList:
        return self.query_one("#batch-rows", AttemptList)

    def redraw(self, full: bool = False) -> None:
        board = self.board
        table = self.table
        if (
            full
            or len(board.rows) != self._rows
            or columns_for(self.app.size.width, board.remote) != table.columns
        ):
            self._rows = len(board.rows)
            table.reset(self.app.size.width)
        else:
            table.refresh()  # only the lines on screen are drawn again
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
        i = self.table.cursor_row
        return self.board.rows[i] if 0 <= i < len(self.board.rows) else None

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        group = self._groups[event.option_index]
        self.app.push_screen(GroupRunsScreen(group), self._open_run)

    def _open_run(self, run_id: str | None) -> None:
        if not run_id:
            return
        for i, row in enumerate(self.board.rows):
            if row.run_id == run_id:
                self.table.move_cursor(i)
                self.post_message(AttemptOpened(row))
                return

    def action_cancel_batch(self) -> None:
        self.post_message(BatchCancelWanted())
