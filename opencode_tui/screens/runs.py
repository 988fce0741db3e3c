"""The runs browser: every run directory under ``runs_dir`` with its outcome; Enter replays one.

Sort (``s`` cycles the key, ``S`` reverses) and filter (``/``: ``outcome:count kind:oom task:fix
provider:local date:2026-12-01`` or bare words matching any field); ``space`` marks runs and ``d`` diffs
the two marked, ``D`` diffs the selected run with the previous attempt of its task; ``r`` re-runs the
selected run with its recorded task and configuration. A rerun or fork (issue 28) is listed directly
under the run it was made from, whatever the sort, with tree marks (``├ ↳ fork@2``); ``d`` on it with
nothing marked diffs it with its parent.

The list is virtual (``RunsList`` draws only the rows on screen) and lazy (``opencode_tui.runs_index``:
run.json is read for visible rows only, or for all of them in a thread when a sort or filter needs it),
so 10,000 run directories show at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Footer, Input, Static

from opencode_tui import format as fmt
from opencode_tui.runs_index import SORTS, RunEntry, RunsIndex, lineage_mark, parent_dir
from opencode_tui_core.artifacts import RunInfo
from opencode_tui_core.failures import Outcome


@dataclass(frozen=True)
class Column:
    """One column of the list: its full width, and its title and width when the list is narrow."""

    title: str
    width: int
    short: str
    narrow: int
    drop: int = 0  # when even the narrow widths do not fit: dropped in this order (1 first); 0 never


# Cells in this order (tests read them by position). The run column (0) takes what the others leave,
# between RUN_MIN and RUN_MAX. Below the full widths' total the droppable columns go first (batch,
# provider, duration, human: the outcome says it), then the narrow widths are used with every column
# (the cells say the same in fewer characters: ``✓`` for a confirmed cleanup, the start without the year
# and the seconds), and below those the droppable ones go again, so the list fits down to 80 columns and
# never scrolls sideways there. The start and the reward are never dropped: without them two attempts
# of a task look the same.
COLUMNS: tuple[Column, ...] = (
    Column("run", 0, "run", 0),
    Column("task", 14, "task", 10),
    Column("outcome", 17, "outcome", 13),
    Column("reward", 6, "rew", 4),
    Column("failure kind", 20, "failure", 10),
    Column("duration", 8, "dur", 6, drop=3),
    Column("started (UTC)", 19, "started", 11),
    Column("cleanup", 11, "cln", 3),
    Column("human", 5, "hum", 3, drop=4),
    Column("provider", 8, "prov", 6, drop=2),
    Column("health", 6, "⚠", 3),  # episode-health warnings (run.json's counts)
    Column("batch", 12, "batch", 6, drop=1),
    Column("kept", 4, "kept", 4),  # the sandbox was kept (attach, sweep)
)
RUN_MIN, RUN_MAX = 11, 44  # 11: "…4c24da-a1", the end of a run's name (its hash and attempt)
MARK_WIDTH = 2  # the mark and a space before the cells


@dataclass(frozen=True)
class ColumnLayout:
    shown: tuple[int, ...]  # indices into COLUMNS (and row_cells), in order
    widths: tuple[int, ...]  # one per shown column
    narrow: bool

    @property
    def total(self) -> int:
        return sum(self.widths) + len(self.widths) + MARK_WIDTH  # a space after each cell


def column_layout(width: int) -> ColumnLayout:
    """The columns that fit ``width``: full widths, else full widths minus the droppable columns (in
    their order), else narrow widths, else narrow minus dropped columns. A full cell says what a narrow
    one cuts (``provider_oom_killed``, not ``provider_…``), so the optional columns go first; the run
    column is never below RUN_MIN (at the smallest the list scrolls sideways)."""

    def fixed(shown: list[int], narrow: bool) -> int:
        return (
            sum((COLUMNS[i].narrow if narrow else COLUMNS[i].width) + 1 for i in shown[1:]) + 1 + MARK_WIDTH
        )

    ranks = sorted({c.drop for c in COLUMNS if c.drop})
    for narrow in (False, True):
        shown = list(range(len(COLUMNS)))
        for rank in [0, *ranks]:
            shown = [i for i in shown if COLUMNS[i].drop != rank] if rank else shown
            if width - fixed(shown, narrow) >= RUN_MIN:
                break
        if width - fixed(shown, narrow) >= RUN_MIN:
            break
    run = min(max(width - fixed(shown, narrow), RUN_MIN), RUN_MAX)
    widths = [run, *((COLUMNS[i].narrow if narrow else COLUMNS[i].width) for i in shown[1:])]
    return ColumnLayout(tuple(shown), tuple(widths), narrow)


MARK = "●"
# Up to this many run directories the browser looks for the reruns and forks among them before its first
# screen (``RunsIndex.scan_families``: ~0.02 ms a run), so each is drawn under its parent at once; above,
# in a thread once the first screen is up.
FAMILIES_AT_ONCE = 200
FAMILIES_AFTER_S = 0.5


def run_marks(tree: str, info: RunInfo | None, width: int) -> str:
    """What goes before a run's name in a ``width`` run column: its tree marks (``├ `` under its
    parent) and lineage (``↳ fork@2 ``), shorter (``↳f@2``, then ``├f@2`` without the arrow the tree
    already says) where the full ones would cut the name's end (its hash and attempt: RUN_MIN)."""
    full, short = lineage_mark(info), lineage_mark(info, True)
    tight = tree.replace(" ", "") + short.removeprefix("↳")
    for marks in (tree + full, tree + short, tight):
        marks = marks + " " if marks.strip() and not marks.endswith(" ") else marks
        if width - len(marks) >= RUN_MIN - 1:  # (the name's ellipsis counted in RUN_MIN)
            return marks
    return tight + " " if tight and not tight.endswith(" ") else tight


