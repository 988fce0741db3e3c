"""A model failure cites the proxy's records as its evidence (issue 25): the sample model-flaky-500
end to end on the local provider (the real OpenCode binary, the scripted model answering 500 on every
agent turn, the recording proxy)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.tasks import load_task

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]
SAMPLES = Path(__file__).resolve().parents[3] / "sample_tasks"


def test_model_server_error_cites_every_failed_call_it_rests_on(tmp_path):
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}, "policy": {"max_attempts": 1}})
    task = load_task(SAMPLES / "model-flaky-500")
    result = asyncio.run(Episode(task, config, runs_dir=tmp_path).run())
    assert (result.action, result.failure_kind) == ("mark_evaluation_error", "model_server_error")
    reader = RunDirReader(Path(result.run_dir))
    [failure] = [e.failure for e in reader.events() if e.type == "failure"]
    failed = [r for r in reader.model_calls() if r.kind != "title" and r.status == 500]
    assert len(failed) >= 2, "OpenCode retried the 500s before giving up"
    cited = [e for e in failure.evidence if e.source == "model.proxy"]
    assert [(e.scope, e.data["status"]) for e in cited] == [(r.call_id, 500) for r in failed][-10:]
    assert all(e.data["body_excerpt"] for e in cited), cited
    assert failure.details.call_id == failed[-1].call_id and failure.details.attempts == len(failed)
