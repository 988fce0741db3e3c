"""A batch's record in the runs directory (``batches.jsonl``): the later line of a batch wins, a torn or
foreign line is skipped, and a batch without its end line is running only while its process runs."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

from opencode_tui_core.batch_record import BATCHES_FILE, BatchRecord, append_record, recent_batches
from opencode_tui_core.episode.pool import WarmCounts
from opencode_tui_core.invocation import invocation_id

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _record(batch_id: str, minutes: int, controller: str | None = None) -> BatchRecord:
    return BatchRecord(
        batch_id=batch_id,
        executor="local",
        provider="local",
        started_at=T0 + timedelta(minutes=minutes),
        controller=controller or invocation_id(),
        total=3,
        warm_depth=2,
    )


def test_the_end_line_wins_latest_first_and_a_torn_or_foreign_line_is_skipped(tmp_path):
    first, second = _record("b1", 0), _record("b2", 5)
    append_record(tmp_path, first)
    append_record(tmp_path, second)
    counts = WarmCounts(depth=2, prepared=2, used=2)
    append_record(tmp_path, first.model_copy(update={"ended_at": T0 + timedelta(minutes=9), "warm": counts}))
    with (tmp_path / BATCHES_FILE).open("a") as f:
        f.write('{"batch_id": "b3", "executor": "local", "unknown_field": 1}\n')  # another version's
        f.write('{"batch_id": "b4", "execu')  # torn by a kill mid-write
    got = recent_batches(tmp_path)
    assert [r.batch_id for r in got] == ["b2", "b1"]
    assert got[1].ended and got[1].warm == counts and not got[0].ended
    assert recent_batches(tmp_path, limit=1) == [second]
    assert recent_batches(tmp_path / "missing") == []


def test_a_batch_without_its_end_line_runs_only_while_its_process_does(tmp_path):
    assert _record("b1", 0).running  # this process
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = _record("b2", 0, controller=invocation_id(int(gone.stdout)))
    assert not dead.running and not dead.ended
    ended = _record("b3", 0).model_copy(update={"ended_at": T0})
    assert not ended.running
