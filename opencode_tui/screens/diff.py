"""Two runs side by side (``opencode-tui diff RUN_A RUN_B``, or ``d`` on two marked runs in the browser):
drift first, then the steps aligned with the first divergence highlighted, then the deltas.

The comparison itself is core/diff.py (pure); this screen only shows a ``RunDiff``. Given none, it
builds one in a worker thread (two long runs take seconds to read) and shows a loading indicator until
then: the screen appears at once, and the keys (escape, quit) work while it reads.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static, TextArea

from opencode_tui import format as fmt
from opencode_tui.plain_text import output_cells, side_by_side
from opencode_tui.screens.step import exit_words, step_command
from opencode_tui_core.diff import AlignedStep, Delta, RunDiff, Step, diff_runs

STEP_COLUMNS = ("#", "A", "A time", "B", "B time")


def _value(v: object) -> str:
    if v is None:
        return fmt.DASH
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def delta_words(d: Delta) -> str:
    """``a → b (+delta)`` for one delta row."""
    change = ""
    if d.delta is not None and d.delta != 0:
        change = f" ({d.delta:+.3g})" if isinstance(d.delta, float) else f" ({d.delta:+,})"
    return f"{_value(d.a)} → {_value(d.b)}{change}"


def step_cell(step: Step | None, width: int) -> Text:
    if step is None:
        return Text("—", style="dim")
    text = Text(step.label(), no_wrap=True)
    text.truncate(width, overflow="ellipsis")
    return text


def step_time(step: Step | None) -> Text:
    if step is None or step.duration_s is None:
        return Text("")
    return Text(f"{step.duration_s:.2f}s", justify="right")


class StepsTable(DataTable):
    BINDINGS = [
        Binding("f", "first_divergence", "First divergence", tooltip="Move to the first step that differs"),
        Binding("enter", "select_cursor", "Outputs", tooltip="Both runs' tool outputs at this step, in full"),
    ]

    def action_first_divergence(self) -> None:
        screen = self.screen
        if isinstance(screen, DiffScreen) and screen.diff and screen.diff.first_divergence is not None:
            self.move_cursor(row=screen.diff.first_divergence)


class DiffScreen(Screen[None]):
    BINDINGS = [Binding("escape", "back", "Back", tooltip="Back to the runs browser")]

    def __init__(self, run_a: Path, run_b: Path, diff: RunDiff | None = None) -> None:
        super().__init__()
        self.run_a = Path(run_a)
        self.run_b = Path(run_b)
        self.diff: RunDiff | None = diff  # None until the worker has built it
        self.error: str | None = None
        self.build_seconds: float | None = None

    @property
    def loaded(self) -> bool:
        """The diff is shown (or it could not be built: ``error`` says why)."""
        return self.diff is not None or self.error is not None

    def compose(self) -> ComposeResult:
        yield Static(id="diff-title")
        with Vertical(id="diff-body"):
            yield Static(id="diff-drift")
            yield StepsTable(id="diff-steps", cursor_type="row", zebra_stripes=True)
            yield Static(id="diff-step")
            yield Static(id="diff-deltas")
        yield Footer()

    @property
    def compact(self) -> bool:
        return self.app.size.width < 100 or self.app.size.height < 30

    def on_mount(self) -> None:
        self.set_class(self.compact, "-compact")
        if self.diff is not None:
            self._show()
            return
        width = max((self.app.size.width - 40) // 2, 12)
        self.query_one("#diff-title", Static).update(
            Content.from_markup(
                "[b]Diff[/]  reading A [b]$a[/] and B [b]$b[/]…",
                a=fmt.short(self.run_a.name, width),
                b=fmt.short(self.run_b.name, width),
            )
        )
        self.query_one("#diff-body").loading = True
        self._build()

    @work(thread=True, exclusive=True, group="diff-build")
    def _build(self) -> None:
        """Read both runs and align them off the UI thread, then show the result on it."""
        start = time.perf_counter()
        try:
            diff, error = diff_runs(self.run_a, self.run_b), None
        except (OSError, ValueError) as exc:
            diff, error = None, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
        # The app may have left this screen (escape) or ended meanwhile: nothing to show then.
        with contextlib.suppress(RuntimeError):
            self.app.call_from_thread(self._built, diff, error, seconds)

    def _built(self, diff: RunDiff | None, error: str | None, seconds: float) -> None:
        if not self.is_attached:
            return
        self.build_seconds = seconds
        self.query_one("#diff-body").loading = False
        if diff is None:
            self.error = error
            self.query_one("#diff-title", Static).update(
                Content.from_markup("[b]Diff[/]  cannot compare: $error", error=error or "?")
            )
            self.notify(f"Cannot compare: {error}", severity="error", timeout=8)
            return
        self.diff = diff
        self._show()

    def _show(self) -> None:
        d = self.diff
        assert d is not None
        # A and B share the width: each step cell gets half of what the number and time columns leave.
        self.cell_width = max((self.app.size.width - 4 - 2 * 8 - 8) // 2, 12)
        self.query_one("#diff-title", Static).update(
            Content.from_markup(
                "[b]Diff[/]  A [b]$a[/] ($na steps)  ·  B [b]$b[/] ($nb steps)",
                a=fmt.short(d.a.run_id, max((self.app.size.width - 36) // 2, 12)),
                b=fmt.short(d.b.run_id, max((self.app.size.width - 36) // 2, 12)),
                na=str(d.a.steps),
                nb=str(d.b.steps),
            )
        )
        self.query_one("#diff-drift", Static).update(self.drift_text())
        table = self.query_one(StepsTable)
        for name in STEP_COLUMNS:
            table.add_column(name, key=name)
        colors = self.app.theme_variables
        for i, row in enumerate(d.steps):
            table.add_row(*self._row(i, row, colors), key=str(i))
        table.border_title = "Steps"
        if d.lineage is not None:
            n = d.lineage.replayed_rows
            table.border_title = f"Steps (↺ replayed from A: {n})" if n else "Steps"
        if d.first_divergence is None:
            table.border_subtitle = "the same steps in both runs"
        else:
            table.border_subtitle = f"first divergence at step {d.first_divergence + 1}"
            table.move_cursor(row=d.first_divergence, animate=False)
        self.query_one("#diff-deltas", Static).update(self.deltas_text())
        table.focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The highlighted step in full below the table: each side's tool and arguments (or call)."""
        if self.diff is None or not 0 <= event.cursor_row < len(self.diff.steps):
            return
        row = self.diff.steps[event.cursor_row]
        width = max(self.app.size.width - 8, 20)

        def side(name: str, step: Step | None) -> str:
            if step is None:
                return f"{name}: (no step here)"
            if step.kind == "model_call":
                what = f"model call {step.call_id} {step.name} status {step.status}"
            else:
                what = f"{step.name} {json.dumps(step.args, sort_keys=True, default=str)}"
            return f"{name}: {fmt.short(what, width)}"

        verdict = "same" if row.same else "differs"
        lines = [f"step {event.cursor_row + 1} ({verdict})", side("A", row.a), side("B", row.b)]
        box = self.query_one("#diff-step", Static)
        if any(x is not None and x.kind == "tool_call" for x in (row.a, row.b)):
            # the two tool outputs side by side (Enter: both in full)
            half = max((self.app.size.width - 5) // 2, 12)
            limit = 1 if self.compact else 8
            a, b = output_cells(row.a, half, limit), output_cells(row.b, half, limit)
            lines += side_by_side(a, b, half)
            if not self.compact:  # (the footer says it too)
                lines.append("Enter: both outputs in full")
        box.styles.height = len(lines)
        box.update(Content("\n".join(lines)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a step: both sides' tool outputs in full, side by side."""
        event.stop()
        if self.diff is None or not 0 <= event.cursor_row < len(self.diff.steps):
            return
        self.app.push_screen(OutputsScreen(event.cursor_row, self.diff.steps[event.cursor_row]))

    def _row(self, i: int, row: AlignedStep, colors: dict[str, str]) -> list[Text]:
        assert self.diff is not None
        first = i == self.diff.first_divergence
        # ▶ the first divergence, ≠ any other step that differs (readable without colours too)
        sign = "▶" if first else ("" if row.same else "≠")
        # ↺ B's step was answered from A's record (B is A's rerun or fork)
        mark = Text(f"{sign}{'↺' if row.replayed else ''}{i + 1}", justify="right")
        w = self.cell_width
        cells = [mark, step_cell(row.a, w), step_time(row.a), step_cell(row.b, w), step_time(row.b)]
        if not row.same:
            style = f"bold {colors.get('error', '')}" if first else colors.get("warning", "")
            for c in (cells[0], cells[1], cells[3]):
                c.stylize(style)
        return cells

    def drift_text(self) -> Content:
        assert self.diff is not None
        lineage = self.diff.lineage_words()
        if lineage is not None:  # what B is of A comes first: it explains the drift and the steps
            return Content.from_markup(
                "[b]Lineage[/] $words\n$drift", words=lineage, drift=self._drift_text()
            )
        return self._drift_text()

    def _drift_text(self) -> Content:
        assert self.diff is not None
        if not self.diff.drift:
            return Content.from_markup("[b]Drift[/] none: same task, config and versions")
        shown = 3 if self.compact else 8
        half = max((self.app.size.width - 30) // 2, 12)
        lines = [f"Drift ({len(self.diff.drift)})"]
        for d in self.diff.drift[:shown]:
            lines.append(
                f"  {d.area} {d.key}: {fmt.short(_value(d.a), half)} → {fmt.short(_value(d.b), half)}"
            )
        if len(self.diff.drift) > shown:
            lines.append(f"  … {len(self.diff.drift) - shown} more (opencode-tui diff --json)")
        return Content("\n".join(lines))

    def deltas_text(self) -> Content:
        assert self.diff is not None
        changed = [d for d in self.diff.deltas if d.changed]
        if self.compact:  # per-phase durations only where there is room
            changed = [d for d in changed if not d.key.startswith("phase.")]
        if not changed:
            return Content.from_markup("[b]Deltas[/] none")
        return Content("Deltas  " + "  ·  ".join(f"{d.key} {delta_words(d)}" for d in changed))

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
        else:
            self.app.exit()


class OutputsScreen(ModalScreen[None]):
    """One aligned step of the diff: each run's tool call (command, exit status, whole output) side by side."""

    BINDINGS = [Binding("escape,q", "dismiss(None)", "Close", id="diff-outputs.close")]

    def __init__(self, index: int, row: AlignedStep) -> None:
        super().__init__(classes="modal")
        self.index = index
        self.row = row

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog detail") as dialog:
            verdict = "the same step" if self.row.same else "differs"
            dialog.border_title = f"Step {self.index + 1} · {verdict}"
            dialog.border_subtitle = "tab: the other side · esc close"
            with Horizontal(id="diff-outputs"):
                for name, step in (("A", self.row.a), ("B", self.row.b)):
                    with Vertical(classes="diff-output"):
                        yield Static(self._head(name, step), classes="diff-output-head")
                        yield TextArea(
                            self._body(step), read_only=True, soft_wrap=True, id=f"diff-output-{name.lower()}"
                        )

    @staticmethod
    def _head(name: str, step: Step | None) -> Content:
        if step is None:
            return Content.from_markup("[b]$n[/] no step here", n=name)
        if step.kind == "model_call":
            return Content.from_markup(
                "[b]$n[/] model call $id ($what)", n=name, id=step.call_id, what=step.label()
            )
        took = fmt.seconds(step.duration_s, 2)
        return Content.from_markup(
            "[b]$n[/] $tool · exit $exit · $took", n=name, tool=step.name, exit=exit_words(step), took=took
        )

    @staticmethod
    def _body(step: Step | None) -> str:
        if step is None or step.kind != "tool_call":
            return ""
        return f"{step_command(step)}\n\n{step.output or '(no output recorded)'}"

    def on_mount(self) -> None:
        for area in self.query(TextArea):
            area.cursor_blink = False
