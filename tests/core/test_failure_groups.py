"""Failures grouped by kind × stage × evidence signature, over a real recorded batch.

tests/fixtures/batch/results.jsonl is the results file of a real batch (local provider, scripted model:
``run oom model-flaky-500 hello-file timeout exit-137 --batch --jobs 2``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.events import FailureRecorded, OutcomeDecided
from opencode_tui_core.failure_groups import (
    RecordedAttempt,
    deciding,
    evidence_signature,
    group_failures,
    groups_line,
)
from opencode_tui_core.resume import load_batch

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
    other_stage = oom.model_copy(
        update={"run_id": "oom-verify-a1", "task_id": "oom-3", "failure_stage": "verify"}
    )
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


def test_a_task_is_grouped_once_by_its_deciding_attempt() -> None:
    """Two attempts of one task: the first failed with X (model_server_error), the retry with Y (an oom):
    one group, Y, under the retry's run id; a task whose retry scored is in no group. Every attempt is
    still there for whoever lists attempts (``deciding`` picks, it does not drop the input)."""
    results = load_batch(BATCH, _batch_id())
    flaky = next(r for r in results if r.failure_kind == "model_server_error")
    oom = next(r for r in results if r.failure_kind == "provider_oom_killed")
    scored = next(r for r in results if r.failure_kind is None)
    x = flaky.model_copy(update={"task_id": "t", "attempt": 1, "run_id": "t-a1"})
    y = oom.model_copy(update={"task_id": "t", "attempt": 2, "run_id": "t-a2", "previous_attempts": ["t-a1"]})
    u1 = flaky.model_copy(update={"task_id": "u", "attempt": 1, "run_id": "u-a1"})
    u2 = scored.model_copy(update={"task_id": "u", "attempt": 2, "run_id": "u-a2"})
    for order in ([x, y, u1, u2], [y, x, u2, u1]):  # the order given does not decide, the attempt does
        groups = group_failures(order)
        assert [(g.kind, g.count, g.run_ids, g.task_ids) for g in groups] == [
            ("provider_oom_killed", 1, ["t-a2"], ["t"])
        ]
        assert (
            groups_line(order)
            == "failures in 1 of 2: 1 provider_oom_killed at agent (cgroup.memory oom_kill=1)"
        )
    assert [r.run_id for r in deciding([x, y, u1, u2])] == ["t-a2", "u-a2"]


def test_a_run_directory_groups_like_its_result_line() -> None:
    """The recorded oom run read back (run.json + its outcome event) keys the same group its result line
    would: the report, which reads run directories, groups as ``runs --batch`` does."""
    reader = RunDirReader(FIXTURES / "runs" / "oom")
    info = reader.info()
    assert info is not None
    outcome = next(e for e in reader.events() if isinstance(e, OutcomeDecided))
    rec = RecordedAttempt.of(info, outcome)
    assert (rec.failure_kind, rec.failure_stage, rec.failure_evidence) == (
        "provider_oom_killed",
        "agent",
        "docker.events action=oom",
    )
    assert group_failures([rec]) != []
    hello = RunDirReader(FIXTURES / "runs" / "hello-file").info()
    assert hello is not None
    retry_scored = replace(RecordedAttempt.of(hello, None), task_id="oom", attempt=2)
    assert retry_scored.failure_kind is None
    assert group_failures([rec, retry_scored]) == []
