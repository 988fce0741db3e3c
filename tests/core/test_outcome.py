"""The outcome table: the specification of why an episode ended.

Each row is a set of recorded facts (the cleanup receipt, the provider's structured evidence, the
harness's state, the verifier's result, failures other phases recorded with their stage) and the one
outcome they must give: the outcome word, the reward, the deciding failure kind, stage and rule, and
the process exit code. The functions under test are pure; the same facts always give the same outcome.
The rows named after sample tasks state each sample's expected outcome as the end-to-end tests see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from opencode_tui_core.calls.progress import NoProgress
from opencode_tui_core.calls.records import AnswerFault, ModelCallRecord, answer_fault_error
from opencode_tui_core.events import FaultKind, SandboxFault
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.failures import (
    DEFAULT_CLASSIFICATION,
    DEFAULT_POLICY,
    Action,
    Evidence,
    FailureEvent,
    FailureStage,
    GenericDetails,
    ModelCallDetails,
    OutcomePolicyOverrides,
    decide,
    merged,
)
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.model.endpoint import failure_from_record
from opencode_tui_core.outcome import (
    AgentFacts,
    EpisodeFacts,
    Outcome,
    RecordedFailure,
    VerifierRun,
    agent_failure,
    decide_outcome,
    exit_code,
    verifier_verdict,
)
from opencode_tui_core.runtime.supervisor_client import CleanupReceipt

SCOPE = "c0ffee"


def receipt(rc: int | None = 0, **kw) -> CleanupReceipt:
    return CleanupReceipt(cleanup_confirmed=True, return_code=rc, **kw)


def cgroup_oom(count: int = 1, baseline: int = 0) -> Evidence:
    return Evidence(
        source="cgroup.memory", scope=SCOPE, data={"oom_kill": count, "oom_kill_baseline": baseline}
    )


def cgroup_pids(count: int = 3, baseline: int = 0) -> Evidence:
    return Evidence(
        source="cgroup.pids",
        scope=SCOPE,
        data={"pids_max": 1024, "pids_current": 1024, "max_events": count, "max_events_baseline": baseline},
    )


def disk_full(seen_live: bool = True) -> Evidence:
    """The local provider's ``sandbox.disk`` piece at the close: the space now, and whether the live
    watch saw it full."""
    data = {"limit_bytes": 1 << 30, "free_bytes": 0, "full": True}
    data["full_seen_at"] = "2026-12-02T04:00:05+00:00" if seen_live else None
    return Evidence(source="sandbox.disk", scope=SCOPE, data=data)


def live_fault(kind: FaultKind, *, tool_command: str | None = None, **kw) -> SandboxFault:
    return SandboxFault(kind=kind, source="test", message=str(kind), tool_command=tool_command, **kw)


def model_500() -> FailureEvent:
    return FailureEvent(
        kind="model_server_error",
        stage=FailureStage.AGENT,
        operation="model call",
        message="the model endpoint answered 500",
        http_status=500,
        details=ModelCallDetails(call_id="c1", status=500),
    )


def empty_200() -> FailureEvent:
    """What the proxy's record of an empty 200 stream stands for (opencode_tui_core.model.endpoint)."""
    rec = ModelCallRecord(
        call_id="c9",
        method="POST",
        path="/v1/chat/completions",
        status=200,
        started_at=utcnow(),
        answer_fault=AnswerFault.EMPTY_BODY,
        error=answer_fault_error(200, AnswerFault.EMPTY_BODY),
    )
    return failure_from_record(rec, FailureStage.AGENT)


def failure(kind: str, stage: FailureStage, **kw) -> FailureEvent:
    return FailureEvent(kind=kind, stage=stage, operation="test", message=kind, **kw)


def verifier(exit_code: int | None = 0, **kw) -> VerifierRun:
    kw.setdefault("observed", exit_code is not None)
    return VerifierRun(exit_code=exit_code, timeout_s=30, **kw)


@dataclass
class Row:
    """Facts in, outcome out."""

    agent: AgentFacts | None = None
    verifier: VerifierRun | None = None
    before: list[FailureEvent] = field(default_factory=list)  # seed/install failures, stamped
    after: list[FailureEvent] = field(default_factory=list)  # closing/transcript/release failures
    refusal: str | None = None
    cleanup_confirmed: bool | None = True
    cancelled_by: str | None = None
    attempt: int = 1
    policy: dict | None = None
    # expected
    outcome: Outcome = Outcome.SCORED
    reward: float | None = None
    kind: str | None = None
    stage: str | None = None
    rule: str | None = None
    exit: ExitCode = ExitCode.OK


