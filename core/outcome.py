"""Why an episode ended: pure functions from recorded facts to failures, an outcome and an exit code.

The episode collects facts (the cleanup receipt, the provider's OOM evidence, the harness's state,
the verifier's result, every failure with the stage it happened in) and asks this module what they
mean. Nothing here does I/O, so the table test in tests/core/test_outcome.py is the specification:

- ``agent_failure``: the receipt, evidence and harness state after the agent ran → at most one failure.
- ``verifier_verdict``: the verifier's exec result → a reward, or a failure and no reward.
- ``decide_outcome``: every recorded failure with the policy's decision → one ``Outcome``.
- ``exit_code``: the outcomes of a batch → the process's exit code.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.events import FaultKind, SandboxFault
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.failures import (
    DeadlineDetails,
    Decision,
    Evidence,
    FailureClass,
    FailureEvent,
    FailureStage,
    GenericDetails,
    OomDetails,
    OomVictim,
    Outcome,
    VerificationDetails,
)
from opencode_tui_core.runtime.supervisor_client import CleanupReceipt
from opencode_tui_core.sandbox.base import describe_exit
from opencode_tui_core.sandbox.faults import disk_full_seen
from opencode_tui_core.sandbox.oom import SOURCE_CGROUP, oom_evidence
from opencode_tui_core.sandbox.pids import pids_limit_hit


class RecordedFailure(BaseModel):
    """A failure as the episode recorded it: stamped with its stage, decided by the policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure: FailureEvent
    decision: Decision


# ---- the agent ----------------------------------------------------------------------------------


