"""Batch resume: a re-run skips scored episodes and re-runs the others as new attempts, keeping every
earlier attempt's run directory (real episodes, local provider, the real OpenCode binary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.resume import RESULTS_FILE
from opencode_tui_core.tasks import load_task

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


@pytest.mark.slow
@pytest.mark.bwrap
async def test_rerun_skips_scored_and_retries_the_rest(tmp_path):
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}, "policy": {"max_attempts": 1}})
    tasks = [load_task(SAMPLES / "hello-file"), load_task(SAMPLES / "model-flaky-500")]
    runs = tmp_path / "runs"

    first = await run_batch(tasks, config, runs_dir=runs, jobs=2)
    by_task = {r.task_id: r for r in first.results}
    assert by_task["hello-file"].action == "scored"
    assert by_task["model-flaky-500"].action == "mark_evaluation_error"
    # model-flaky-500 answers 500 four times in a row: a retry storm (a health warning, not a failure).
    assert first.line() == "1 of 2 scored; 1 failed: model_server_error x1; health warnings: retry_storm x1"

    second = await run_batch(tasks, config, runs_dir=runs, jobs=2)
    again = {r.task_id: r for r in second.results}
    assert again["hello-file"].resumed and again["hello-file"].run_dir == by_task["hello-file"].run_dir
    retried = again["model-flaky-500"]
    assert not retried.resumed and retried.attempt == 2
    assert retried.previous_attempts == [by_task["model-flaky-500"].run_dir]
    assert Path(by_task["model-flaky-500"].run_dir, RunFiles.EVENTS).exists()  # failed attempt kept
    lines = [json.loads(line) for line in (runs / RESULTS_FILE).read_text().splitlines()]
    assert [(line["task_id"], line["attempt"]) for line in lines].count(("model-flaky-500", 2)) == 1
    assert sum(1 for line in lines if line["task_id"] == "hello-file") == 1


@pytest.mark.slow
@pytest.mark.docker
async def test_a_limit_that_cannot_be_enforced_is_said_or_refused(tmp_path):
    """Docker's disk limit on overlay2 over extfs (this machine's engine) cannot be enforced: with
    ``limits.enforce: warn`` the episode runs and the batch line, the result and run.json say so; with
    ``strict`` it is refused before anything is staged (outcome refused, exit 2, the sandbox removed)."""
    import subprocess

    from opencode_tui_core.artifacts import RunDirReader
    from tests.core.conftest import require_docker_image

    require_docker_image()
    tasks = [load_task(SAMPLES / "hello-file")]
    warn = AgentConfig.model_validate(
        {"sandbox": {"provider": "docker"}, "limits": {"disk": "1g"}, "policy": {"max_attempts": 1}}
    )
    summary = await run_batch(tasks, warn, runs_dir=tmp_path / "warn", jobs=1)
    [result] = summary.results
    if not result.unenforced_limits:
        pytest.skip("this Docker engine enforces the disk limit (overlay2 on xfs with pquota, btrfs, ...)")
    assert (result.action, result.reward, result.unenforced_limits) == ("scored", 1.0, ["disk"])
    assert summary.line() == "1 of 1 scored; limits not enforced: disk x1"
    assert RunDirReader(Path(result.run_dir)).info().counts["unenforced_limits"] == ["disk"]

    strict = warn.model_copy(update={"limits": warn.limits.model_copy(update={"enforce": "strict"})})
    summary = await run_batch(tasks, strict, runs_dir=tmp_path / "strict", jobs=1)
    [refused] = summary.results
    assert (refused.action, refused.exit_code, refused.reward) == ("refused", 2, None)
    assert "disk limit asked for cannot be enforced" in refused.summary and "strict" in refused.summary
    events = list(RunDirReader(Path(refused.run_dir)).events())
    assert not [e for e in events if e.type == "phase" and e.phase in ("install", "agent")]
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"id={refused.sandbox_id}"], capture_output=True, text=True
    )
    assert left.stdout.split() == []


def test_the_batch_line_says_failures_kept_as_warnings():
    from opencode_tui_core.batch import BatchSummary

    line = BatchSummary(total=2, scored=2, warnings_by_kind={"transcript_export_failed": 1}).line()
    assert line == "2 of 2 scored; warnings (reward kept): transcript_export_failed x1"
