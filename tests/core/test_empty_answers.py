"""No progress is a failure, not a loop (issue 32), end to end with the scripted model: it answers every
agent call with HTTP 200 and an empty body (the ``empty`` fault, what llama.cpp's server sends when its
chat format raises inside a stream), the real OpenCode asks again and again, and the episode stops it.

Real parts: OpenCode, the recording proxy, the sandbox (local and docker). The real server that first
showed this is tests/core/test_real_model.py; this one runs wherever OpenCode does.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.events import FailureRecorded, HealthKind, HealthWarning, PhaseChanged
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.tasks import load_task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LIMIT = 5  # the default model.empty_answers_limit


def _task(root: Path) -> Path:
    d = root / "empty-answers"
    (d / "files").mkdir(parents=True)
    steps = [
        {
            "tool_calls": [
                {"name": "write", "arguments": {"filePath": "{workdir}/done.txt", "content": "done\n"}}
            ],
            "fault": {"empty": True, "times": 10_000},
        },
        {"text": "done.txt is written."},
    ]
    (d / "trajectory.yaml").write_text(yaml.safe_dump({"title": "empty answers", "steps": steps}))
    (d / "task.yaml").write_text(
        yaml.safe_dump(
            {
                "id": "empty-answers",
                "problem_statement": "Write done.txt containing done.",
                "workdir": "/app",
                "files": "files",
                "verify": {"command": 'test "$(cat done.txt)" = done', "timeout": 30},
                "model": {"trajectory": "trajectory.yaml"},
            }
        )
    )
    return d


@pytest.fixture(
    scope="module",
    params=[pytest.param("local", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)],
)
def result(request, tmp_path_factory):
    provider = request.param
    if provider == "docker":
        r = subprocess.run(["docker", "image", "inspect", "opencode-tui/base:bookworm"], capture_output=True)
        if r.returncode != 0:
            pytest.skip(
                "docker or the base image is unavailable (scripts/start-dockerd, scripts/build-images)"
            )
    task = load_task(_task(tmp_path_factory.mktemp("empty-task")))
    runs = tmp_path_factory.mktemp(f"empty-runs-{provider}")
    config = AgentConfig.model_validate({"sandbox": {"provider": provider}, "budgets": {"run_s": 300}})
    (res,) = asyncio.run(run_batch([task], config, runs_dir=runs, jobs=1)).results
    return res


def test_the_loop_ends_as_model_empty_response_with_cleanup_confirmed(result):
    assert result.failure_kind == "model_empty_response", result.summary
    assert result.failure_stage == "agent" and result.failure_class == "evaluation"
    assert result.action == "mark_evaluation_error" and result.exit_code == ExitCode.INFRA
    assert result.cleanup_confirmed and result.cleanup_proof == "receipt"
    # Stopped well before the run budget: the agent phase is short, and nothing was graded.
    assert result.durations_s["agent"] < 120
    assert "verification" not in result.durations_s


def test_every_empty_answer_is_a_failed_call_and_the_count_is_bounded(result):
    records = list(RunDirReader(Path(result.run_dir)).model_calls())
    agent = sorted((r for r in records if r.kind == "agent"), key=lambda r: r.started_at)
    seen = [(r.call_id, r.status, r.answer_fault, r.error) for r in agent]
    assert LIMIT <= len(agent) <= LIMIT + 3, seen  # the limit, and what was in flight when it fired
    # The calls that made the limit are empty 200s, each a failed call.
    assert all(r.failed and r.answer_fault == "empty_body" and r.status == 200 for r in agent[:LIMIT]), seen
    # One in flight when the agent was stopped may be cut before its answer was read (OpenCode hung up:
    # "client connection lost"): still a failed call, never a good answer.
    assert all(r.failed for r in agent[LIMIT:]), seen
    assert result.model_calls_failed == len(agent)
    assert all(not r.failed for r in records if r.kind == "title")


def test_warned_first_then_failed_once_citing_the_calls(result):
    events = list(RunDirReader(Path(result.run_dir)).events())
    failures = [e for e in events if isinstance(e, FailureRecorded)]
    assert [f.failure.kind for f in failures] == ["model_empty_response"]
    (failure,) = failures
    assert len(failure.failure.evidence[0].data["call_ids"]) == LIMIT
    warnings = [e for e in events if isinstance(e, HealthWarning) and e.kind is HealthKind.EMPTY_ANSWERS]
    assert len(warnings) == 1 and warnings[0].seq < failure.seq
    phases = [e.phase.value for e in events if isinstance(e, PhaseChanged)]
    assert "verification" not in phases and phases[-1] == "done"