def row_cells(entry: RunEntry, colors: dict[str, str], narrow: bool = False) -> list[Text]:
    info = entry.info()
    if info is None:
        return [
            Text(entry.name),
            Text("run.json unreadable", style="italic"),
            *[Text("") for _ in COLUMNS[2:]],
        ]
    out = info.outcome
    action = out.action if out else ("interrupted" if info.orphaned else "running/unknown")
    style = colors.get("success", "") if action == Outcome.SCORED else colors.get("error", "")
    started = info.started_at.astimezone(UTC)
    return [
        Text(entry.name),
        Text(info.task_id, style="bold"),
        Text(str(action), style=style if out else "italic"),
        Text(fmt.DASH if not out or out.reward is None else f"{out.reward:g}", justify="right"),
        Text((out.failure_kind if out else None) or fmt.DASH),
        Text(fmt.duration(info.duration_s), justify="right"),
        Text(started.strftime("%m-%d %H:%M" if narrow else "%Y-%m-%d %H:%M:%S")),
        _cleanup_cell(info, narrow),
        Text("yes", style=colors.get("error", "")) if info.human_intervened else Text(""),
        Text(info.provider),
        _health_cell(info, colors),
        Text(info.batch_id or ""),
        Text("kept", style=colors.get("warning", "")) if info.sandbox_kept else Text(""),
    ]


