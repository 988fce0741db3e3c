"""Failures grouped by kind × stage × evidence signature, over a real recorded batch.

tests/fixtures/batch/results.jsonl is the results file of a real batch (local provider, scripted model:
``run oom model-flaky-500 hello-file timeout exit-137 --batch --jobs 2``)."""

from __future__ import annotations

import json
from pathlib import Path

from core.artifacts import RunDirReader
from core.events import FailureRecorded
from core.failure_groups import evidence_signature, group_failures, groups_line
from core.resume import load_batch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BATCH = FIXTURES / "batch"


def _batch_id() -> str:
    first = json.loads((BATCH / "results.jsonl").read_text().splitlines()[0])
    return str(first["batch_id"])


def test_recorded_batch_groups_by_kind_stage_and_evidence() -> None:
    results = load_batch(BATCH, _batch_id())
    assert len(results) == 5
    groups = group_failures(results)
    by_kind = {g.kind: g for g in groups}
    assert set(by_kind) == {"model_server_error", "provider_oom_killed", "agent_timeout"}
    assert by_kind["model_server_error"].signature == "model.proxy status=500"
    assert by_kind["provider_oom_killed"].signature == "cgroup.memory oom_kill=1"
    assert all(g.stage == "agent" and g.count == 1 for g in groups)
    # Every failed result is in exactly one group, under its own run id; the scored ones in none.
    failed = {r.run_id for r in results if r.failure_kind}
    grouped = [run for g in groups for run in g.run_ids]
    assert sorted(grouped) == sorted(failed)
    assert not {r.run_id for r in results if r.failure_kind is None} & set(grouped)
    line = groups_line(results)
    assert line.startswith("failures in 3 of 5: ")
    assert "1 model_server_error at agent (model.proxy status=500)" in line


def test_same_failure_twice_is_one_group_largest_first() -> None:
    results = load_batch(BATCH, _batch_id())
    oom = next(r for r in results if r.failure_kind == "provider_oom_killed")
    again = oom.model_copy(update={"run_id": "oom-again-a1", "task_id": "oom-2"})
    other_stage = oom.model_copy(update={"run_id": "oom-verify-a1", "failure_stage": "verify"})
    groups = group_failures([*results, again, other_stage])
    assert groups[0].kind == "provider_oom_killed" and groups[0].stage == "agent"
    assert groups[0].count == 2 and groups[0].run_ids == [oom.run_id, "oom-again-a1"]
    assert groups[0].task_ids == ["oom", "oom-2"]
    assert any(g.stage == "verify" and g.count == 1 for g in groups)
    assert groups_line([]) == "" and group_failures([]) == []


def test_signature_of_recorded_evidence_names_what_not_which() -> None:
    """The recorded oom run's deciding failure: its signature carries no id, path or time."""
    reader = RunDirReader(FIXTURES / "runs" / "oom")
    failures = [e for e in reader.events() if isinstance(e, FailureRecorded)]
    assert failures
    sig = evidence_signature(failures[-1].failure.evidence)
    assert sig == "docker.events action=oom"
    assert "/" not in sig and "opencode-tui" not in sig and len(sig) <= 48
    assert evidence_signature([]) is None


def test_another_batch_id_has_no_results() -> None:
    assert load_batch(BATCH, "bnotthisone00") == []
