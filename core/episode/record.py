"""What an episode leaves behind: its result (the batch JSON line), run.json's outcome and counts,
and diagnostics.txt. The outcome itself is ``opencode_tui_core.outcome.decide_outcome``, a pure function."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.artifacts import OutcomeSummary, RunDir, RunInfo
from opencode_tui_core.events import (
    CleanupProof,
    Event,
    OutcomeDecided,
    Warning_,
)
from opencode_tui_core.failure_groups import evidence_signature
from opencode_tui_core.failures import Outcome
from opencode_tui_core.outcome import RecordedFailure, Verdict
from opencode_tui_core.tally import Tally


class EpisodeResult(BaseModel):
    """One episode's result; also the batch JSON line."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    task_id: str
    attempt: int
    # The batch that ran this attempt (its sandbox carries it: ``sweep --batch``); None outside a batch.
    batch_id: str | None = None
    provider: str
    sandbox_id: str | None = None
    reward: float | None = None
    action: Outcome
    failure_kind: str | None = None
    failure_stage: str | None = None
    failure_class: str | None = None
    # The deciding failure's evidence in a few words (opencode_tui_core.failure_groups): how failures are grouped.
    failure_evidence: str | None = None
    cleanup_confirmed: bool | None = None
    cleanup_proof: CleanupProof | None = None
    cancelled_by: str | None = None
    model_calls: int = 0
    model_calls_failed: int = 0  # no response, HTTP >= 400, or a 2xx that was no answer or broke
    tool_calls: int = 0
    compactions: int = 0
    # tokens: every model call the proxy recorded (title included); agent tokens: the transcript's.
    # Unknown is null, never 0.
    tokens_in: int | None = None
    tokens_out: int | None = None
    agent_tokens_in: int | None = None
    agent_tokens_out: int | None = None
    exit_code: int = 0
    durations_s: dict[str, float] = Field(default_factory=dict)
    run_dir: str
    summary: str = ""
    previous_attempts: list[str] = Field(default_factory=list)
    resumed: bool = False
    started: bool = True  # false: a queued episode a cancelled batch never started
    human_intervened: bool = False  # a person used a shell or the debugger before verification finished
    interventions: int = 0  # the debugger's Intervention events (issue 27): breaks and acts
    # Replies a person wrote at a breakpoint: the model never saw these calls (no tokens of theirs).
    model_calls_answered: int = 0
    model_calls_edited: int = 0  # the model answered, a person edited the reply (issue 27)
    artifacts_error: str | None = None  # the run directory stopped taking writes: what and why
    sandbox_kept: bool = False
    # The sandbox was prepared ahead by the batch's warm pool (the attempt's WarmSandbox event says when).
    warm: bool = False
    health: dict[str, int] = Field(default_factory=dict)  # episode-health warnings by kind (core/health.py)
    # Limits asked for that the provider did not enforce (``limits.enforce: warn`` ran anyway).
    unenforced_limits: list[str] = Field(default_factory=list)
    # Failures recorded as warnings that did not decide (an optional artifact lost; the reward stands).
    warnings: list[str] = Field(default_factory=list)

    @property
    def scored(self) -> bool:
        return self.action.is_sample


def new_run_id(task_id: str, attempt: int = 1) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{task_id}-{stamp}-{uuid.uuid4().hex[:6]}-a{attempt}"


def outcome_event(verdict: Verdict) -> OutcomeDecided:
    deciding = verdict.deciding
    failure = deciding.failure if deciding else None
    return OutcomeDecided(
        action=verdict.outcome,
        reward=verdict.reward,
        failure_kind=failure.kind if failure else None,
        failure_class=deciding.decision.failure_class if deciding else None,
        summary=verdict.summary,
        evidence=list(failure.evidence) if failure else [],
    )