def agent(**kw) -> AgentFacts:
    kw.setdefault("receipt", receipt())
    kw.setdefault("finished_cleanly", True)
    return AgentFacts(run_id="r1", run_budget_s=600, **kw)


def judge(row: Row):
    """Compose the pure functions the way the episode calls them, in its order."""
    policy = merged(DEFAULT_POLICY, OutcomePolicyOverrides.model_validate(row.policy or {}))
    recorded = []

    def record(f: FailureEvent) -> None:
        d = decide(f, attempt=row.attempt, policy=policy, classification=DEFAULT_CLASSIFICATION)
        recorded.append(RecordedFailure(failure=f, decision=d))

    for f in row.before:
        record(f)
    if row.agent is not None:
        f = agent_failure(row.agent)
        if f is not None:
            record(f)
    for f in row.after:
        record(f)
    reward = None
    if row.verifier is not None:
        verdict = verifier_verdict(row.verifier)
        reward = verdict.reward
        if verdict.failure is not None:
            record(verdict.failure)
    return decide_outcome(
        EpisodeFacts(
            failures=recorded,
            refusal=row.refusal,
            reward=reward,
            cleanup_confirmed=row.cleanup_confirmed,
            cancelled_by=row.cancelled_by,
        )
    )


ROWS: dict[str, Row] = {
    # ---- the sample tasks -------------------------------------------------------------------
    "sample hello-file / fix-bug / swe-style / long-context / model-flaky-429": Row(
        agent=agent(), verifier=verifier(0), reward=1.0
    ),
    "sample oom: a command OOM-killed, OpenCode survived, verifier passed → the named rule": Row(
        agent=agent(evidence=[cgroup_oom()]),
        verifier=verifier(0),
        outcome=Outcome.COUNT_AS_ZERO,
        reward=0.0,
        kind="provider_oom_killed",
        stage="agent",
        rule="oom_survived",
        exit=ExitCode.MODEL_FAILURE,
    ),
    "process limit hit and OpenCode failed → the limit explains it: the agent's doing": Row(
        agent=agent(evidence=[cgroup_pids()], receipt=receipt(1), finished_cleanly=False),
        verifier=verifier(1),
        outcome=Outcome.COUNT_AS_ZERO,
        reward=0.0,
        kind="provider_pids_limit_reached",
        stage="agent",
        rule="provider_pids_limit_reached@agent",
        exit=ExitCode.MODEL_FAILURE,
    ),
    "process limit hit by a command OpenCode survived: no failure, the verifier decides": Row(
        agent=agent(evidence=[cgroup_pids()]),
        verifier=verifier(0),
        reward=1.0,
    ),
    "refused-fork counter not above its baseline (borrowed): not evidence": Row(
        agent=agent(evidence=[cgroup_pids(3, 3)], receipt=receipt(1), finished_cleanly=False),
        verifier=verifier(1),
        outcome=Outcome.KEEP_UNKNOWN,
        kind="agent_nonzero_exit",
        stage="agent",
        rule="unknown",
        exit=ExitCode.INFRA,
    ),
    "sample disk-full: the agent's dd filled the disk and OpenCode died → sandbox_disk_full, the agent's doing": Row(
        agent=agent(
            evidence=[disk_full()],
            faults=[live_fault(FaultKind.DISK_FULL, tool_command="dd if=/dev/zero of=big bs=1M count=3072")],
            receipt=receipt(1),
            finished_cleanly=False,
        ),
        verifier=verifier(1),
        outcome=Outcome.COUNT_AS_ZERO,
        reward=0.0,
        kind="sandbox_disk_full",
        stage="agent",
        rule="model",
        exit=ExitCode.MODEL_FAILURE,
    ),
    "disk full with no command of the agent's running (seen at the close only) → sandbox_disk_full, unknown": Row(
        agent=agent(evidence=[disk_full(seen_live=False)], receipt=receipt(1), finished_cleanly=False),
        verifier=verifier(1),
        outcome=Outcome.KEEP_UNKNOWN,
        kind="sandbox_disk_full",
        stage="agent",
        rule="unknown",
        exit=ExitCode.INFRA,
    ),
    "disk full, OpenCode survived and finished its turn: no failure, the verifier decides": Row(
        agent=agent(evidence=[disk_full()], faults=[live_fault(FaultKind.DISK_FULL, tool_command="dd")]),
        verifier=verifier(0),
        reward=1.0,
    ),
    "sample exit-137: SIGKILL without memory pressure is not an OOM": Row(
        agent=agent(evidence=[cgroup_oom(count=0)]), verifier=verifier(0), reward=1.0
    ),
    "sample model-flaky-500, attempt 1: retried": Row(
        agent=agent(receipt=receipt(1), finished_cleanly=False, failed_model_call=model_500()),
        outcome=Outcome.RETRY,
        kind="model_server_error",
        stage="agent",
        rule="5xx",
        exit=ExitCode.INFRA,
    ),
    "sample model-flaky-500, last attempt: an evaluation error": Row(
        agent=agent(receipt=receipt(1), finished_cleanly=False, failed_model_call=model_500()),
        attempt=3,
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="model_server_error",
        stage="agent",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    # issue 32: the endpoint answers HTTP 200 with nothing, call after call; the episode stopped the agent
    # itself (no agent judgement, no grade): the endpoint is broken, the model is not judged.
    "no progress: empty model answers in a row stopped the agent → an evaluation error": Row(
        before=[
            NoProgress(
                limit="consecutive", count=5, calls_seen=6, call_ids=[f"mc-{n}" for n in range(2, 7)]
            ).to_failure()
        ],
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="model_empty_response",
        stage="agent",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "OpenCode gave up on an empty 200 (its last call) → model_empty_response, not a stall": Row(
        agent=agent(receipt=receipt(1), finished_cleanly=False, failed_model_call=empty_200()),
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="model_empty_response",
        stage="agent",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "sample timeout: the run deadline fired": Row(
        agent=agent(receipt=receipt(None, timed_out=True, descendants_killed=2), finished_cleanly=False),
        verifier=verifier(0),
        outcome=Outcome.COUNT_AS_ZERO,
        reward=0.0,
        kind="agent_timeout",
        stage="agent",
        rule="agent_timeout@agent",
        exit=ExitCode.MODEL_FAILURE,
    ),
    # ---- 1. stage-correct failures -----------------------------------------------------------
    "OOM during verification (stamped by the episode) is inconclusive, never a reward": Row(
        agent=agent(),
        after=[failure("provider_oom_killed", FailureStage.VERIFICATION)],
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="provider_oom_killed",
        stage="verification",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "sandbox lost during verification is inconclusive": Row(
        agent=agent(),
        after=[failure("sandbox_lost", FailureStage.VERIFICATION)],
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="sandbox_lost",
        stage="verification",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "seed-phase OOM, first attempt: a bounded retry": Row(
        before=[failure("provider_oom_killed", FailureStage.SEED)],
        outcome=Outcome.RETRY,
        kind="provider_oom_killed",
        stage="seed",
        rule="provider_oom_killed@seed",
        exit=ExitCode.INFRA,
    ),
    "seed-phase OOM, second attempt: retries (1) used up → evaluation error": Row(
        before=[failure("provider_oom_killed", FailureStage.SEED)],
        attempt=2,
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="provider_oom_killed",
        stage="seed",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "an OOM that took OpenCode itself is always the agent's (model class)": Row(
        agent=agent(evidence=[cgroup_oom()], receipt=receipt(137, signal=9), finished_cleanly=False),
        policy={"failure_class": {"model": "count_as_zero"}, "kind": {"provider_oom_killed@agent": "stop"}},
        outcome=Outcome.STOP,
        kind="provider_oom_killed",
        stage="agent",
        rule="provider_oom_killed@agent",
        exit=ExitCode.INFRA,
    ),
    # ---- 2./3. grading failures are never scored ---------------------------------------------
    "verifier killed by a signal: not scored": Row(
        agent=agent(),
        verifier=verifier(None, signal=9, observed=True),
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="verifier_error",
        stage="verification",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "verifier's own deadline fired: verifier_timeout": Row(
        agent=agent(),
        verifier=verifier(None, observed=False, deadline_fired=True),
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="verifier_timeout",
        stage="verification",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "verifier exit not observed, no deadline: unknown, not a timeout": Row(
        agent=agent(),
        verifier=verifier(None, observed=False),
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="verifier_unknown_exit",
        stage="verification",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "unreadable reward file: inconclusive, reward null": Row(
        agent=agent(),
        verifier=verifier(0, reward_file="reward.txt", reward_error="FileNotFoundError"),
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="verification_inconclusive",
        stage="verification",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    "reward file with a fraction": Row(
        agent=agent(), verifier=verifier(1, reward_file="reward.txt", reward_text="0.5\n"), reward=0.5
    ),
    "a failing verifier is a real zero": Row(agent=agent(), verifier=verifier(1), reward=0.0),
    "a policy that would count a grading failure as zero is overruled": Row(
        agent=agent(),
        verifier=verifier(None, signal=9, observed=True),
        policy={"kind": {"verifier_error": "count_as_zero"}},
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="verifier_error",
        stage="verification",
        rule="grading_never_scored",
        exit=ExitCode.INFRA,
    ),
    # ---- 4./5. OOM only from structured evidence, and its named rule -------------------------
    "text about memory is not evidence (no structured flag)": Row(
        agent=agent(
            evidence=[
                Evidence(
                    source="opensandbox.lifecycle",
                    scope=SCOPE,
                    data={"reason": "Error", "message": "npm ERR! JavaScript heap out of memory"},
                )
            ]
        ),
        verifier=verifier(0),
        reward=1.0,
    ),
    "the survived-OOM rule can be set to keep the sample out": Row(
        agent=agent(evidence=[cgroup_oom()]),
        verifier=verifier(0),
        policy={"oom_survived": "keep_unknown"},
        outcome=Outcome.KEEP_UNKNOWN,
        kind="provider_oom_killed",
        stage="agent",
        rule="oom_survived",
        exit=ExitCode.INFRA,
    ),
    # ---- the harness's exit, in words ----------------------------------------------------------
    "OpenCode's exit not observed: unknown, never 'None'": Row(
        agent=agent(receipt=receipt(None), finished_cleanly=False),
        outcome=Outcome.KEEP_UNKNOWN,
        kind="agent_nonzero_exit",
        stage="agent",
        rule="unknown",
        exit=ExitCode.INFRA,
    ),
    "a rejected permission ended the turn: its own kind, model class": Row(
        agent=agent(
            finished_cleanly=False,
            permission_rejected=failure("agent_permission_rejected", FailureStage.AGENT),
        ),
        verifier=verifier(1),
        outcome=Outcome.COUNT_AS_ZERO,
        reward=0.0,
        kind="agent_permission_rejected",
        stage="agent",
        rule="model",
        exit=ExitCode.MODEL_FAILURE,
    ),
    # ---- cleanup, refusal, cancel, nothing -----------------------------------------------------
    "cleanup unconfirmed alone: unknown, exit 4": Row(
        after=[failure("cleanup_unconfirmed", FailureStage.CLOSING)],
        cleanup_confirmed=False,
        outcome=Outcome.KEEP_UNKNOWN,
        kind="cleanup_unconfirmed",
        stage="closing",
        rule="cleanup_unconfirmed",
        exit=ExitCode.CLEANUP_UNCONFIRMED,
    ),
    "the agent's failure decides over a later transcript failure": Row(
        agent=agent(receipt=receipt(None, timed_out=True), finished_cleanly=False),
        after=[failure("transcript_export_failed", FailureStage.TRANSCRIPT)],
        outcome=Outcome.COUNT_AS_ZERO,
        reward=0.0,
        kind="agent_timeout",
        stage="agent",
        rule="agent_timeout@agent",
        exit=ExitCode.MODEL_FAILURE,
    ),
    # ---- issue 25: a lost snapshot never costs a verified reward; an OOM keeps its precedence ------
    "verified reward 1 and a failed transcript snapshot: the reward stands, the failure is a warning": Row(
        agent=agent(),
        after=[failure("transcript_export_failed", FailureStage.TRANSCRIPT)],
        verifier=verifier(0),
        reward=1.0,
    ),
    "a failed transcript snapshot and a verifier that graded 0: a real zero": Row(
        agent=agent(),
        after=[failure("transcript_export_failed", FailureStage.TRANSCRIPT)],
        verifier=verifier(1),
        reward=0.0,
    ),
    "a failed transcript snapshot and nothing graded: the warning is all there is": Row(
        agent=agent(),
        after=[failure("transcript_export_failed", FailureStage.TRANSCRIPT)],
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="transcript_export_failed",
        stage="transcript",
        rule="evaluation",
        exit=ExitCode.INFRA,
    ),
    # ---- issue 39: every failure of the transcript phase is a warning, under the provider's kind too --
    "verified reward 1 and a download of OpenCode's data that timed out (504): the reward stands": Row(
        agent=agent(),
        after=[failure("provider_io_timeout", FailureStage.TRANSCRIPT, http_status=504)],
        verifier=verifier(0),
        reward=1.0,
    ),
    "verified reward 1 and a download that found no file: the reward stands": Row(
        agent=agent(),
        after=[failure("sandbox_file_failed", FailureStage.TRANSCRIPT)],
        verifier=verifier(0),
        reward=1.0,
    ),
    "a download that timed out and nothing graded: the warning decides by its status (retry)": Row(
        agent=agent(),
        after=[failure("provider_io_timeout", FailureStage.TRANSCRIPT, http_status=504)],
        outcome=Outcome.RETRY,
        kind="provider_io_timeout",
        stage="transcript",
        rule="5xx",
        exit=ExitCode.INFRA,
    ),
    "an OOM seen through a 502 status poll: counted by its kind, never retried for the 502": Row(
        before=[failure("provider_oom_killed", FailureStage.AGENT, http_status=502)],
        outcome=Outcome.COUNT_AS_ZERO,
        reward=0.0,
        kind="provider_oom_killed",
        stage="agent",
        rule="provider_oom_killed@agent",
        exit=ExitCode.MODEL_FAILURE,
    ),
    "refused by the provider before launch": Row(
        refusal="no such sandbox", outcome=Outcome.REFUSED, exit=ExitCode.USAGE
    ),
    "cancelled by SIGTERM during verification: 143, never a grade": Row(
        agent=agent(),
        before=[
            failure(
                "run_cancelled",
                FailureStage.VERIFICATION,
                details=GenericDetails(data={"by": "SIGTERM", "phase": "verification"}),
            )
        ],
        cancelled_by="SIGTERM",
        outcome=Outcome.STOP,
        kind="run_cancelled",
        stage="verification",
        rule="run_cancelled",
        exit=ExitCode.TERMINATED,
    ),
    "cancelled during the agent": Row(
        before=[failure("run_cancelled", FailureStage.AGENT)],
        outcome=Outcome.STOP,
        kind="run_cancelled",
        stage="agent",
        rule="run_cancelled",
        exit=ExitCode.INTERRUPTED,
    ),
    # ---- issue 19: the engine under the sandbox went away -----------------------------------------
    "engine lost mid-agent, found dead: retried, cleanup proven (no receipt)": Row(
        before=[failure("command_status_lost", FailureStage.AGENT)],  # the exec's stream broke first
        after=[failure("sandbox_engine_lost", FailureStage.AGENT)],  # the root cause decides
        outcome=Outcome.RETRY,
        kind="sandbox_engine_lost",
        stage="agent",
        rule="sandbox_engine_lost",
        exit=ExitCode.INFRA,
    ),
    "engine lost and never back: unconfirmed cleanup, exit 4": Row(
        after=[
            failure("sandbox_engine_lost", FailureStage.AGENT),
            failure("cleanup_unconfirmed", FailureStage.CLOSING),
        ],
        cleanup_confirmed=False,
        attempt=3,
        outcome=Outcome.MARK_EVALUATION_ERROR,
        kind="sandbox_engine_lost",
        stage="agent",
        rule="evaluation",
        exit=ExitCode.CLEANUP_UNCONFIRMED,
    ),
    "nothing failed and nothing was graded: no sample": Row(
        agent=agent(), outcome=Outcome.KEEP_UNKNOWN, exit=ExitCode.INFRA
    ),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_outcome_table(name: str) -> None:
    row = ROWS[name]
    verdict = judge(row)
    deciding = verdict.deciding
    got = (
        verdict.outcome,
        verdict.reward,
        deciding.failure.kind if deciding else None,
        deciding.failure.stage.value if deciding else None,
        deciding.decision.rule if deciding else None,
        verdict.exit_code,
    )
    assert got == (row.outcome, row.reward, row.kind, row.stage, row.rule, row.exit)
    assert verdict.outcome.is_sample == (verdict.reward is not None)


def test_a_lost_snapshot_is_a_warning_in_the_verdict_and_its_summary() -> None:
    verdict = judge(ROWS[next(n for n in ROWS if n.startswith("verified reward 1 and a failed transcript"))])
    [warning] = verdict.warnings
    assert warning.decision.warning and warning.failure.kind == "transcript_export_failed"
    assert "warning: transcript_export_failed" in verdict.summary


def test_decisions_name_what_decided_them_in_words() -> None:
    from opencode_tui_core.failures import describe_decision
    from opencode_tui_core.failures.model import OomDetails, OomVictim

    survived = decide(
        failure("provider_oom_killed", FailureStage.AGENT, details=OomDetails(victim=OomVictim.COMMAND))
    )
    assert describe_decision(survived).startswith("rule 'oom_survived': the kernel OOM-killed a command")
    assert "rule rule" not in describe_decision(survived)
    assert describe_decision(decide(model_500())) == "HTTP status '5xx'"
    last = decide(model_500(), attempt=3)
    assert describe_decision(last) == "class 'evaluation' (retries exhausted)"


def test_unobserved_exit_is_said_in_words() -> None:
    f = agent_failure(agent(receipt=receipt(None), finished_cleanly=False))
    assert f is not None and "None" not in f.message
    assert "OpenCode's exit was not observed" in f.message


def test_oom_victim_named_in_the_failure() -> None:
    survived = agent_failure(agent(evidence=[cgroup_oom()]))
    died = agent_failure(agent(evidence=[cgroup_oom()], receipt=receipt(137), finished_cleanly=False))
    assert survived.details.victim == "command" and survived.failure_class is None
    assert died.details.victim == "agent" and died.failure_class == "model"
    assert "survived" in survived.message


def test_an_oom_failure_names_the_process_the_live_watch_saw_killed() -> None:
    kill = live_fault(
        FaultKind.OOM_KILL,
        pid=57,
        command="python3 -c 'blocks = [bytearray(64 << 20) for _ in range(64)]'",
        evidence=[Evidence(source="kernel.log", scope=SCOPE, data={"pid": 57, "host_pid": 4242})],
    )
    f = agent_failure(agent(evidence=[cgroup_oom()], faults=[kill]))
    assert f is not None and f.kind == "provider_oom_killed"
    assert "(pid 57)" in f.message and "bytearray" in f.message
    assert [e.source for e in f.evidence] == ["cgroup.memory", "kernel.log"]  # the confirming piece first


def test_batch_exit_code_is_the_most_severe() -> None:
    assert exit_code([]) is ExitCode.OK
    assert exit_code([ExitCode.OK, ExitCode.MODEL_FAILURE]) is ExitCode.MODEL_FAILURE
    assert exit_code([ExitCode.MODEL_FAILURE, ExitCode.INFRA]) is ExitCode.INFRA
    assert exit_code([ExitCode.INFRA, ExitCode.CLEANUP_UNCONFIRMED]) is ExitCode.CLEANUP_UNCONFIRMED
    assert exit_code([ExitCode.CLEANUP_UNCONFIRMED, ExitCode.USAGE]) is ExitCode.USAGE
    assert exit_code([ExitCode.USAGE, ExitCode.INTERRUPTED]) is ExitCode.INTERRUPTED
    assert exit_code([ExitCode.OK], cancelled_by="SIGINT") is ExitCode.INTERRUPTED
    assert exit_code([ExitCode.OK], cancelled_by="SIGTERM") is ExitCode.TERMINATED
    assert exit_code([ExitCode.OK], cancelled_by="SIGHUP") is ExitCode.HANGUP


def test_retry_limit_is_per_rule_and_validated() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        OutcomePolicyOverrides.model_validate({"max_retries": {"provider_oom_killed@seed": -1}})
    policy = merged(
        DEFAULT_POLICY,
        OutcomePolicyOverrides.model_validate({"max_retries": {"provider_oom_killed@seed": 2}}),
    )
    f = failure("provider_oom_killed", FailureStage.SEED)
    assert [decide(f, attempt=a, policy=policy).action for a in (1, 2, 3)] == [
        Action.RETRY,
        Action.RETRY,
        Action.MARK_EVALUATION_ERROR,
    ]
