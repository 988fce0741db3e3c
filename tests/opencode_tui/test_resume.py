"""Resume that notices change: ``opencode-tui run --batch`` with the same ``--runs-dir`` skips a task
already scored with the same task content and effective configuration (one stderr line, ``resumed:
true`` on its JSON line), runs it again when either changed, and runs everything with ``--force``.

Real episodes: the CLI in a subprocess, the local provider (bubblewrap), the real OpenCode binary and
the scripted model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.resume import resume_key
from opencode_tui_core.tasks import load_task

ROOT = Path(__file__).resolve().parents[2]


def _run(task: Path, runs: Path, *extra: str) -> tuple[list[dict], list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["run", str(task), "--batch", "--provider", "local", "--runs-dir", str(runs), *extra]
    proc = subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0, proc.stderr
    return lines, proc.stderr.splitlines()


def test_the_key_is_content_and_config_not_the_id(tmp_path):
    task_dir = shutil.copytree(ROOT / "sample_tasks" / "hello-file", tmp_path / "hello-file")
    config = AgentConfig()
    key = resume_key(load_task(task_dir), config)
    assert key == resume_key(load_task(task_dir), AgentConfig())
    assert key != resume_key(load_task(task_dir), AgentConfig.model_validate({"budgets": {"run_s": 60}}))
    # Where runs go and the theme are not part of the experiment.
    assert key == resume_key(load_task(task_dir), AgentConfig.model_validate({"runs_dir": "elsewhere"}))
    (task_dir / "trajectory.yaml").write_text((task_dir / "trajectory.yaml").read_text() + "\n# edited\n")
    assert key != resume_key(load_task(task_dir), config)


@pytest.mark.slow
@pytest.mark.bwrap
def test_edited_verify_command_runs_again_unchanged_is_skipped(tmp_path):
    task_dir = shutil.copytree(ROOT / "sample_tasks" / "hello-file", tmp_path / "hello-file")
    runs = tmp_path / "runs"

    [first], _ = _run(task_dir, runs)
    assert first["action"] == "scored" and not first["resumed"]

    [same], err = _run(task_dir, runs)
    assert same["resumed"] is True and same["run_id"] == first["run_id"]
    assert f"skipped: already scored in {first['run_dir']}" in err
    assert any(
        line.startswith("[1/1] hello-file (attempt 1, recorded earlier, not run again): ") for line in err
    )

    yaml = task_dir / "task.yaml"
    yaml.write_text(yaml.read_text().replace('= "Hello from OpenCode"', '= "Hello from OpenCode" && true'))
    [edited], err = _run(task_dir, runs)
    assert not edited["resumed"] and edited["run_id"] != first["run_id"] and edited["action"] == "scored"
    assert not any(line.startswith("skipped:") for line in err)

    [forced], err = _run(task_dir, runs, "--force")
    assert not forced["resumed"] and forced["run_id"] not in (first["run_id"], edited["run_id"])
    assert not any(line.startswith("skipped:") for line in err)
