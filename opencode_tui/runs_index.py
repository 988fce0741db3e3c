"""The runs browser's data (no Textual here): run directories listed without reading them, run.json read
only for the rows on screen (or, in a background thread, for all of them once a sort or filter needs a
field only run.json holds).

A run directory's name says its task and start time (``opencode_tui_core.artifacts.RUN_NAME``), so the default view
(newest first) and a task filter need no file read at all: listing 10,000 runs is one ``scandir``. Names that do not follow the pattern (copied
or hand-made run directories) are read at once: their start time comes from run.json.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from opencode_tui_core.artifacts import RunDirReader, RunFiles, RunInfo, run_dir_names

# Sort keys, in the order ``s`` cycles through them; which need run.json.
SORTS = ("date", "task", "outcome", "kind", "provider")
FIELDS = ("task", "outcome", "kind", "provider", "date")
NEEDS_INFO = frozenset({"outcome", "kind", "provider"})
_UNSET = object()


@dataclass
class RunEntry:
    root: Path  # the runs directory (shared: a Path per entry costs more than the whole scan)
    name: str
    task_hint: str | None = None
    stamp: str | None = None  # YYYYmmdd-HHMMSS from the name: sorts like the time it names
    _info: object = field(default=_UNSET, repr=False)

    @property
    def started_hint(self) -> datetime | None:
        return _stamp(self.stamp) if self.stamp else None

    @property
    def sort_stamp(self) -> str:
        """The start as ``YYYYmmdd-HHMMSS.ffffff`` (from the name, else run.json; "" when unknown)."""
        if self.stamp is not None:
            return self.stamp
        info = self.info()
        return info.started_at.astimezone(UTC).strftime("%Y%m%d-%H%M%S.%f") if info else ""

    @property
    def path(self) -> Path:
        return self.root / self.name

    @property
    def loaded(self) -> bool:
        return self._info is not _UNSET

    def info(self) -> RunInfo | None:
        """run.json, read once (None when missing or unreadable)."""
        if self._info is _UNSET:
            try:
                self._info = RunDirReader(self.path, check=False).info()
            except (OSError, ValueError):
                self._info = None
        return self._info  # type: ignore[return-value]

    @property
    def started(self) -> datetime | None:
        if self.started_hint is not None:
            return self.started_hint
        info = self.info()
        return info.started_at if info else None

    @property
    def task(self) -> str:
        if self.task_hint is not None:
            return self.task_hint
        info = self.info()
        return info.task_id if info else ""

    def value(self, name: str) -> str:
        """A field as text, for sorting and filtering (reads run.json for outcome, kind, provider)."""
        if name == "task":
            return self.task
        if name == "date":
            started = self.started
            return started.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if started else ""
        info = self.info()
        if info is None:
            return ""
        if name == "provider":
            return info.provider
        out = info.outcome
        if name == "outcome":
            if out is not None:
                return str(out.action)
            return "interrupted" if info.orphaned else "running/unknown"
        if name == "kind":
            return (out.failure_kind if out else None) or ""
        raise KeyError(name)


def lineage_mark(info: RunInfo | None, short: bool = False) -> str:
    """``↳ fork@2`` / ``↳ rerun`` (short: ``↳f@2`` / ``↳r``) for a run made from another's record
    (issue 28), else ""."""
    if info is None or info.lineage is None:
        return ""
    if short:
        return f"↳f@{info.fork_step}" if info.lineage == "fork" else "↳r"
    return f"↳ fork@{info.fork_step}" if info.lineage == "fork" else "↳ rerun"


def parent_dir(entry: RunEntry) -> Path | None:
    """The run directory a rerun or fork was made from: the same name beside it (a runs directory
    copied or moved keeps the family together), else as recorded; None for a run that is neither."""
    info = entry.info()
    if info is None or info.parent is None:
        return None
    recorded = Path(info.parent.run_dir)
    beside = entry.root / recorded.name
    return beside if beside.is_dir() else recorded


def families(entries: list[RunEntry], order: list[int]) -> tuple[list[int], list[str]]:
    """``order`` (indices into ``entries``, sorted and filtered) with each rerun or fork moved directly
    under the run it was made from, siblings in ``order``'s order, and each row's tree marks. Only
    entries whose run.json is already read can be placed (the others stay where ``order`` has them); a
    child whose parent is not in ``order`` (filtered out, gone) stays where it is, a root."""
    by_name = {entries[i].name: i for i in order}
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for i in order:
        e = entries[i]
        info = e.info() if e.loaded else None
        parent = by_name.get(Path(info.parent.run_dir).name) if info and info.parent else None
        if parent is None or parent == i:
            roots.append(i)
        else:
            children.setdefault(parent, []).append(i)
    if not children:
        return order, [""] * len(order)
    view: list[int] = []
    tree: list[str] = []
    seen: set[int] = set()

    def place(root: int) -> None:
        stack = [(root, "", "")]  # a stack, not recursion: a long chain of forks of forks is fine
        while stack:
            i, lead, mark = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            view.append(i)
            tree.append(lead + mark)
            kids = [k for k in children.get(i, ()) if k not in seen]
            below = lead + ("" if not mark else "│ " if mark == "├ " else "  ")
            for n in range(len(kids) - 1, -1, -1):
                stack.append((kids[n], below, "└ " if n == len(kids) - 1 else "├ "))

    for i in roots:
        place(i)
    for i in order:  # a loop of parents (a hand-edited run.json): shown flat, never lost
        if i not in seen:
            place(i)
    return view, tree


def _stamp(stamp: str) -> datetime | None:
    """``YYYYmmdd-HHMMSS`` (strptime is ten times slower, and this runs for every run directory)."""
    try:
        return datetime(
            int(stamp[0:4]), int(stamp[4:6]), int(stamp[6:8]),
            int(stamp[9:11]), int(stamp[11:13]), int(stamp[13:15]), tzinfo=UTC,
        )  # fmt: skip
    except ValueError:
        return None


def scan_runs(runs_dir: Path) -> list[RunEntry]:
    """Every run directory under ``runs_dir`` (``opencode_tui_core.artifacts.run_dir_names``), unread."""
    root = Path(runs_dir)
    return [
        RunEntry(root, name, task_hint=m["task"], stamp=m["stamp"]) if m is not None else RunEntry(root, name)
        for name, m in run_dir_names(root)
    ]


@dataclass
class Term:
    field: str | None  # None: any field
    text: str
    op: str = ":"  # ":" contains; for dates also >=, <=, >, < (compared as "YYYY-mm-dd HH:MM:SS" text)

    def matches(self, value: str) -> bool:
        if self.op == ":":
            return self.text in value.lower()
        if not value:
            return False
        # A date prefix compares with the same prefix of the run's start: date<2026-12 is before December.
        head = value[: len(self.text)]
        return {
            ">=": head >= self.text,
            "<=": head <= self.text,
            ">": head > self.text,
            "<": head < self.text,
        }[self.op]


_DATE_OP = re.compile(r"^date(>=|<=|>|<)(.+)$")


def parse_query(query: str) -> list[Term]:
    """``outcome:count task:oom local date>=2026-12-01`` → terms (``field:text``, a date comparison, or
    bare text matching any field)."""
    terms = []
    for word in query.split():
        m = _DATE_OP.match(word)
        if m is not None:
            terms.append(Term("date", m[2], m[1]))
            continue
        name, sep, text = word.partition(":")
        if sep and name in FIELDS:
            terms.append(Term(name, text.lower()))
        else:
            terms.append(Term(None, word.lower()))
    return terms


class RunsIndex:
    """All entries, and the view: the indices of the entries shown, filtered and sorted."""

    def __init__(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self.entries = scan_runs(self.runs_dir)
        self.sort_key = "date"
        self.reverse = True  # newest first
        self.query = ""
        self.view: list[int] = []
        self.tree: list[str] = []  # per view row: its family marks ("├ ", "│ └ "; "" for a root)
        self.families_scanned = False  # every child's run.json read (``scan_families``)
        self.apply()

    def fields_needed(self) -> set[str]:
        needed = {self.sort_key}
        for t in parse_query(self.query):
            needed |= set(FIELDS) if t.field is None else {t.field}
        return needed

    @property
    def needs_all_infos(self) -> bool:
        return bool(self.fields_needed() & NEEDS_INFO) and not all(e.loaded for e in self.entries)

    def apply(self) -> None:
        """Recompute the view (reads run.json for every entry when the sort or filter needs it: call
        ``load_all`` in a thread first to keep that off the UI thread)."""
        terms = parse_query(self.query)
        idx: list[int] | range = range(len(self.entries))
        if terms:
            idx = [i for i in idx if self._matches(self.entries[i], terms)]
        key = self.sort_key

        def sort_value(i: int) -> tuple:
            e = self.entries[i]
            if key == "date":
                # unreadable runs ("" stamp) last when newest first; ties by name
                return (e.sort_stamp, e.name)
            return (e.value(key), e.sort_stamp, e.name)

        self.view, self.tree = families(self.entries, sorted(idx, key=sort_value, reverse=self.reverse))

    @staticmethod
    def _matches(e: RunEntry, terms: list[Term]) -> bool:
        for t in terms:
            names = FIELDS if t.field is None else (t.field,)
            if not any(t.matches(e.value(n)) for n in names):
                return False
        return True

    def scan_families(self, stop: threading.Event | None = None) -> None:
        """Read the run.json of every rerun or fork, so ``apply`` places it under its parent: a run.json
        names a parent only when it is a child (``opencode_tui_core.artifacts.LINEAGE_FIELDS``), so the others are
        only looked at (about a quarter of validating each), never parsed."""
        for n, e in enumerate(self.entries):
            if stop is not None and stop.is_set():
                return
            if n % 256 == 255:
                time.sleep(0)  # the UI thread's turn (this runs beside it)
            if e.loaded:
                continue
            try:
                data = (e.path / RunFiles.RUN_INFO).read_bytes()
            except OSError:
                continue
            if b'"parent"' in data:
                e.info()
        self.families_scanned = True

    def load_all(
        self, stop: threading.Event | None = None, progress: Callable[[int], None] | None = None
    ) -> None:
        for n, e in enumerate(self.entries):
            if stop is not None and stop.is_set():
                return
            e.info()
            if progress is not None and n % 500 == 0:
                progress(n)

    def previous_attempt(self, entry: RunEntry) -> RunEntry | None:
        """The latest run of the same task that started before ``entry`` (whatever the filter shows):
        what a re-run or a retry is compared with."""
        task, stamp = entry.task, entry.sort_stamp
        earlier = [e for e in self.entries if e is not entry and e.task == task and e.sort_stamp < stamp]
        return max(earlier, key=lambda e: (e.sort_stamp, e.name), default=None)

    def row_of(self, entry: RunEntry) -> int | None:
        """The view row showing ``entry`` (None when filtered out)."""
        i = next((i for i, e in enumerate(self.entries) if e is entry), None)
        return self.view.index(i) if i is not None and i in self.view else None

    def entry(self, row: int) -> RunEntry | None:
        return self.entries[self.view[row]] if 0 <= row < len(self.view) else None

    def __len__(self) -> int:
        return len(self.view)
