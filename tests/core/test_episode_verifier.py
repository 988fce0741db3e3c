"""A grading failure is never a reward, end to end: the real OpenCode binary, the scripted model, real
sandboxes (Docker and bubblewrap), and verifiers that really kill themselves or outlive their deadline.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.failures import Outcome
from opencode_tui_core.tasks import load_task

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def run_hello(tmp_path: Path, provider: str, verify: dict):
    """hello-file with another verifier; returns the episode's result."""
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task)
    data = yaml.safe_load((task / "task.yaml").read_text())
    data["verify"] = verify
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    config = AgentConfig.model_validate({"sandbox": {"provider": provider}, "policy": {"max_attempts": 1}})
    return asyncio.run(Episode(load_task(task), config, runs_dir=tmp_path / "runs").run())


def failures(result) -> list:
    return [e for e in RunDirReader(Path(result.run_dir)).events() if e.type == "failure"]


@pytest.mark.parametrize(
    "command",
    [
        pytest.param('test -f hello.txt && kill -9 "$$"', id="kills-its-shell"),
        pytest.param('test -f hello.txt && kill -9 "$PPID"', id="kills-the-wrapper-too"),
    ],
)
def test_verifier_killed_by_a_signal_is_not_scored_and_not_a_timeout(tmp_path, episode_provider, command):
    result = run_hello(tmp_path, episode_provider, {"command": command, "timeout": 30})
    assert (result.action, result.reward) == (Outcome.MARK_EVALUATION_ERROR, None)
    assert (result.failure_kind, result.failure_stage, result.failure_class) == (
        "verifier_error",
        "verification",
        "evaluation",
    )
    [f] = failures(result)
    assert "signal 9" in f.failure.message
    assert result.cleanup_confirmed is True
    verification = [e for e in RunDirReader(Path(result.run_dir)).events() if e.type == "verification"]
    assert verification[0].reward is None and verification[0].passed is None


def test_verifier_past_its_own_deadline_is_a_verifier_timeout(tmp_path, episode_provider):
    result = run_hello(tmp_path, episode_provider, {"command": "sleep 60", "timeout": 2})
    assert (result.action, result.reward, result.failure_kind) == (
        Outcome.MARK_EVALUATION_ERROR,
        None,
        "verifier_timeout",
    )
    [f] = failures(result)
    assert f.failure.details.budget_s == 2 and f.failure.details.timed_out_observed
    assert result.durations_s["verification"] < 30


def test_verifier_exit_code_is_still_the_grade(tmp_path, episode_provider):
    """An honest failing verifier is a real zero: the wrapper passes its exit code through."""
    result = run_hello(tmp_path, episode_provider, {"command": "test -f hello.txt && exit 3", "timeout": 30})
    assert (result.action, result.reward, result.failure_kind) == (Outcome.SCORED, 0.0, None)
    tokens = [
        json.loads(line)["usage"]
        for line in (Path(result.run_dir) / RunFiles.MODEL_CALLS).read_text().splitlines()
    ]
    assert result.tokens_in == sum(u["tokens_in"] for u in tokens) > 0
    assert result.agent_tokens_in is not None


def _hello_with_last_command(tmp_path: Path, command: str, description: str) -> Path:
    """hello-file whose agent runs ``command`` just before its last answer."""
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task)
    trajectory = yaml.safe_load((task / "trajectory.yaml").read_text())
    trajectory["steps"].insert(
        -1, {"tool_calls": [{"name": "bash", "arguments": {"command": command, "description": description}}]}
    )
    (task / "trajectory.yaml").write_text(yaml.safe_dump(trajectory))
    return task


def test_a_lost_transcript_snapshot_never_costs_a_verified_reward(tmp_path, episode_provider):
    """The REAL fault: the agent's last command deletes OpenCode's database in the sandbox, so the
    snapshot after a confirmed cleanup has nothing to read. The verifier passes: reward 1 stands, and
    the failed snapshot is recorded as a warning with its evidence."""
    task = _hello_with_last_command(
        tmp_path, 'rm -f "$XDG_DATA_HOME"/opencode/opencode.db*', "Remove OpenCode's database"
    )
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": episode_provider}, "policy": {"max_attempts": 1}}
    )
    result = asyncio.run(Episode(load_task(task), config, runs_dir=tmp_path / "runs").run())
    assert (result.action, result.reward, result.failure_kind, result.exit_code) == (
        Outcome.SCORED,
        1.0,
        None,
        0,
    )
    assert "warning: transcript_export_failed" in result.summary
    assert result.warnings == ["transcript_export_failed"]
    [lost] = failures(result)
    assert lost.failure.kind == "transcript_export_failed" and lost.failure.stage.value == "transcript"
    assert lost.decision.warning
    [seen] = [e for e in lost.failure.evidence if e.source == "transcript.snapshot"]
    assert seen.data["copy_exists"] and "opencode.db" not in seen.data["files"]
    assert "not found" in seen.data["error"]


def test_a_failed_download_of_opencodes_data_never_costs_a_verified_reward(tmp_path, episode_provider):
    """The REAL fault: the agent's last command moves OpenCode's data directory away (OpenCode keeps
    its open files), so after a confirmed cleanup the provider's download of that directory fails
    with the provider's own typed failure (a missing file, not the snapshot's). It happened in the
    transcript phase: a warning with its evidence, and the verified reward 1 stands (exit 0)."""
    task = _hello_with_last_command(
        tmp_path, 'mv "$XDG_DATA_HOME/opencode" "$XDG_DATA_HOME/moved-away"', "Move OpenCode's data away"
    )
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": episode_provider}, "policy": {"max_attempts": 1}}
    )
    result = asyncio.run(Episode(load_task(task), config, runs_dir=tmp_path / "runs").run())
    assert (result.action, result.reward, result.failure_kind, result.exit_code) == (
        Outcome.SCORED,
        1.0,
        None,
        0,
    ), result.summary
    # The provider's own kind (not renamed to the snapshot's), stamped with the phase it happened in;
    # then the snapshot that had no copy to read. Both warnings, neither decides.
    lost, snapshot = failures(result)
    assert lost.failure.kind == "sandbox_file_failed" and lost.failure.stage.value == "transcript"
    assert snapshot.failure.kind == "transcript_export_failed"
    assert lost.decision.warning and snapshot.decision.warning
    assert result.warnings == ["sandbox_file_failed", "transcript_export_failed"]
    assert "warning: sandbox_file_failed" in result.summary
    [seen] = [e for e in lost.failure.evidence if e.source == "sandbox.download"]
    assert "does not exist" in seen.data["error"] or "No such" in seen.data["error"]
    assert result.cleanup_confirmed and result.tool_calls >= 2