class RunsList(ScrollView, can_focus=True):
    """A virtual table: a header line that stays, then one line per run, drawn only when on screen."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "cursor_to(0)", "First", show=False),
        Binding("end", "cursor_to(-1)", "Last", show=False),
        Binding("enter", "select", "Open run", tooltip="Replay the run in the run screen"),
        Binding("space", "mark", "Mark", tooltip="Mark the run (two marked runs: d shows their diff)"),
    ]

    class Selected(Message):
        def __init__(self, row: int) -> None:
            self.row = row
            super().__init__()

    def __init__(self, index: RunsIndex, **kwargs) -> None:
        super().__init__(**kwargs)
        self.index = index
        self.cursor_row = 0
        self.marked: list[Path] = []  # in marking order (A, then B)
        self.columns = column_layout(0)

    def reset(self) -> None:
        self.cursor_row = min(self.cursor_row, max(len(self.index) - 1, 0))
        self.columns = column_layout(self.scrollable_content_region.width or self.size.width)
        self.virtual_size = Size(self.columns.total, len(self.index) + 1)
        self.refresh()

    def on_mount(self) -> None:
        self.reset()

    def on_resize(self) -> None:
        self.reset()

    @property
    def _rows_shown(self) -> int:
        return max(self.scrollable_content_region.height - 1, 1)  # the header line is not a row

    @property
    def row_count(self) -> int:
        return len(self.index)

    def get_row_at(self, row: int) -> list[str]:
        """The row's cells as text (what the screen shows, for tests and copying)."""
        entry = self.index.entry(row)
        if entry is None:
            raise IndexError(row)
        return [c.plain for c in row_cells(entry, self.app.theme_variables)]

    def move_cursor(self, row: int, animate: bool = False) -> None:
        if not len(self.index):
            return
        self.cursor_row = min(max(row, 0), len(self.index) - 1)
        self.scroll_to_region_row(self.cursor_row, animate)
        self.refresh()

    def scroll_to_region_row(self, row: int, animate: bool) -> None:
        top = round(self.scroll_y)
        height = self._rows_shown
        if row < top:
            self.scroll_to(y=row, animate=animate)
        elif row >= top + height:
            self.scroll_to(y=row - height + 1, animate=animate)

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(self._rows_shown - 1, 1))

    def action_cursor_to(self, row: int) -> None:
        self.move_cursor(row if row >= 0 else len(self.index) - 1)

    def action_select(self) -> None:
        if len(self.index):
            self.post_message(self.Selected(self.cursor_row))

    def action_mark(self) -> None:
        entry = self.index.entry(self.cursor_row)
        if entry is None:
            return
        if entry.path in self.marked:
            self.marked.remove(entry.path)
        else:
            self.marked.append(entry.path)
            del self.marked[:-2]  # two at most: a third mark lets go of the oldest
        self.refresh()
        self.screen.refresh_title()  # type: ignore[attr-defined]

    def on_click(self, event) -> None:
        row = round(self.scroll_y) + event.y - 1
        if 0 <= row < len(self.index):
            self.focus()
            if row == self.cursor_row and event.chain == 2:
                self.action_select()
            self.move_cursor(row)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y == 0:
            return self._strip(self._header(), self.rich_style + Style(bold=True, dim=True), width)
        row = round(self.scroll_y) + y - 1
        entry = self.index.entry(row)
        if entry is None:
            return Strip.blank(width, self.rich_style)
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(MARK if entry.path in self.marked else " ", style="bold")
        line.append(" ")
        layout = self.columns
        cells = row_cells(entry, self.app.theme_variables, layout.narrow)
        for i, w in zip(layout.shown, layout.widths, strict=True):
            cell = cells[i]
            marks = run_marks(self.index.tree[row], entry.info(), w) if i == 0 else ""
            if marks:  # its place in the family and its lineage first (d diffs it with its parent)
                w -= len(marks)
                line.append(marks, style=self.app.theme_variables.get("accent", ""))
            if i == 0 and len(cell) > w:  # a run's name ends in what tells it apart: start, hash, attempt
                cell = Text("…" + cell.plain[len(cell) - w + 1 :], style=cell.style)
            cell.truncate(w, overflow="ellipsis", pad=True)
            line.append_text(cell)
            line.append(" ")
        base = self.rich_style
        if row == self.cursor_row:
            base = base + Style(reverse=True) if self.has_focus else base + Style(bold=True, underline=True)
        return self._strip(line, base, width)

    def _header(self) -> Text:
        layout = self.columns
        titles = [COLUMNS[i].short if layout.narrow else COLUMNS[i].title for i in layout.shown]
        return Text(
            " " * MARK_WIDTH + " ".join(t.ljust(w)[:w] for t, w in zip(titles, layout.widths, strict=True))
        )

    def _strip(self, line: Text, base: Style, width: int) -> Strip:
        strip = Strip(list(line.render(self.app.console))).apply_style(base)
        return strip.crop_extend(round(self.scroll_x), round(self.scroll_x) + width, base)


