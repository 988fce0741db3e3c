"""A batch's record in the runs directory (``batches.jsonl``): one line when the batch starts, one when
it ends, the same model both times (the later line of a batch id wins).

What it keeps is what the batch summary says once the process is gone: which executor and provider ran
it, how far its warm pool was asked to prepare ahead (or why it was not used), and at the end the
pool's counts. A batch killed with SIGKILL has its first line only; its controller's invocation label
tells it from a batch still running. ``opencode-tui doctor`` reads it (core/warm_report.py).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from opencode_tui_core.episode.pool import WarmCounts
from opencode_tui_core.invocation import Liveness, invocation_liveness

BATCHES_FILE = "batches.jsonl"


class BatchRecord(BaseModel):
    """One batch as ``batches.jsonl`` records it."""

    model_config = ConfigDict(extra="forbid")

    batch_id: str
    executor: str
    provider: str
    started_at: datetime
    controller: str  # the invocation label of the process that ran the batch (core/invocation.py)
    total: int  # tasks in the batch (resumed ones included)
    warm_depth: int = 0  # sandboxes the pool was to keep prepared ahead (0: no pool)
    warm_not_used: str | None = None  # why the configured warm-ahead was not used (the executor's words)
    # Set by the line written when the batch ends.
    ended_at: datetime | None = None
    scored: int | None = None
    cancelled_by: str | None = None
    warm: WarmCounts | None = None  # the pool's counts (None: no pool ran)

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    @property
    def running(self) -> bool:
        """Not ended, and its process is known to run (a batch killed with SIGKILL is not)."""
        return not self.ended and invocation_liveness(self.controller) is Liveness.ALIVE


def append_record(runs_dir: Path, record: BatchRecord) -> None:
    """One line for ``record`` (raises OSError: the caller decides whether that matters)."""
    with (runs_dir / BATCHES_FILE).open("a", encoding="utf-8") as f:
        f.write(record.model_dump_json() + "\n")


def recent_batches(runs_dir: Path, limit: int = 5) -> list[BatchRecord]:
    """The last ``limit`` batches recorded in ``runs_dir``, the latest first (each as its last line)."""
    try:
        text = (runs_dir / BATCHES_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    latest: dict[str, BatchRecord] = {}
    for line in text.splitlines():
        try:
            record = BatchRecord.model_validate(json.loads(line))
        except (ValueError, ValidationError):
            continue  # a torn last line (a batch killed mid-write) or another version's line
        latest[record.batch_id] = record
    ordered = sorted(latest.values(), key=lambda r: r.started_at, reverse=True)
    return ordered[:limit]