class AgentFacts(BaseModel):
    """What is known once the agent phase has closed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    receipt: CleanupReceipt | None
    evidence: list[Evidence] = Field(default_factory=list)
    finished_cleanly: bool = False
    last_error: str | None = None
    failed_model_call: FailureEvent | None = None
    # The harness's own account of a permission it asked for and had rejected (nobody can answer).
    permission_rejected: FailureEvent | None = None
    run_budget_s: float
    elapsed_s: float | None = None
    memory_limit_bytes: int | None = None
    # Kernel kills and a full disk the provider saw while the agent ran (``SandboxFault`` events).
    faults: list[SandboxFault] = Field(default_factory=list)


def _exit_words(receipt: CleanupReceipt) -> str:
    return describe_exit(receipt.return_code, receipt.signal, subject="OpenCode")


def agent_failure(facts: AgentFacts) -> FailureEvent | None:
    """At most one failure of the agent phase: the one below, or, when the agent failed (not by an
    OOM) and the sandbox's process limit refused a fork meanwhile, ``provider_pids_limit_reached``
    naming what it explains. A limit hit by a command the agent survived is no failure."""
    failure = _agent_failure(facts)
    if failure is None:
        return failure
    if failure.kind == "provider_oom_killed":
        return _with_kills(failure, facts.faults)
    disk = disk_full_failure(failure, facts)
    if disk is not None:
        return disk
    hit = pids_limit_hit(facts.evidence)
    if not hit:
        return failure
    limit = hit[0].data.get("pids_max")
    refused = hit[0].data["max_events"] - hit[0].data["max_events_baseline"]
    return FailureEvent(
        kind="provider_pids_limit_reached",
        stage=FailureStage.AGENT,
        operation=failure.operation,
        message=f"the sandbox reached its process limit ({limit if limit is not None else '?'}): "
        f"{refused} fork(s) refused; then {failure.message}",
        evidence=[*hit, *failure.evidence],
        details=GenericDetails(
            data={"pids_limit": limit, "forks_refused": refused, "explains": failure.kind}
        ),
    )


def _with_kills(failure: FailureEvent, faults: list[SandboxFault]) -> FailureEvent:
    """An OOM failure naming the processes the kernel killed, as the live watch saw them (process, pid,
    time); the evidence that confirmed it stays first."""
    kills = [f for f in faults if f.kind is FaultKind.OOM_KILL]
    if not kills:
        return failure
    named = [
        f"`{k.command[:100]}` (pid {k.pid}) at {k.ts:%H:%M:%S}" if k.command and k.pid is not None else None
        for k in kills
    ]
    said = "; killed: " + ", ".join(n for n in named if n) if any(named) else ""
    evidence = [ev for k in kills for ev in k.evidence if ev.source != SOURCE_CGROUP]
    return failure.model_copy(
        update={"message": failure.message + said, "evidence": [*failure.evidence, *evidence]}
    )


# What a full disk explains: OpenCode (or its supervisor) died or ended its turn early when writes failed.
_EXPLAINED_BY_DISK = frozenset({"agent_nonzero_exit", "agent_did_not_finish", "agent_bootstrap_failed"})


def disk_full_failure(failure: FailureEvent, facts: AgentFacts) -> FailureEvent | None:
    """``sandbox_disk_full`` when the sandbox's writable space was full (seen live, or at the close)
    and the agent failed in a way a failed write explains; model class when the agent's own shell
    command was running as it filled, else the table decides."""
    full = disk_full_seen(facts.evidence)
    live = [f for f in facts.faults if f.kind is FaultKind.DISK_FULL]
    if failure.kind not in _EXPLAINED_BY_DISK or not (full or live):
        return None
    first = live[0] if live else None
    limit = (full[0].data if full else first.evidence[0].data if first and first.evidence else {}).get(
        "limit_bytes"
    )
    during = f" while the agent ran `{first.tool_command[:100]}`" if first and first.tool_command else ""
    when = f" at {first.ts:%H:%M:%S}" if first else ""
    size = f" ({limit / (1 << 30):.2g} GiB limit)" if isinstance(limit, int) else ""
    return FailureEvent(
        kind="sandbox_disk_full",
        stage=FailureStage.AGENT,
        operation=failure.operation,
        message=f"the sandbox's writable space filled up{size}{when}{during}; then {failure.message}",
        evidence=[*full, *(ev for f in live for ev in f.evidence if ev not in full), *failure.evidence],
        details=GenericDetails(
            data={
                "limit_bytes": limit,
                "command": first.tool_command if first else None,
                "explains": failure.kind,
            }
        ),
        failure_class=FailureClass.MODEL if first is not None and first.tool_command else None,
    )


def _agent_failure(facts: AgentFacts) -> FailureEvent | None:
    """At most one failure of the agent phase, the process limit aside.

    Order matters: authoritative OOM evidence first (exit 137 alone is never evidence), then the
    observed deadline, then a failing model endpoint, then the harness's own exit.
    """
    receipt = facts.receipt
    confirming = oom_evidence(facts.evidence, scope=facts.evidence[0].scope if facts.evidence else None)
    if confirming:
        oom = confirming[0]
        if receipt is None:
            victim = OomVictim.UNKNOWN
        elif receipt.return_code == 0 and receipt.error is None and facts.finished_cleanly:
            victim = OomVictim.COMMAND
        else:
            victim = OomVictim.AGENT
        took = {
            OomVictim.COMMAND: "a command the agent ran; OpenCode survived and finished its turn",
            OomVictim.AGENT: "OpenCode or its supervisor",
            OomVictim.UNKNOWN: "a process (which one is unknown: no cleanup receipt)",
        }[victim]
        return FailureEvent(
            kind="provider_oom_killed",
            stage=FailureStage.AGENT,
            operation="run opencode",
            message=f"the kernel OOM-killed {took} (confirmed by {oom.source})",
            evidence=confirming,
            details=OomDetails(
                container_id=oom.scope,
                memory_limit_bytes=facts.memory_limit_bytes,
                exit_code=receipt.return_code if receipt else None,
                victim=victim,
            ),
            # An OOM that took the agent itself is the agent's failure, whatever the tables say.
            failure_class=FailureClass.MODEL if victim is OomVictim.AGENT else None,
        )
    if receipt is None:
        return None
    receipt_evidence = [Evidence(source="supervisor.receipt", scope=facts.run_id, data=receipt.model_dump())]
    if receipt.timed_out:
        return FailureEvent(
            kind="agent_timeout",
            stage=FailureStage.AGENT,
            operation="run opencode",
            message=f"the run deadline of {facts.run_budget_s:g}s fired; the supervisor stopped the agent "
            f"and drained {receipt.descendants_killed} descendant process(es)",
            details=DeadlineDetails(
                budget_s=facts.run_budget_s, elapsed_s=facts.elapsed_s, timed_out_observed=True
            ),
            evidence=receipt_evidence,
        )
    finished = facts.finished_cleanly
    if receipt.return_code == 0 and finished and receipt.error is None:
        return None
    if facts.failed_model_call is not None and (not finished or receipt.return_code != 0):
        return facts.failed_model_call
    detail = f": {facts.last_error}" if facts.last_error else ""
    if receipt.error:
        return FailureEvent(
            kind="agent_bootstrap_failed",
            stage=FailureStage.AGENT,
            operation="launch opencode",
            message=receipt.error,
            evidence=receipt_evidence,
        )
    if receipt.return_code != 0:
        return FailureEvent(
            kind="agent_nonzero_exit",
            stage=FailureStage.AGENT,
            operation="run opencode",
            message=_exit_words(receipt) + detail,
            evidence=receipt_evidence,
        )
    if facts.permission_rejected is not None:
        return facts.permission_rejected  # a rejected permission ended the turn: say which
    return FailureEvent(
        kind="agent_did_not_finish",
        stage=FailureStage.AGENT,
        operation="run opencode",
        message="OpenCode exited 0 without a finished assistant turn" + detail,
    )


# ---- the verifier -------------------------------------------------------------------------------


class VerifierRun(BaseModel):
    """The verifier's exec, as observed (``reward_text`` is the reward file's content, when read)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_code: int | None
    signal: int | None = None
    observed: bool
    deadline_fired: bool = False
    timeout_s: float
    duration_s: float | None = None
    output_excerpt: str = ""
    reward_file: str | None = None
    reward_text: str | None = None
    reward_error: str | None = None


class VerifierVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reward: float | None
    passed: bool | None
    failure: FailureEvent | None = None


def _verification_failure(
    kind: str, message: str, run: VerifierRun, *, details: DeadlineDetails | None = None
) -> FailureEvent:
    return FailureEvent(
        kind=kind,
        stage=FailureStage.VERIFICATION,
        operation="run verifier",
        message=message,
        details=details
        or VerificationDetails(exit_code=run.exit_code, output_excerpt=run.output_excerpt or None),
    )


def verifier_verdict(run: VerifierRun) -> VerifierVerdict:
    """A reward only from a verifier that ran to an observed exit; otherwise an inconclusive failure.

    A grading failure is never a reward: a verifier killed by a signal, whose exit was not observed,
    whose deadline fired, or whose reward file cannot be read gives ``reward=None`` and a failure.
    ``verifier_timeout`` only when its own deadline fired; an unobserved exit otherwise stays unknown.
    """
    if run.deadline_fired:
        return VerifierVerdict(
            reward=None,
            passed=None,
            failure=_verification_failure(
                "verifier_timeout",
                f"the verifier's deadline of {run.timeout_s:g}s fired before it finished",
                run,
                details=DeadlineDetails(
                    budget_s=run.timeout_s, elapsed_s=run.duration_s, timed_out_observed=True
                ),
            ),
        )
    if not run.observed:
        return VerifierVerdict(
            reward=None,
            passed=None,
            failure=_verification_failure(
                "verifier_unknown_exit",
                "the verifier's exit was not observed (its deadline did not fire); its result is unknown",
                run,
            ),
        )
    if run.exit_code is None or run.signal is not None:
        return VerifierVerdict(
            reward=None,
            passed=None,
            failure=_verification_failure(
                "verifier_error",
                f"the verifier was killed by signal {run.signal}"
                if run.signal is not None
                else "the verifier ended without an exit code",
                run,
            ),
        )
    passed = run.exit_code == 0
    if run.reward_file is None:
        return VerifierVerdict(reward=1.0 if passed else 0.0, passed=passed)
    reward: float | None = None
    problem = run.reward_error
    if problem is None:
        try:
            reward = float((run.reward_text or "").strip())
        except ValueError:
            problem = f"not a number: {(run.reward_text or '')[:80]!r}"
    if reward is None:
        return VerifierVerdict(
            reward=None,
            passed=passed,
            failure=_verification_failure(
                "verification_inconclusive",
                f"the reward file {run.reward_file} could not be read ({problem})",
                run,
            ),
        )
    return VerifierVerdict(reward=reward, passed=passed)


# ---- the outcome --------------------------------------------------------------------------------


