"""When no receipt can be had, an owned sandbox's destruction is the proof, and the record says why.

The agent (real OpenCode, scripted model) runs `kill -9 -1`: every process it can signal dies, the
supervisor included, so no cleanup receipt is ever written. The episode must say so in one line naming
the command, destroy the owned sandbox, and record ``cleanup_proof: destroyed``.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.tasks import load_task

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


@pytest.mark.parametrize(
    "provider",
    [pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)],
)
def test_supervisor_killed_by_the_agent_is_proven_clean_by_destruction(tmp_path, provider):
    if provider == "docker":
        r = subprocess.run(["docker", "image", "inspect", "opencode-tui/base:bookworm"], capture_output=True)
        if r.returncode != 0:
            pytest.skip(
                "docker or the base image is unavailable (scripts/start-dockerd, scripts/build-images)"
            )
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task)
    steps = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "kill -9 -1", "description": "Kill all"}}]},
        {"text": "unreachable"},
    ]
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": provider}, "policy": {"max_attempts": 1}, "budgets": {"close_s": 20}}
    )
    result = asyncio.run(Episode(load_task(task), config, runs_dir=tmp_path / "runs").run())
    assert (result.cleanup_confirmed, result.cleanup_proof) == (True, "destroyed"), result.summary
    assert (result.failure_kind, result.action, result.reward) == ("supervisor_lost", "keep_unknown", None)
    [failure] = [e for e in RunDirReader(Path(result.run_dir)).events() if e.type == "failure"]
    assert "kill -9 -1" in failure.failure.message and "\n" not in failure.failure.message
    released = [
        e
        for e in RunDirReader(Path(result.run_dir)).events()
        if e.type == "cleanup" and e.step == "sandbox_released"
    ]
    assert released and released[-1].state == "ok"
    if provider == "docker":
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=opencode-tui.run={result.run_id}"],
            capture_output=True,
            text=True,
        )
        assert out.stdout.split() == []
