"""A borrowed sandbox whose cleanup is unconfirmed gets no further attempt (a real episode in a
borrowed Docker container: the real OpenCode binary, the scripted model, the batch's retry path)."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.tasks import load_task

pytestmark = [pytest.mark.slow, pytest.mark.docker]

BASE_IMAGE = "opencode-tui/base:bookworm"
# The agent kills its own supervisor: no receipt can ever come for this run.
# (The session directory is the only one under /tmp in this fresh container.)
KILL_SUPERVISOR = "kill -9 $(cut -d' ' -f1 /tmp/.opencode-tui*/supervisor.pid) && echo killed"


async def test_no_further_attempt_in_a_borrowed_sandbox_whose_cleanup_is_unconfirmed(
    tmp_path, task_copy, test_owner
):
    """The policy is set to retry an unconfirmed cleanup, so the batch takes its retry path. In a
    borrowed container that may still run the last attempt's processes, the batch first retries the
    close from the session directory the release kept; it cannot confirm (the supervisor is dead), so
    no further attempt starts there. Before, the batch started attempts 2 and 3 in that container."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.skip("docker or the base image is unavailable")
    import docker

    container = docker.from_env().containers.run(
        BASE_IMAGE,
        ["sleep", "infinity"],
        detach=True,
        network_mode="host",  # borrowed sandboxes reach the model proxy by URL on loopback
        init=True,
        working_dir="/app",  # the task's workdir, as a borrowed sandbox would have it
        labels={"opencode-tui.owner": test_owner, "opencode-tui.run": f"pytest-{uuid.uuid4().hex[:8]}"},
    )
    try:
        steps = [
            {"tool_calls": [{"name": "bash", "arguments": {"command": KILL_SUPERVISOR, "description": "x"}}]},
            {"text": "done"},
        ]
        task = load_task(task_copy("hello-file", trajectory=steps))
        config = AgentConfig.model_validate(
            {
                "sandbox": {"provider": "docker", "mode": "borrowed", "sandbox_id": container.id},
                "policy": {"max_attempts": 3, "kind": {"cleanup_unconfirmed": "retry"}},
                "budgets": {"close_s": 6},
            }
        )
        runs = tmp_path / "runs"
        summary = await run_batch([task], config, runs_dir=runs, jobs=1)
        (result,) = summary.results
        assert result.failure_kind == "cleanup_unconfirmed", result.summary
        assert result.cleanup_confirmed is False
        assert result.attempt == 1 and result.previous_attempts == []
        assert "no further attempt" in result.summary
        assert [p.name for p in runs.iterdir() if p.is_dir()] == [result.run_id]
        container.reload()
        assert container.status == "running"  # borrowed: never destroyed
        found = container.exec_run(["sh", "-c", "ls -d /tmp/.opencode-tui*/"]).output.decode().split()
        (kept,) = [d for d in found if result.run_id in d]
        files = container.exec_run(["ls", "-a", kept]).output.decode().split()
        assert {"stop.request", "launch.claim", "supervisor.pid"} <= set(files), files
    finally:
        container.remove(force=True)
