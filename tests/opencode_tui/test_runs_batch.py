"""`opencode-tui runs --batch ID` (and --json): a recorded batch's failures grouped, with run ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BATCH = ROOT / "tests" / "fixtures" / "batch"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", "runs", "--runs-dir", str(BATCH), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _batch_id() -> str:
    return str(json.loads((BATCH / "results.jsonl").read_text().splitlines()[0])["batch_id"])


def test_runs_batch_json_groups_match_the_results() -> None:
    done = _cli("--batch", _batch_id(), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    results = [json.loads(line) for line in (BATCH / "results.jsonl").read_text().splitlines()]
    assert doc["total"] == len(results) == 5
    assert doc["scored"] == sum(1 for r in results if r["action"] in ("scored", "count_as_zero"))
    grouped = {(g["kind"], g["stage"], g["signature"]): g["run_ids"] for g in doc["groups"]}
    expected = {
        (r["failure_kind"], r["failure_stage"], r["failure_evidence"]): [r["run_id"]]
        for r in results
        if r["failure_kind"]
    }
    assert grouped == expected
    assert doc["failed"] == 1 and doc["with_failure"] == 3  # oom and timeout were scored as zero


def test_runs_batch_text_lists_each_group_and_its_runs() -> None:
    done = _cli("--batch", _batch_id())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"batch {_batch_id()}: 5 episodes, 4 scored, 1 failed; failures in 3, grouped:"
    assert "  1 provider_oom_killed at agent (cgroup.memory oom_kill=1)" in lines
    assert any(line.strip().startswith("oom  oom-") for line in lines)


def test_runs_batch_unknown_id_is_a_usage_error() -> None:
    done = _cli("--batch", "bnope")
    assert done.returncode == 2
    assert "no result of batch bnope" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.slow
@pytest.mark.bwrap
def test_batch_stderr_ends_with_the_groups_runs_batch_shows_the_same(tmp_path: Path) -> None:
    """A real --batch (model-flaky-500: every agent call answered 500, one attempt): its stderr's line
    before the summary (still the last) is the grouping, and `runs --batch ID --json` groups the same run the same way."""
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "opencode_tui.cli", "run", "model-flaky-500", "--batch"),
            *("--attempts", "1", "--provider", "local", "--runs-dir", str(runs)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    [result] = [json.loads(line) for line in done.stdout.splitlines()]
    *_, groups, last = done.stderr.splitlines()
    assert (
        groups == "opencode-tui: failures in 1 of 1: 1 model_server_error at agent (model.proxy status=500)"
    )
    assert last.startswith("opencode-tui: 0 of 1 scored; 1 failed: model_server_error x1")
    assert result["failure_evidence"] == "model.proxy status=500"
    shown = subprocess.run(
        [
            *(sys.executable, "-m", "opencode_tui.cli", "runs", "--runs-dir", str(runs)),
            *("--batch", result["batch_id"], "--json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    doc = json.loads(shown.stdout)
    assert [(g["kind"], g["signature"], g["run_ids"]) for g in doc["groups"]] == [
        ("model_server_error", "model.proxy status=500", [result["run_id"]])
    ]
