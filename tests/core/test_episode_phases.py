"""The episode's phases on their own: each takes what it needs and returns a typed result.

The pure parts (counting, naming the agent's last command, stamping a failure, the result line) are
checked directly; the verify and release phases run against a real local (bubblewrap) sandbox, with
no episode around them. End-to-end behaviour stays in test_episode*.py.
"""

from __future__ import annotations

import errno
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDir
from opencode_tui_core.calls.records import ModelCallRecord
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import close, release, verify
from opencode_tui_core.episode.common import PhaseIO, failure_from, stage_of
from opencode_tui_core.episode.record import result_of
from opencode_tui_core.events import (
    CleanupObserved,
    CleanupStep,
    Compaction,
    FaultKind,
    ModelCall,
    Phase,
    SandboxFault,
    StepState,
    ToolCall,
    TranscriptStats,
    VerificationFinished,
)
from opencode_tui_core.failures import DEFAULT_POLICY, FailureEvent, FailureStage, Outcome, decide
from opencode_tui_core.outcome import EpisodeFacts, RecordedFailure, decide_outcome
from opencode_tui_core.sandbox.base import SandboxError, SandboxSpec, SandboxUser
from opencode_tui_core.session import CleanupUnconfirmed, CloseDeadline
from opencode_tui_core.tally import Tally
from opencode_tui_core.tasks import load_task

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def _call(n: int) -> ModelCall:
    return ModelCall(
        call_id=f"c{n}", method="POST", path="/v1/chat/completions", status=200,
        started_at=datetime.now(UTC), latency_s=0.1, tokens_in=10, tokens_out=n,
    )  # fmt: skip


def test_tally_counts_live_events_and_takes_the_transcript_as_the_truth():
    tally = Tally()
    for event in (
        _call(1),
        _call(2),
        ToolCall(call_id="t1", tool="bash", status="running", input={"command": "ls -la"}),
        ToolCall(call_id="t1", tool="bash", status="completed"),
        ToolCall(call_id="t2", tool="read", status="completed"),
        Compaction(count=2),
        Compaction(count=1),  # a late, lower count never lowers it
    ):
        tally.count(event)
    assert (len(tally.model_calls), tally.tool_calls, tally.compactions) == (2, {"bash": 1, "read": 1}, 2)
    assert tally.last_command == "ls -la"
    assert (tally.agent_tokens_in, tally.agent_tokens_out) == (None, None)  # unknown, never 0
    # A kernel kill seen live is kept for the close (it names the process in the OOM failure).
    kill = SandboxFault(kind=FaultKind.OOM_KILL, source="kernel.log", message="killed", pid=7)
    tally.count(kill)
    assert tally.faults == [kill]
    tally.count(TranscriptStats(messages=4, tool_calls={"bash": 3}, compactions=1, tokens_in=7, tokens_out=5))
    assert (tally.tool_calls, tally.compactions, tally.agent_tokens_in, tally.agent_tokens_out) == (
        {"bash": 3},
        1,
        7,
        5,
    )


def _record(tool_calls: list[tuple[str, str]]) -> ModelCallRecord:
    body = {
        "choices": [
            {"message": {"tool_calls": [{"function": {"name": n, "arguments": a}} for n, a in tool_calls]}}
        ]
    }
    return ModelCallRecord(
        call_id="c",
        method="POST",
        path="/v1/chat/completions",
        started_at=datetime.now(UTC),
        response_body=body,
    )


def test_the_last_command_the_model_asked_for_comes_from_the_proxy_records():
    records = [
        _record([("bash", '{"command": "echo first"}')]),
        _record([("bash", '{"command": "kill -9 -1"}'), ("read", '{"path": "x"}')]),
        _record([("bash", "not json")]),
    ]
    assert close.last_requested_command(records) == "kill -9 -1"
    assert close.last_requested_command([]) is None
    exc = CleanupUnconfirmed("no receipt")
    assert close.why_unconfirmed(exc, hurried=False, last_command="kill -9 -1") == (
        "no receipt (while the agent ran `kill -9 -1`)"
    )
    assert "hurried" in close.why_unconfirmed(exc, hurried=True, last_command="kill -9 -1")


