"""Run directories as the TUI lists and replays them (no Textual here). Every read goes through
``opencode_tui_core.artifacts.RunDirReader`` (events lazily, in batches, with an ``EventIndex`` to read any one back).

The app turns these into the same ``EventsReceived`` batches a live episode produces, so live and
replay share one event-handling path.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opencode_tui_core.artifacts import EventIndex, LoadStats, RunDirReader, RunInfo, list_runs
from opencode_tui_core.events import Event

__all__ = ["EventIndex", "LoadStats", "iter_event_batches", "run_rows", "run_summary"]


def iter_event_batches(
    path: Path,
    index: EventIndex | None = None,
    batch_size: int = 2000,
    stats: LoadStats | None = None,
    stop: threading.Event | None = None,
) -> Iterator[list[Event]]:
    """``RunDirReader.event_batches`` of the run directory holding ``path`` (its events.jsonl)."""
    return RunDirReader(path.parent, check=False).event_batches(index, batch_size, stats, stop)


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
        "interventions": len(info.interventions),  # the debugger's (issue 27)
        "health": info.counts.get("health") or {},  # episode-health warnings by kind
        "batch_id": info.batch_id,
        "sandbox_kept": info.sandbox_kept,
    }
