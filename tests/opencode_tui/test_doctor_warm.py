"""``opencode-tui doctor`` on the warm pool (issue 31): a real batch's counts from its record in the runs
directory, and the prepared sandboxes a SIGKILLed batch left, with the command that removes them. Real
local (bubblewrap) sandboxes, the real OpenCode binary, the embedded scripted model, the real CLI."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.batch_record import BATCHES_FILE, BatchRecord, recent_batches
from tests.opencode_tui.test_warm_batch import _pooled, _start, _wait_for_pool

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
CLI = [sys.executable, "-m", "opencode_tui.cli"]

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]


def _doctor(runs: Path) -> tuple[list[dict], str]:
    """doctor --json's warm lines (by name, in order) and its text output for the same runs dir."""
    out = {}
    for mode in ("--json", None):
        r = subprocess.run(
            [*CLI, "doctor", "--runs-dir", str(runs), *([mode] if mode else [])],
            capture_output=True,
            text=True,
            timeout=180,
            env=os.environ,
        )
        assert r.returncode in (0, 3), r.stderr  # 3: a provider this host lacks is a failed check
        out[mode] = r.stdout
    lines = [json.loads(line) for line in out["--json"].splitlines()]
    return [c for c in lines if c["name"] in ("warm pool", "warm leftovers")], out[None]


def _records(runs: Path) -> list[BatchRecord]:
    return [BatchRecord.model_validate_json(line) for line in (runs / BATCHES_FILE).read_text().splitlines()]


def test_doctor_reports_the_counts_of_a_real_warm_batch(tmp_path, test_owner):
    tasks = []
    for i in range(3):
        d = tmp_path / "tasks" / f"hello-{i}"
        shutil.copytree(SAMPLES / "hello-file", d)
        text = (d / "task.yaml").read_text()
        (d / "task.yaml").write_text(text.replace("id: hello-file", f"id: hello-{i}"))
        tasks.append(str(d))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"batch": {"warm": 2}, "policy": {"max_attempts": 1}}))
    runs = tmp_path / "runs"
    args = ["--batch", "--provider", "local", "--runs-dir", str(runs), "--config", str(config)]
    r = subprocess.run(
        [*CLI, "run", *tasks, *args],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, r.stderr
    summary = r.stderr.strip().splitlines()[-1]
    assert summary.endswith("3 of 3 scored; warm sandboxes: 2 prepared, 2 used, 0 discarded"), summary

    start, end = _records(runs)  # one line as the episodes start, one at the end
    assert start.batch_id == end.batch_id and start.ended_at is None and start.warm is None
    assert (start.executor, start.provider, start.total, start.warm_depth) == ("local", "local", 3, 2)
    assert end.ended and end.scored == 3 and end.warm is not None
    assert (end.warm.prepared, end.warm.used, end.warm.discarded, end.warm.failed) == (2, 2, 0, 0)

    (batch, left), text = _doctor(runs)
    assert batch["name"] == "warm pool" and batch["status"] == "ok", batch
    assert batch["batch"]["batch_id"] == end.batch_id and batch["batch"]["warm"] == end.warm.model_dump()
    assert "warm sandboxes: 2 prepared, 2 used, 0 discarded" in batch["detail"]
    assert left["status"] == "ok" and left["sandboxes"] == [] and left["remove"] is None, left
    assert f"✓ warm pool            batch {end.batch_id}" in text
    assert "2 prepared, 2 used, 0 discarded" in text


def test_doctor_names_what_a_sigkilled_batch_left_and_its_command_removes_it(tmp_path, test_owner):
    """While the batch runs, its prepared sandboxes are its own (not leftovers); after kill -9 doctor
    says the batch ended without its record, lists them as left over, and the command it gives
    removes them (and whatever else that batch left)."""
    runs = tmp_path / "runs"
    proc = _start("local", tmp_path)  # four busy tasks at --jobs 1, batch.warm: 2
    try:
        _wait_for_pool(proc, "local", test_owner, 2)
        [record] = recent_batches(runs)
        assert record.running and record.warm_depth == 2
        (batch, left), _ = _doctor(runs)
        assert batch["status"] == "ok" and "running (pid" in batch["detail"], batch
        assert left["status"] == "ok" and left["remove"] is None, left
        assert sorted(s["liveness"] for s in left["sandboxes"]) == ["alive", "alive"]
        assert f"2 held by running batch {record.batch_id}" in left["detail"]
    finally:
        proc.kill()
        proc.wait(30)
    prepared = sorted(_pooled("local", test_owner))
    assert len(prepared) == 2, "kill -9 should have left the prepared sandboxes"

    (batch, left), text = _doctor(runs)
    assert batch["status"] == "warn" and "ended without its end record" in batch["detail"], batch
    assert batch["used_by_results"] == 0  # the first task was still running: no result line yet
    assert left["status"] == "warn", left
    assert sorted(s["sandbox_id"] for s in left["sandboxes"]) == prepared
    assert {(s["liveness"], s["batch_id"]) for s in left["sandboxes"]} == {("gone", record.batch_id)}
    assert left["remove"] == f"opencode-tui sweep --batch {record.batch_id}"
    assert f"remove them with: opencode-tui sweep --batch {record.batch_id}" in text

    argv = shlex.split(left["remove"])
    assert argv[0] == "opencode-tui"
    r = subprocess.run([*CLI, *argv[1:]], capture_output=True, text=True, timeout=120, env=os.environ)
    assert r.returncode == 0, r.stderr
    assert _pooled("local", test_owner) == []
    (_, left), _ = _doctor(runs)
    assert left["status"] == "ok" and left["sandboxes"] == [], left