def test_a_providers_failure_keeps_its_kind_and_takes_the_episodes_stage():
    provider_failure = FailureEvent(
        kind="sandbox_lost", stage=FailureStage.AGENT, operation="exec", message="the container is gone"
    )
    err = SandboxError("gone")
    err.failure = provider_failure  # type: ignore[attr-defined]
    stamped = failure_from(err, "verifier_error", FailureStage.VERIFICATION, "run verifier")
    assert (stamped.kind, stamped.stage) == ("sandbox_lost", FailureStage.VERIFICATION)
    plain = failure_from(ValueError("bug"), "verifier_error", FailureStage.VERIFICATION, "run verifier")
    assert (plain.kind, plain.stage, plain.operation) == (
        "verifier_error",
        FailureStage.VERIFICATION,
        "run verifier",
    )
    assert stage_of(Phase.DONE) is FailureStage.RELEASE
    assert stage_of(Phase.CLOSING) is FailureStage.CLOSING
    assert stage_of("a-phase-from-a-newer-version") is FailureStage.RELEASE  # an old run.json's phase


def _io(tmp_path: Path) -> tuple[PhaseIO, list, list[FailureEvent]]:
    events: list = []
    recorded: list[FailureEvent] = []
    run_dir = RunDir.create(tmp_path / "runs", "phase-test")
    return PhaseIO(events.append, recorded.append, run_dir), events, recorded


def test_a_full_disk_during_a_cleanup_step_is_said_as_what_it_is(tmp_path):
    io, events, recorded = _io(tmp_path)
    notes: list[str] = []
    io.run_dir.on_write_error = notes.append
    full = OSError(errno.ENOSPC, "No space left on device", str(io.run_dir.path / "opencode.db"))
    io.step_failed(
        CleanupStep.TRANSCRIPT_SNAPSHOT, full, "transcript_export_failed", FailureStage.TRANSCRIPT, "x"
    )
    assert [(e.step, e.state) for e in events] == [(CleanupStep.TRANSCRIPT_SNAPSHOT, StepState.FAILED)]
    assert recorded == [] and io.recorded == []  # not the transcript's failure: the disk's
    assert notes and "No space left on device" in notes[0]
    io.step_failed(
        CleanupStep.SANDBOX_RELEASED,
        RuntimeError("stuck"),
        "sandbox_release_failed",
        FailureStage.RELEASE,
        "r",
    )
    assert [f.kind for f in recorded] == [f.kind for f in io.recorded] == ["sandbox_release_failed"]


def test_the_result_line_carries_the_verdict_the_counts_and_unknown_tokens_as_null():
    failure = FailureEvent(kind="agent_timeout", stage=FailureStage.AGENT, operation="run", message="late")
    recorded = [RecordedFailure(failure=failure, decision=decide(failure, attempt=1, policy=DEFAULT_POLICY))]
    verdict = decide_outcome(EpisodeFacts(failures=recorded, reward=1.0, cleanup_confirmed=True))
    tally = Tally()
    tally.count(ToolCall(call_id="t", tool="bash", status="completed"))
    result = result_of(verdict, tally, run_id="r", task_id="t", attempt=1, provider="local", run_dir="/x")
    assert (result.failure_kind, result.failure_stage, result.action) == (
        "agent_timeout",
        "agent",
        verdict.outcome,
    )
    assert result.reward == verdict.reward and result.exit_code == verdict.exit_code
    assert (result.model_calls, result.tool_calls, result.tokens_in, result.agent_tokens_in) == (
        0,
        1,
        None,
        None,
    )


# ---- against a real sandbox ---------------------------------------------------------------------


@pytest.fixture
async def local_sandbox(tmp_path):
    from opencode_tui_core.sandbox.providers import get_provider

    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    provider = get_provider(config.sandbox.provider, config)
    try:
        sandbox = await provider.create(SandboxSpec(run_id="pytest-phases", workdir="/app"))
    except SandboxError as exc:
        pytest.skip(f"bubblewrap cannot run here: {exc}")
    try:
        yield sandbox
    finally:
        await sandbox.release()


def _task(tmp_path: Path, verify_section: dict):
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task)
    data = yaml.safe_load((task / "task.yaml").read_text())
    data["verify"] = verify_section
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    return load_task(task)


async def _verify(sandbox, task, io):
    user = SandboxUser(uid=0, gid=0)
    return await verify.verify(
        sandbox, task=task, run_id="pytest-phases", python="python3", sandbox_user=user,
        agent_oom=frozenset(), deadline=CloseDeadline(30), io=io,
    )  # fmt: skip


@pytest.mark.bwrap
async def test_verify_reads_the_reward_file_of_a_verifier_that_exited(tmp_path, local_sandbox):
    task = _task(tmp_path, {"command": "echo 0.25 > reward.txt", "reward_file": "reward.txt", "timeout": 30})
    io, events, recorded = _io(tmp_path)
    verified = await _verify(local_sandbox, task, io)
    assert (verified.reward, verified.failures, recorded) == (0.25, (), [])
    assert verified.run is not None and (verified.run.exit_code, verified.run.signal) == (0, None)
    [finished] = [e for e in events if isinstance(e, VerificationFinished)]
    assert finished.reward == 0.25 and finished.exit_code == 0


