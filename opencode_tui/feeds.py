"""Reading a run directory for replay (no Textual here): events lazily, the terminal recording, and
model-call bodies by call id.

The app turns these into the same ``EventsReceived`` batches a live episode produces, so live and
replay share one event-handling path.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
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


@dataclass
class Cast:
    """An asciinema v2 recording: header and output frames ``(seconds, text)`` (input frames dropped)."""

    header: dict[str, Any]
    frames: list[tuple[float, str]]

    @property
    def duration(self) -> float:
        return self.frames[-1][0] if self.frames else 0.0

    @property
    def start_epoch(self) -> float | None:
        ts = self.header.get("timestamp")
        return float(ts) if isinstance(ts, int | float) else None

    def origin(self, run_started: datetime | None = None) -> float | None:
        """Epoch seconds of the recording's time 0.

        asciinema's header ``timestamp`` is whole seconds, up to a second before the true start: mapping
        frames to events with it alone puts the timeline up to a second early. The engine starts the
        recording together with the run, so run.json's ``started_at``, when it falls in that same second,
        supplies the fraction."""
        start = self.start_epoch
        if start is None or run_started is None:
            return start
        precise = run_started.timestamp()
        return precise if start <= precise < start + 1 else start


def read_cast(path: Path) -> Cast | None:
    if not path.exists():
        return None
    header: dict[str, Any] = {}
    frames: list[tuple[float, str]] = []
    with path.open(encoding="utf-8", errors="replace") as f:
        first = f.readline()
        try:
            loaded = json.loads(first)
            header = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            header = {}
        for line in f:
            try:
                t, kind, text = json.loads(line)
            except (ValueError, TypeError):
                continue  # a torn last line of a live recording
            if kind == "o" and isinstance(text, str):
                frames.append((float(t), text))
    return Cast(header, frames)


def find_model_call(run_dir: Path | None, call_id: str) -> dict[str, Any] | None:
    """The record for ``call_id`` in ``model_calls.jsonl`` (the last one if repeated), or None."""
    if run_dir is None:
        return None
    path = Path(run_dir) / "model_calls.jsonl"
    if not path.exists():
        return None
    needle = call_id.encode()
    found: dict[str, Any] | None = None
    with path.open("rb") as f:
        for line in f:
            if needle not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and str(record.get("call_id")) == call_id:
                found = record
    return found


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