def result_of(verdict: Verdict, tally: Tally, **fields: object) -> EpisodeResult:
    """The result line: the verdict, the deciding failure, the counts, and the episode's ``fields``."""
    deciding = verdict.deciding
    tokens = tally.tokens
    # Validated like the constructor: the episode's fields are checked against the model, not the call.
    return EpisodeResult.model_validate(
        {
            "reward": verdict.reward,
            "action": verdict.outcome,
            "failure_kind": deciding.failure.kind if deciding else None,
            "failure_stage": deciding.failure.stage.value if deciding else None,
            "failure_class": deciding.decision.failure_class.value if deciding else None,
            "failure_evidence": evidence_signature(deciding.failure.evidence) if deciding else None,
            "model_calls": len(tally.model_calls),
            "model_calls_failed": sum(1 for c in tally.model_calls if c.failed),
            "model_calls_answered": sum(1 for c in tally.model_calls if c.answered_by),
            "model_calls_edited": sum(1 for c in tally.model_calls if c.edited_by),
            "tool_calls": tally.tool_call_count,
            "compactions": tally.compactions,
            "tokens_in": tokens.tokens_in,
            "tokens_out": tokens.tokens_out,
            "agent_tokens_in": tally.agent_tokens_in,
            "agent_tokens_out": tally.agent_tokens_out,
            "exit_code": verdict.exit_code,
            "summary": verdict.summary,
            "unenforced_limits": list(tally.unenforced_limits),
            "warnings": [r.failure.kind for r in verdict.warnings],
            **fields,
        }
    )


def write_record(
    run_dir: RunDir,
    info: RunInfo,
    result: EpisodeResult,
    tally: Tally,
    failures: list[RecordedFailure],
    diagnostic_files: tuple[str, ...],
    emit: Callable[[Event], object],
) -> None:
    """run.json's outcome and counts, diagnostics.txt; then the run directory is closed."""
    info.ended_at = datetime.now(UTC)
    info.phase_durations_s = dict(result.durations_s)
    info.outcome = OutcomeSummary(
        action=result.action,
        reward=result.reward,
        failure_kind=result.failure_kind,
        failure_stage=result.failure_stage,
        failure_class=result.failure_class,
        summary=result.summary,
    )
    info.counts = {
        "model_calls": result.model_calls,
        "model_calls_failed": result.model_calls_failed,
        "model_calls_answered_by_person": result.model_calls_answered,
        "model_calls_edited_by_person": result.model_calls_edited,
        "tool_calls": tally.tool_calls,
        "compactions": result.compactions,
        "cleanup_confirmed": result.cleanup_confirmed,
        "cleanup_proof": result.cleanup_proof,
        "cancelled_by": result.cancelled_by,
        "tokens_in": result.tokens_in,
        "tokens_out": result.tokens_out,
        "agent_tokens_in": result.agent_tokens_in,
        "agent_tokens_out": result.agent_tokens_out,
        "health": result.health,
        "unenforced_limits": result.unenforced_limits,
    }
    run_dir.write_run_info(info)
    write_trajectory(run_dir, emit)
    parts = []
    for recorded in failures:
        failure, decision = recorded.failure, recorded.decision
        parts.append(
            (
                f"failure {failure.kind}",
                f"{failure.message}\nstage={failure.stage.value} "
                f"class={decision.failure_class.value} action={decision.action.value}\n",
            )
        )
    for name in diagnostic_files:
        text = run_dir.path / name
        if text.exists():
            parts.append((name, text.read_text(errors="replace")))
    run_dir.write_diagnostics(parts)
    run_dir.close()


def write_trajectory(run_dir: RunDir, emit: Callable[[Event], object]) -> None:
    """ATIF ``trajectory.json``, built from what is written above; one that cannot be built is a
    recorded warning: the outcome stands."""
    from opencode_tui_core.export.atif import TRAJECTORY_FILE, build_trajectory

    try:
        run_dir.write_text(TRAJECTORY_FILE, build_trajectory(run_dir.path).to_json())
    except Exception as exc:
        emit(Warning_(code="trajectory_failed", message=f"{TRAJECTORY_FILE} not written: {exc}"))
