"""The Ray executor prepares no sandbox ahead: when ``batch.warm`` asks for it, it says so and why
(the words the batch summary, its record and a warning carry); otherwise it says nothing. The real
batch on a Ray cluster: tests/opencode_tui/test_ray_batch.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from opencode_tui_core.batch import BatchSummary
from opencode_tui_core.config import AgentConfig, RaySettings
from opencode_tui_core.ray_executor import WARM_NOT_USED, RayExecutor
from opencode_tui_core.tasks import load_task

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def _said(config: dict, tmp_path: Path, jobs: int = 1) -> str | None:
    task = shutil.copytree(SAMPLES / "hello-file", tmp_path / "t", dirs_exist_ok=True)
    executor = RayExecutor(RaySettings())  # not connected: planning needs no cluster
    executor.plan([load_task(task)] * 3, AgentConfig.model_validate(config), jobs)
    return executor.warm_not_used


def test_batch_warm_on_ray_is_said_to_be_ignored(tmp_path):
    words = _said({"batch": {"warm": 2}}, tmp_path)
    assert words == f"batch.warm: 2 {WARM_NOT_USED}"
    line = BatchSummary(total=3, scored=3, warm_not_used=words).line()
    assert line == f"3 of 3 scored; warm-ahead not used: batch.warm: 2 {WARM_NOT_USED}"


def test_nothing_is_said_when_nothing_was_asked_or_nothing_could_be_prepared(tmp_path):
    assert _said({}, tmp_path) is None  # the default sizes a local pool only: not asked for here
    assert _said({"batch": {"warm": 0}}, tmp_path) is None
    borrowed = {"batch": {"warm": 2}, "sandbox": {"mode": "borrowed", "sandbox_id": "x"}}
    assert _said(borrowed, tmp_path) is None  # a borrowed sandbox is never prepared ahead anyway
    assert BatchSummary(total=1, scored=1).line() == "1 of 1 scored"
