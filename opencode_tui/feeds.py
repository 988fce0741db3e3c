"""Reading a run directory for replay (no Textual here): events lazily, with an index to read any
one back. Everything else a run directory holds is read through ``core.artifacts.RunDirReader``.

The app turns these into the same ``EventsReceived`` batches a live episode produces, so live and
replay share one event-handling path.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core.artifacts import RunInfo, list_runs
from core.events import Event, decode


class EventIndex:
    """Byte offsets of the events in ``events.jsonl``: any event can be read back on demand.

    Filled by the loader thread while it streams the file; read from the UI thread (appends to an
    ``array`` are atomic under the GIL, and readers only look at indices below ``len``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets = array("q")
        self._cache: OrderedDict[int, Event] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.offsets)

    def event_at(self, index: int) -> Event | None:
        if not 0 <= index < len(self.offsets):
            return None
        with self._lock:
            cached = self._cache.get(index)
            if cached is not None:
                self._cache.move_to_end(index)
                return cached
            with self.path.open("rb") as f:
                f.seek(self.offsets[index])
                line = f.readline()
            try:
                event = decode(line)
            except ValidationError:
                return None
            self._cache[index] = event
            if len(self._cache) > 256:
                self._cache.popitem(last=False)
            return event


@dataclass
class LoadStats:
    events: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)


def iter_event_batches(
    path: Path,
    index: EventIndex | None = None,
    batch_size: int = 2000,
    stats: LoadStats | None = None,
    stop: threading.Event | None = None,
) -> Iterator[list[Event]]:
    """Decode ``events.jsonl`` in batches. Lines that do not decode are counted and skipped (a run
    directory written by a newer engine, or a truncated last line of a live run, must still open)."""
    stats = stats if stats is not None else LoadStats()
    if not path.exists():
        return
    batch: list[Event] = []
    offset = 0
    with path.open("rb") as f:
        for line in f:
            start = offset
            offset += len(line)
            if stop is not None and stop.is_set():
                return
            if not line.strip():
                continue
            try:
                event = decode(line)
            except (ValidationError, ValueError) as exc:
                stats.bad_lines += 1
                if len(stats.bad_examples) < 3:
                    stats.bad_examples.append(f"byte {start}: {str(exc).splitlines()[0][:200]}")
                continue
            if index is not None:
                index.offsets.append(start)
            stats.events += 1
            batch.append(event)
            if len(batch) >= batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def run_rows(runs_dir: Path) -> list[tuple[Path, RunInfo | None]]:
    """``list_runs``, newest start first (run.json's ``started_at``; unreadable ones last)."""
    runs = list_runs(runs_dir)
    return sorted(
        runs,
        key=lambda item: (
            item[1] is not None,
            item[1].started_at.timestamp() if item[1] else 0.0,
            item[0].name,
        ),
        reverse=True,
    )


def run_summary(path: Path, info: RunInfo | None) -> dict[str, Any]:
    """One run as plain data (``opencode-tui runs --json`` prints these)."""
    if info is None:
        return {"run_dir": str(path), "run_id": path.name, "readable": False}
    out = info.outcome
    return {
        "run_dir": str(path),
        "run_id": info.run_id,
        "task_id": info.task_id,
        "provider": info.provider,
        "attempt": info.attempt,
        "outcome": out.action if out else None,
        "reward": out.reward if out else None,
        "failure_kind": out.failure_kind if out else None,
        "failure_stage": out.failure_stage if out else None,
        "failure_class": out.failure_class if out else None,
        "duration_s": info.duration_s,
        "started_at": info.started_at.isoformat(),
        "ended_at": info.ended_at.isoformat() if info.ended_at else None,
        "cleanup_confirmed": info.counts.get("cleanup_confirmed"),
        "human_intervened": info.human_intervened,
        "health": info.counts.get("health") or {},  # episode-health warnings by kind
    }
