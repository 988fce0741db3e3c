"""Sample tasks copied into the test's directory (optionally with another trajectory or task fields), and
episodes on them with the local provider unless told otherwise."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.tasks import load_task

SAMPLES = Path(__file__).resolve().parents[3] / "sample_tasks"


@pytest.fixture
def task_copy(tmp_path: Path) -> Callable[..., Path]:
    def make(name: str = "hello-file", trajectory: list | None = None, **changes) -> Path:
        dest = tmp_path / name
        shutil.copytree(SAMPLES / name, dest)
        if trajectory is not None:
            (dest / "trajectory.yaml").write_text(yaml.safe_dump({"steps": trajectory}))
        if changes:
            data = yaml.safe_load((dest / "task.yaml").read_text())
            data.update(changes)
            (dest / "task.yaml").write_text(yaml.safe_dump(data))
        return dest

    return make


@pytest.fixture
def episode_on(tmp_path: Path) -> Callable[..., Episode]:
    def make(task_dir: Path, **config) -> Episode:
        cfg = AgentConfig.model_validate(
            {"sandbox": {"provider": "local"}, "policy": {"max_attempts": 1}, **config}
        )
        return Episode(load_task(task_dir), cfg, runs_dir=tmp_path / "runs")

    return make