@pytest.mark.bwrap
async def test_verify_reports_a_killed_verifier_as_no_grade(tmp_path, local_sandbox):
    task = _task(tmp_path, {"command": 'kill -9 "$$"', "timeout": 30})
    io, _events, recorded = _io(tmp_path)
    verified = await _verify(local_sandbox, task, io)
    assert verified.reward is None
    assert verified.run is not None and (verified.run.exit_code, verified.run.signal) == (None, 9)
    assert [f.kind for f in verified.failures] == [f.kind for f in recorded] == ["verifier_error"]
    assert verified.failures[0].stage is FailureStage.VERIFICATION
    assert (
        decide_outcome(
            EpisodeFacts(
                failures=[
                    RecordedFailure(failure=f, decision=decide(f, attempt=1, policy=DEFAULT_POLICY))
                    for f in recorded
                ]
            )
        ).outcome
        is Outcome.MARK_EVALUATION_ERROR
    )


@pytest.mark.bwrap
async def test_release_without_a_session_destroys_the_sandbox_within_the_close_budget(
    tmp_path, local_sandbox
):
    io, events, _recorded = _io(tmp_path)
    released = await release.release(local_sandbox, None, deadline=CloseDeadline(30), io=io)
    assert (released.kept, released.failures) == (False, ())
    observed = [(e.step, e.state, e.data) for e in events if isinstance(e, CleanupObserved)]
    assert observed == [(CleanupStep.SANDBOX_RELEASED, StepState.OK, {"owned": True})]
    with pytest.raises(SandboxError):
        await local_sandbox.exec(["true"], timeout=10)


async def test_a_hurry_destroys_only_within_the_close_budget_left(tmp_path, local_sandbox):
    """A second cancel destroys the owned sandbox within what the close has left, never a fresh
    budget (issue 25): with the budget spent (a clock moved past it), the destruction is not started
    and the warning says why; with time left, the sandbox is destroyed."""
    from opencode_tui_core.control import CancelRequest
    from opencode_tui_core.episode import Episode
    from opencode_tui_core.events import Warning_

    task = load_task(SAMPLES / "hello-file")
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}})
    episode = Episode(task, config, runs_dir=tmp_path)
    warnings: list[Warning_] = []
    episode.bus.subscribe(lambda e: warnings.append(e) if isinstance(e, Warning_) else None)
    episode.sandbox = local_sandbox
    now = [0.0]
    episode.close_deadline = CloseDeadline(config.budgets.close_s, clock=lambda: now[0])
    episode._cancel = CancelRequest(by="user", phase=Phase.CLOSING)
    now[0] += config.budgets.close_s + 1  # the close has used its whole budget
    await episode._hurry("user")
    assert (await local_sandbox.exec(["true"], timeout=10)).ok, "destroyed on a fresh budget"
    [failed] = [w for w in warnings if w.code == "hurry_release_failed"]
    assert "was not started" in failed.message

    episode._cancel = CancelRequest(by="user", phase=Phase.CLOSING)
    episode.close_deadline = CloseDeadline(config.budgets.close_s)
    await episode._hurry("user")
    with pytest.raises(SandboxError):
        await local_sandbox.exec(["true"], timeout=10)


def test_a_fault_is_attributed_to_the_shell_command_running_when_it_happened():
    from datetime import timedelta

    from opencode_tui_core.episode.agent import _Shells

    t0 = datetime.now(UTC)
    shells = _Shells()
    shells.see(ToolCall(ts=t0, call_id="a", tool="bash", status="running", input={"command": "make"}))
    shells.see(ToolCall(ts=t0 + timedelta(seconds=5), call_id="a", tool="bash", status="completed"))
    shells.see(ToolCall(ts=t0 + timedelta(seconds=6), call_id="r", tool="read", status="running"))
    # Reported after the command ended, but it happened while it ran: still that command.
    assert shells.during(t0 + timedelta(seconds=4)) == ("a", "make")
    assert shells.during(t0 + timedelta(seconds=7)) == (None, None)
    shells.see(
        ToolCall(
            ts=t0 + timedelta(seconds=8), call_id="b", tool="bash", status="running", input={"command": "dd"}
        )
    )
    assert shells.during(t0 + timedelta(seconds=9)) == ("b", "dd")
