"""The runs browser: every run directory under ``runs_dir`` with its outcome; Enter replays one."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from core.artifacts import RunInfo
from core.failures import Outcome
from opencode_tui import format as fmt
from opencode_tui.feeds import run_rows

COLUMNS = (
    "run",
    "task",
    "outcome",
    "reward",
    "failure kind",
    "cleanup",
    "human",
    "duration",
    "started (UTC)",
)


class RunsTable(DataTable):
    BINDINGS = [Binding("enter", "select_cursor", "Open run", tooltip="Replay the run in the run screen")]


class RunsScreen(Screen[None]):
    BINDINGS = [Binding("g", "reload", "Reload")]

    def __init__(self, runs_dir: Path) -> None:
        super().__init__()
        self.runs_dir = Path(runs_dir)
        self.rows: list[tuple[Path, RunInfo | None]] = []

    def compose(self) -> ComposeResult:
        yield Static(id="runs-title")
        yield RunsTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        self.action_reload()
        table.focus()

    def action_reload(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        self.rows = run_rows(self.runs_dir)
        colors = self.app.theme_variables
        for path, info in self.rows:
            if info is None:
                table.add_row(
                    Text(path.name),
                    Text("run.json unreadable", style="italic"),
                    *[Text("")] * (len(COLUMNS) - 2),
                )
                continue
            out = info.outcome
            action = out.action if out else ("interrupted" if info.orphaned else "running/unknown")
            style = colors.get("success", "") if action == Outcome.SCORED else colors.get("error", "")
            table.add_row(
                Text(path.name),
                Text(info.task_id, style="bold"),
                Text(action, style=style if out else "italic"),
                Text(fmt.DASH if not out or out.reward is None else f"{out.reward:g}", justify="right"),
                Text((out.failure_kind if out else None) or fmt.DASH),
                Text(fmt.duration(info.duration_s), justify="right"),
                Text(info.started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")),
                _cleanup_cell(info),
                Text("yes", style=colors.get("error", "")) if info.human_intervened else Text(""),
            )
        self.query_one("#runs-title", Static).update(
            Content.from_markup(
                "[b]Runs[/] in $dir · $n run(s) · [dim]enter opens a run (replay) · esc returns here[/]",
                dir=str(self.runs_dir),
                n=str(len(self.rows)),
            )
            if self.rows
            else Content.from_markup(
                "[b]No run directories[/] in $dir (run one with `opencode-tui run TASK`)",
                dir=str(self.runs_dir),
            )
        )

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self._open(event.cursor_row)

    def _open(self, row: int) -> None:
        if not 0 <= row < len(self.rows):
            return
        from opencode_tui.screens.run import RunScreen

        self.app.push_screen(RunScreen(run_dir=self.rows[row][0], from_browser=True))


def _cleanup_cell(info: RunInfo) -> Text:
    """✓ with the proof (receipt, destroyed, nothing launched), ✗ when unconfirmed, blank while unknown."""
    confirmed = info.counts.get("cleanup_confirmed")
    if confirmed is None:
        return Text(fmt.DASH)
    if not confirmed:
        return Text("✗ unconfirmed")
    proof = str(info.counts.get("cleanup_proof") or "receipt").replace("_", " ")
    return Text(f"✓ {proof}")