class RunsScreen(Screen[None]):
    BINDINGS = [
        Binding("g", "reload", "Reload"),
        Binding("s", "sort", "Sort", tooltip="Sort by the next key: " + ", ".join(SORTS)),
        Binding("S", "reverse", "Reverse", show=False),
        Binding("slash", "filter", "Filter", key_display="/", tooltip="Filter: outcome:X kind:X task:X …"),
        Binding(
            "d",
            "diff",
            "Diff",
            tooltip="Compare the two marked runs (space marks); on a rerun or fork (↳), with its parent",
        ),
        Binding(
            "D",
            "diff_previous",
            "Diff prev",
            tooltip="Compare the selected run with the previous attempt of the same task",
        ),
        Binding("r", "rerun", "Re-run", tooltip="Run the selected run's task again with its recorded config"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self, runs_dir: Path, rerun_of: tuple[Path, Path | None] | None = None) -> None:
        super().__init__()
        self.runs_dir = Path(runs_dir)
        # Back from a re-run: (the original, the new run or None if it never made one); both are marked,
        # the original first, so `d` compares them at once.
        self.rerun_of = rerun_of
        self.index = self._new_index()
        self._loading: str | None = None  # "reading run.json 500/10000" while a sort/filter waits
        self._stop = threading.Event()

    def _new_index(self) -> RunsIndex:
        """The runs, with the families placed at once when there are few (their run.json read now:
        a child is known by its run.json alone); more wait for ``_place_families``, in a thread."""
        index = RunsIndex(self.runs_dir)
        if len(index.entries) <= FAMILIES_AT_ONCE:
            index.scan_families()
            index.apply()
        return index

    def _place_families(self) -> None:
        if not self.index.families_scanned:
            self._scan_then_apply()

    @work(thread=True, exclusive=True, group="runs-families")
    def _scan_then_apply(self) -> None:
        index = self.index
        index.scan_families(self._stop)
        if not self._stop.is_set() and index is self.index:  # (not reloaded meanwhile)
            self.app.call_from_thread(self._reapply)

    @property
    def rows(self) -> list[tuple[Path, RunInfo | None]]:
        """The view as (path, info) (reads run.json for every row: for tests and small lists)."""
        return [(e.path, e.info()) for e in (self.index.entry(i) for i in range(len(self.index))) if e]

    def compose(self) -> ComposeResult:
        yield Static(id="runs-title")
        yield Input(
            placeholder="filter: outcome:X kind:X task:X provider:X date:X date>=X or words", id="runs-filter"
        )
        yield RunsList(self.index, id="runs")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#runs-filter").display = False
        if self.rerun_of is not None:
            self._mark_rerun(*self.rerun_of)
        self.refresh_title()
        self.query_one(RunsList).focus()
        if len(self.index.entries) > FAMILIES_AT_ONCE:  # after the first screen, which reads no run.json
            self.set_timer(FAMILIES_AFTER_S, self._place_families)

    def _mark_rerun(self, original: Path, new: Path | None) -> None:
        """Mark the original and its re-run (A, then B) and put the cursor on the re-run."""
        lst = self.query_one(RunsList)
        rows = {e.name: (row, e.path) for row in range(len(self.index)) if (e := self.index.entry(row))}
        lst.marked = [rows[p.name][1] for p in (original, new) if p is not None and p.name in rows]
        if new is not None and new.name in rows:
            lst.move_cursor(rows[new.name][0])
        # the title names the pair while both stay marked (as the list spells their paths)
        self.rerun_of = (lst.marked[0], lst.marked[1]) if len(lst.marked) == 2 else None

    def on_unmount(self) -> None:
        self._stop.set()

    def refresh_title(self) -> None:
        lst = self.query_one(RunsList)
        n, total = len(self.index), len(self.index.entries)
        if not total:
            self.query_one("#runs-title", Static).update(
                Content.from_markup(
                    "[b]No run directories[/] in $dir (run one with `opencode-tui run TASK`)",
                    dir=str(self.runs_dir),
                )
            )
            return
        shown = f"{n} of {total}" if self.index.query else str(total)
        order = f"{self.index.sort_key} {'↓' if self.index.reverse else '↑'}"
        extra = f" · filter “{self.index.query}”" if self.index.query else ""
        marks = f" · marked {len(lst.marked)}/2" if lst.marked else ""
        if self.rerun_of is not None and lst.marked == list(self.rerun_of):
            marks = " · marked: ● re-run, ● original (d diffs)"  # the cursor is on the re-run
        loading = f" · {self._loading}" if self._loading else ""
        self.query_one("#runs-title", Static).update(
            Content.from_markup(
                "[b]Runs[/] in $dir · $shown run(s) · by $order$extra$marks$loading · "
                "[dim]enter opens · space marks · d diffs · r re-runs[/]",
                dir=str(self.runs_dir),
                shown=shown,
                order=order,
                extra=extra,
                marks=marks,
                loading=loading,
            )
        )

    # -- sort and filter -------------------------------------------------------------------------

    def _reapply(self) -> None:
        if self.index.needs_all_infos:
            self._load_then_apply()
            return
        lst = self.query_one(RunsList)
        current = self.index.entry(lst.cursor_row)
        self.index.apply()
        self._loading = None
        lst.reset()
        row = self.index.row_of(current) if current is not None else None
        if row is not None and row != lst.cursor_row:  # the cursor stays on its run (a family moved it)
            lst.move_cursor(row)
        self.refresh_title()

    @work(thread=True, exclusive=True, group="runs-load")
    def _load_then_apply(self) -> None:
        total = len(self.index.entries)

        def progress(n: int) -> None:
            self.app.call_from_thread(self._set_loading, f"reading run.json {n}/{total}…")

        self.app.call_from_thread(self._set_loading, f"reading run.json 0/{total}…")
        self.index.load_all(self._stop, progress)
        if not self._stop.is_set():
            self.app.call_from_thread(self._reapply)

    def _set_loading(self, words: str) -> None:
        self._loading = words
        self.refresh_title()

    def action_sort(self) -> None:
        i = SORTS.index(self.index.sort_key)
        self.index.sort_key = SORTS[(i + 1) % len(SORTS)]
        self.index.reverse = self.index.sort_key == "date"  # newest first; the rest A→Z
        self._reapply()

    def action_reverse(self) -> None:
        self.index.reverse = not self.index.reverse
        self._reapply()

    def action_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        box.display = True
        box.value = self.index.query
        box.focus()

    @on(Input.Submitted, "#runs-filter")
    def on_filter(self, event: Input.Submitted) -> None:
        event.stop()
        self.set_filter(event.value)
        event.input.display = bool(event.value.strip())
        self.query_one(RunsList).focus()

    def set_filter(self, query: str) -> None:
        self.index.query = query.strip()
        self._reapply()

    def action_clear_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        box.value = ""
        box.display = False
        self.set_filter("")
        self.query_one(RunsList).focus()

    def action_reload(self) -> None:
        lst = self.query_one(RunsList)
        query, key, reverse = self.index.query, self.index.sort_key, self.index.reverse
        self.index = lst.index = self._new_index()
        self.index.query, self.index.sort_key, self.index.reverse = query, key, reverse
        self._reapply()
        if len(self.index.entries) > FAMILIES_AT_ONCE:
            self._place_families()

    # -- open, diff, re-run ----------------------------------------------------------------------

    @on(RunsList.Selected)
    def on_selected(self, event: RunsList.Selected) -> None:
        event.stop()
        self._open(event.row)

    def _open(self, row: int) -> None:
        entry = self.index.entry(row)
        if entry is None:
            return
        from opencode_tui.screens.replay import ReplayRunScreen

        self.app.push_screen(ReplayRunScreen(entry.path, from_browser=True))

    def action_diff(self) -> None:
        lst = self.query_one(RunsList)
        marked = lst.marked
        entry = self.index.entry(lst.cursor_row)
        if not marked and entry is not None and (parent := parent_dir(entry)) is not None:
            self._diff_with_parent(entry, parent)
            return
        if len(marked) != 2:
            self.notify(
                "Mark two runs with space first (A, then B), then press d; "
                "on a rerun or fork (↳) with nothing marked, d diffs it with its parent.",
                timeout=4,
            )
            return
        from opencode_tui.screens.diff import DiffScreen

        # The diff screen reads both runs in a worker thread, with a loading indicator meanwhile.
        run_a, run_b = marked
        self.app.push_screen(DiffScreen(run_a, run_b))

    def _diff_with_parent(self, entry: RunEntry, parent: Path) -> None:
        """A rerun or fork against the run it was made from (A: the parent), aligned at the fork."""
        if not parent.is_dir():
            self.notify(
                f"{entry.name} was made from {parent.name}, which is not in {self.runs_dir} any more; "
                "mark two runs with space to compare others.",
                severity="error",
                timeout=6,
            )
            return
        from opencode_tui.screens.diff import DiffScreen

        self.app.push_screen(DiffScreen(parent, entry.path))

    def action_diff_previous(self) -> None:
        """The selected run against the latest earlier run of its task (A: the earlier one)."""
        entry = self.index.entry(self.query_one(RunsList).cursor_row)
        if entry is None:
            return
        previous = self.index.previous_attempt(entry)
        if previous is None:
            self.notify(f"No earlier run of {entry.task or 'this task'} in {self.runs_dir}.", timeout=4)
            return
        from opencode_tui.screens.diff import DiffScreen

        self.app.push_screen(DiffScreen(previous.path, entry.path))

    def action_rerun(self) -> None:
        entry = self.index.entry(self.query_one(RunsList).cursor_row)
        if entry is None:
            return
        from opencode_tui_core.admission import RerunError, rerun_inputs

        try:
            rerun_inputs(entry.info(), entry.path)
        except RerunError as exc:
            self.notify(str(exc), severity="error", timeout=6)
            return
        if self.app.served:  # type: ignore[attr-defined]
            # A browser session is this one app: the run is pushed in it, and comes back here.
            self.app.run_here(entry.path)  # type: ignore[attr-defined]
            return
        # The run starts after the browser has closed: the app ends with the request and the command
        # that started the browser runs it in the live TUI (one episode per app, like `run`).
        self.app.rerun_request = entry.path  # type: ignore[attr-defined]
        self.app.exit()

    def show_rerun(self, original: Path, new: Path | None) -> None:
        """Back from a re-run run in this app: the list read again, the original and the re-run marked."""
        self.rerun_of = (original, new)
        lst = self.query_one(RunsList)
        query, key, reverse = self.index.query, self.index.sort_key, self.index.reverse
        self.index = lst.index = RunsIndex(self.runs_dir)
        self.index.query, self.index.sort_key, self.index.reverse = query, key, reverse
        if self.index.needs_all_infos:
            self._load_then_apply()  # marks are not kept over a full read; the notice names the run
        else:
            self.index.apply()
            lst.reset()
            self._mark_rerun(original, new)
        self.refresh_title()


def _health_cell(info: RunInfo, colors: dict[str, str]) -> Text:
    """The episode-health warnings run.json counted (``⚠3``), empty when there were none."""
    health = info.counts.get("health")
    n = sum(v for v in health.values() if isinstance(v, int)) if isinstance(health, dict) else 0
    return Text(f"⚠{n}", style=colors.get("warning", "")) if n else Text("")


def _cleanup_cell(info: RunInfo, narrow: bool = False) -> Text:
    """✓ with the proof (receipt, destroyed, nothing launched), ✗ when unconfirmed, a dash while unknown;
    narrow: the sign alone."""
    confirmed = info.counts.get("cleanup_confirmed")
    if confirmed is None:
        return Text(fmt.DASH)
    if not confirmed:
        return Text("✗" if narrow else "✗ unconfirmed")
    if narrow:
        return Text("✓")
    proof = str(info.counts.get("cleanup_proof") or "receipt").replace("_", " ")
    return Text(f"✓ {proof}")