class EpisodeFacts(BaseModel):
    """Everything the outcome depends on, as recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failures: list[RecordedFailure] = Field(default_factory=list)
    refusal: str | None = None
    reward: float | None = None
    cleanup_confirmed: bool | None = None
    cancelled_by: str | None = None  # "user", "caller" or a signal name, when the run was cancelled


class Verdict(BaseModel):
    """The one outcome of an episode, the failure that decided it (if any), and its exit code."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    outcome: Outcome
    reward: float | None
    deciding: RecordedFailure | None = None
    # Warning-class failures that did not decide (an optional artifact lost; the reward stands).
    warnings: list[RecordedFailure] = Field(default_factory=list)
    summary: str
    exit_code: ExitCode


# Kinds that explain the failures recorded around them: the engine under the sandbox went away, so
# the commands that went through it failed with it (their failures stay recorded, as symptoms).
ROOT_CAUSE_KINDS = frozenset({"sandbox_engine_lost"})


def primary_failure(failures: Iterable[RecordedFailure], *, graded: bool = False) -> RecordedFailure | None:
    """The failure that decides the outcome: a root cause (``ROOT_CAUSE_KINDS``), else the first not
    about closing the sandbox, else the first. When the verifier ``graded`` the episode, a warning
    (an optional artifact's failure, ``Decision.warning``) never decides: the reward stands."""
    items = [r for r in failures if not (graded and r.decision.warning)]
    for item in items:
        if item.failure.kind in ROOT_CAUSE_KINDS:
            return item
    for item in items:
        if not item.failure.stage.after_agent_cleanup:
            return item
    return items[0] if items else None


def decide_outcome(facts: EpisodeFacts) -> Verdict:
    """One outcome from the recorded facts (precedence: a failure → a refusal → the verifier's reward)."""
    deciding = primary_failure(facts.failures, graded=facts.reward is not None)
    warnings = [r for r in facts.failures if r.decision.warning and r is not deciding]
    if deciding is not None:
        failure, decision = deciding.failure, deciding.decision
        outcome = Outcome(decision.action.value)
        reward = 0.0 if outcome is Outcome.COUNT_AS_ZERO else None
        summary = f"{failure.kind} ({failure.stage.value}, class {decision.failure_class.value}) → {outcome}"
    elif facts.refusal is not None:
        outcome, reward = Outcome.REFUSED, None
        summary = f"refused by the provider before launch: {facts.refusal}"
    elif facts.reward is not None:
        outcome, reward = Outcome.SCORED, facts.reward
        summary = f"scored: reward {facts.reward:g}"
        if warnings:
            summary += "; warning: " + "; ".join(f"{r.failure.kind} ({r.failure.message})" for r in warnings)
    else:
        # Nothing failed and nothing was graded: there is no sample to report.
        outcome, reward = Outcome.KEEP_UNKNOWN, None
        summary = "no failure was recorded, but the verifier produced no reward"
    return Verdict(
        outcome=outcome,
        reward=reward,
        deciding=deciding,
        warnings=warnings,
        summary=summary,
        exit_code=_episode_exit_code(outcome, facts),
    )


def _episode_exit_code(outcome: Outcome, facts: EpisodeFacts) -> ExitCode:
    cancelled = [r for r in facts.failures if r.failure.kind == "run_cancelled"]
    if facts.cancelled_by is not None or cancelled:
        return ExitCode.for_cancel(facts.cancelled_by)
    cleanup_confirmed = facts.cleanup_confirmed
    if outcome is Outcome.REFUSED:
        return ExitCode.USAGE  # the provider refused the request as configured: nothing ran
    if cleanup_confirmed is False:
        return ExitCode.CLEANUP_UNCONFIRMED
    if not outcome.is_sample:
        return ExitCode.INFRA
    if outcome is Outcome.COUNT_AS_ZERO:
        return ExitCode.MODEL_FAILURE
    return ExitCode.OK


def exit_code(codes: Iterable[ExitCode | int], *, cancelled_by: str | None = None) -> ExitCode:
    """A batch's exit code: the most severe of its episodes' (a cancel's signal first)."""
    if cancelled_by is not None:
        return ExitCode.for_cancel(cancelled_by)
    worst = ExitCode.OK
    for code in codes:
        code = ExitCode(code)
        if code.severity > worst.severity:
            worst = code
    return worst
