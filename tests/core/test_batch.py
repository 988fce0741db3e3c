"""Batch resume: a re-run skips scored episodes and re-runs the others as new attempts, keeping every
earlier attempt's run directory (real episodes, local provider, the real OpenCode binary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.artifacts import RunFiles
from core.batch import RESULTS_FILE, run_batch
from core.config import AgentConfig
from core.tasks import load_task

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
