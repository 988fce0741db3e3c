"""Classification (who is to blame) and the outcome policy (what to do about it).

The two are deliberately separate: the classifier maps (kind, stage) to a FailureClass; the policy
maps a failure to an action. Overriding an action therefore never changes a failure's class.

Action precedence, highest first: named rule → HTTP status → failure kind → class → default. Within
a table the most specific key wins: ``kind@stage`` before ``kind`` before ``namespace:*``; an exact
status before its class (``5xx``).

Named rules are facts the tables cannot express by key:

- ``oom_survived``: the kernel OOM-killed a command the agent ran, and OpenCode survived and finished
  its turn (``OomDetails.victim == command``). Its action is ``policy.oom_survived``.
- ``grading_never_scored``: a failure during verification is never a reward-0 sample, whatever a
  table says; ``count_as_zero`` there becomes ``mark_evaluation_error``.

Two facts hold before any table:

- An OOM keeps its own precedence: ``provider_oom_killed`` is decided by its kind and class, never
  by the HTTP status of the request through which it was noticed (a 502 status poll).
- A failure to produce an optional artifact (``WARNING_KINDS``: the transcript; and any failure of
  the transcript phase, whatever kind the provider gave it: a download that timed out or found no
  file) is a warning: it is recorded with its evidence and its decision says ``warning``; it decides
  the outcome only when the verifier graded nothing (``opencode_tui_core.outcome.primary_failure``).

A ``retry`` is bounded by ``max_attempts`` and, for a key listed in ``max_retries``, by that count.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opencode_tui_core.failures.model import FailureClass, FailureEvent, FailureStage, OomDetails, OomVictim


class Action(StrEnum):
    """What the episode runner does with a failure."""

    RETRY = "retry"  # run a fresh attempt, bounded by max_attempts
    COUNT_AS_ZERO = "count_as_zero"  # a real sample with reward 0
    MARK_EVALUATION_ERROR = "mark_evaluation_error"  # not a sample: the evaluation failed
    KEEP_UNKNOWN = "keep_unknown"  # not a sample, cause left unknown
    STOP = "stop"  # stop the batch


class Outcome(StrEnum):
    """How an episode ended: the policy's actions plus ``scored`` and ``refused``.

    ``scored`` and ``count_as_zero`` are samples (they carry a reward); every other outcome is not.
    """

    SCORED = "scored"
    REFUSED = "refused"
    RETRY = Action.RETRY.value
    COUNT_AS_ZERO = Action.COUNT_AS_ZERO.value
    MARK_EVALUATION_ERROR = Action.MARK_EVALUATION_ERROR.value
    KEEP_UNKNOWN = Action.KEEP_UNKNOWN.value
    STOP = Action.STOP.value

    @property
    def is_sample(self) -> bool:
        return self in (Outcome.SCORED, Outcome.COUNT_AS_ZERO)


_STATUS_KEY = re.compile(r"[1-5](?:\d\d|xx)")


def _kind_key_ok(key: str) -> bool:
    kind, _, stage = key.partition("@")
    if stage and stage not in FailureStage.__members__.values() and stage != "*":
        return False
    return bool(kind)


class ClassificationConfig(BaseModel):
    """Stage-aware mapping from failure kind to FailureClass (keys ``kind``, ``kind@stage``, ``*@stage``)."""

    model_config = ConfigDict(extra="forbid")

    rules: dict[str, FailureClass] = Field(default_factory=dict)
    default: FailureClass = FailureClass.UNKNOWN

    @field_validator("rules")
    @classmethod
    def _keys(cls, rules: dict[str, FailureClass]) -> dict[str, FailureClass]:
        bad = [k for k in rules if not _kind_key_ok(k)]
        if bad:
            raise ValueError(f"classification keys must be 'kind', 'kind@stage' or '*@stage'; bad: {bad}")
        return rules


class OutcomePolicyConfig(BaseModel):
    """The action tables. User overrides are merged key by key into the defaults (see ``merged``)."""

    model_config = ConfigDict(extra="forbid")

    http_status: dict[str, Action] = Field(default_factory=dict)
    kind: dict[str, Action] = Field(default_factory=dict)
    failure_class: dict[FailureClass, Action] = Field(default_factory=dict)
    default: Action = Action.KEEP_UNKNOWN
    max_attempts: int = Field(default=3, ge=1, le=100)
    # When retries are exhausted, the action falls through to the next precedence level.
    max_retries: dict[str, int] = Field(default_factory=dict)
    oom_survived: Action = Action.COUNT_AS_ZERO
    # A shell a person used before verification finished: not a clean sample unless this says so
    # (the record still says a human intervened, and that it was scored anyway).
    score_human_intervened: bool = False

    @field_validator("http_status")
    @classmethod
    def _status_keys(cls, table: dict[str, Action]) -> dict[str, Action]:
        bad = [k for k in table if not _STATUS_KEY.fullmatch(k)]
        if bad:
            raise ValueError(
                f"http_status keys must be a status like '429' or a class like '5xx'; bad: {bad}"
            )
        return table

    @field_validator("kind", "max_retries")
    @classmethod
    def _kind_keys(cls, table: dict[str, object]) -> dict[str, object]:
        bad = [k for k in table if not _kind_key_ok(k)]
        if bad:
            raise ValueError(f"kind keys must be 'kind' or 'kind@stage'; bad: {bad}")
        return table

    @field_validator("max_retries")
    @classmethod
    def _retry_counts(cls, table: dict[str, int]) -> dict[str, int]:
        bad = [k for k, n in table.items() if not 0 <= n <= 100]
        if bad:
            raise ValueError(f"max_retries values must be between 0 and 100; bad: {bad}")
        return table


class OutcomePolicyOverrides(BaseModel):
    """A partial policy as a user writes it; every field is optional."""

    model_config = ConfigDict(extra="forbid")

    http_status: dict[str, Action] | None = None
    kind: dict[str, Action] | None = None
    failure_class: dict[FailureClass, Action] | None = None
    default: Action | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=100)
    max_retries: dict[str, int] | None = None
    oom_survived: Action | None = None
    score_human_intervened: bool | None = None

    @model_validator(mode="after")
    def _validate_tables(self) -> OutcomePolicyOverrides:
        # Reuse the full model's key checks.
        OutcomePolicyConfig(
            http_status=self.http_status or {}, kind=self.kind or {}, max_retries=self.max_retries or {}
        )
        return self


DEFAULT_CLASSIFICATION = ClassificationConfig(
    rules={
        # The agent's own container ran out of memory while the agent worked: the model's doing.
        "provider_oom_killed@agent": FailureClass.MODEL,
        "provider_oom_killed": FailureClass.EVALUATION,
        # The agent started more processes than the sandbox allows (a fork bomb, an unbounded -j).
        "provider_pids_limit_reached@agent": FailureClass.MODEL,
        "agent_timeout@agent": FailureClass.MODEL,
        "agent_context_limit": FailureClass.MODEL,
        "agent_did_not_finish": FailureClass.MODEL,
        # The agent's own tool call needed what the run's permission profile does not grant (the profile
        # is part of the task's rules, as the time budget is); a task that needs it is run with
        # ``runtime.permissions: allow-all``.
        "agent_permission_rejected": FailureClass.MODEL,
        "agent_nonzero_exit": FailureClass.UNKNOWN,
        "model_rate_limited": FailureClass.EVALUATION,
        "model_server_error": FailureClass.EVALUATION,
        "model_unreachable": FailureClass.EVALUATION,
        "model_stalled": FailureClass.EVALUATION,
        "model_malformed_response": FailureClass.EVALUATION,
        "model_api_error": FailureClass.EVALUATION,
        # The endpoint answers nothing (issue 32): the apparatus is broken, the model is not judged.
        "model_empty_response": FailureClass.EVALUATION,
        "verification_inconclusive": FailureClass.EVALUATION,
        "verifier_error": FailureClass.EVALUATION,
        "verifier_timeout": FailureClass.EVALUATION,
        "verifier_unknown_exit": FailureClass.EVALUATION,
        # Staged inputs the sandbox user cannot use: our set-up (or the task's), never the model's.
        "sandbox_permission_denied": FailureClass.EVALUATION,
        # Who filled it is known only live: the producer says model when the agent's command did.
        "sandbox_disk_full": FailureClass.UNKNOWN,
        # The task's Dockerfile did not build: the set-up, never the model.
        "image_build_failed": FailureClass.EVALUATION,
        "artifacts_write_failed": FailureClass.EVALUATION,
        # The engine under the sandbox went away: the apparatus failed, whatever the agent was doing.
        "sandbox_engine_lost": FailureClass.EVALUATION,
        # Infrastructure whatever the phase: the agent did not make the Ray worker die.
        "executor_worker_lost": FailureClass.EVALUATION,
        # A rerun stopped at its divergence: the environment (or the task) changed, not the model.
        "replay_diverged": FailureClass.EVALUATION,
        "*@seed": FailureClass.EVALUATION,
        "*@install": FailureClass.EVALUATION,
        "*@admission": FailureClass.EVALUATION,
        "*@closing": FailureClass.EVALUATION,
        "*@transcript": FailureClass.EVALUATION,
        "*@verification": FailureClass.EVALUATION,
        "*@release": FailureClass.EVALUATION,
        "*@cleanup": FailureClass.EVALUATION,
        "run_cancelled": FailureClass.UNKNOWN,
    }
)

DEFAULT_POLICY = OutcomePolicyConfig(
    http_status={"408": Action.RETRY, "425": Action.RETRY, "429": Action.RETRY, "5xx": Action.RETRY},
    kind={
        # A seed-phase OOM (copying the task in) says nothing about the model: try once more.
        "provider_oom_killed@seed": Action.RETRY,
        "provider_oom_killed@agent": Action.COUNT_AS_ZERO,
        "provider_pids_limit_reached@agent": Action.COUNT_AS_ZERO,
        "agent_timeout@agent": Action.COUNT_AS_ZERO,
        "agent_context_limit": Action.COUNT_AS_ZERO,
        "cleanup_unconfirmed": Action.KEEP_UNKNOWN,
        # A fresh attempt gets a fresh sandbox once the engine is back (bounded by max_attempts).
        "sandbox_engine_lost": Action.RETRY,
        # A registry that cannot be reached or stalls may answer the next attempt (a partial download is
        # resumed); bounded by max_attempts, then an evaluation error.
        "install_registry_unreachable": Action.RETRY,
        "install_timeout": Action.RETRY,
        "supervisor_lost": Action.KEEP_UNKNOWN,
        "human_intervened": Action.KEEP_UNKNOWN,
        "replay_diverged": Action.KEEP_UNKNOWN,
        "run_interrupted": Action.KEEP_UNKNOWN,
        # A lost worker says nothing about the task: a fresh attempt elsewhere (bounded by max_attempts).
        "executor_worker_lost": Action.RETRY,
        "run_cancelled": Action.STOP,
        "task_invalid": Action.STOP,
        # The same context builds the same way: another attempt would fail again.
        "image_build_failed": Action.MARK_EVALUATION_ERROR,
        "config_invalid": Action.STOP,
    },
    failure_class={
        FailureClass.MODEL: Action.COUNT_AS_ZERO,
        # Infrastructure is never turned into a reward-0 sample.
        FailureClass.EVALUATION: Action.MARK_EVALUATION_ERROR,
        FailureClass.UNKNOWN: Action.KEEP_UNKNOWN,
    },
    default=Action.KEEP_UNKNOWN,
    max_attempts=3,
    max_retries={"provider_oom_killed@seed": 1},
    oom_survived=Action.COUNT_AS_ZERO,
)


def merged(base: OutcomePolicyConfig, overrides: OutcomePolicyOverrides | None) -> OutcomePolicyConfig:
    """Merge user overrides into ``base`` key by key; untouched defaults stay."""
    if overrides is None:
        return base
    return OutcomePolicyConfig(
        http_status={**base.http_status, **(overrides.http_status or {})},
        kind={**base.kind, **(overrides.kind or {})},
        failure_class={**base.failure_class, **(overrides.failure_class or {})},
        default=overrides.default or base.default,
        max_attempts=overrides.max_attempts or base.max_attempts,
        max_retries={**base.max_retries, **(overrides.max_retries or {})},
        oom_survived=overrides.oom_survived or base.oom_survived,
        score_human_intervened=(
            base.score_human_intervened
            if overrides.score_human_intervened is None
            else overrides.score_human_intervened
        ),
    )


def merged_classification(
    base: ClassificationConfig, overrides: ClassificationConfig | None
) -> ClassificationConfig:
    if overrides is None:
        return base
    return ClassificationConfig(rules={**base.rules, **overrides.rules}, default=overrides.default)


def _kind_candidates(kind: str, stage: FailureStage) -> list[str]:
    keys = [f"{kind}@{stage.value}", kind]
    if ":" in kind:
        ns = kind.split(":", 1)[0]
        keys += [f"{ns}:*@{stage.value}", f"{ns}:*"]
    return keys


def classify(failure: FailureEvent, config: ClassificationConfig = DEFAULT_CLASSIFICATION) -> FailureClass:
    """The failure's class: the producer's own if supplied, else the most specific rule, else default."""
    if failure.failure_class is not None:
        return failure.failure_class
    for key in [*_kind_candidates(failure.kind, failure.stage), f"*@{failure.stage.value}"]:
        if key in config.rules:
            return config.rules[key]
    return config.default


DecisionLevel = Literal["rule", "http_status", "kind", "failure_class", "default"]

# What each named rule (``Decision.level == "rule"``) is, in words: said wherever a decision is shown.
NAMED_RULES: dict[str, str] = {
    "oom_survived": "the kernel OOM-killed a command the agent ran; OpenCode survived and finished its turn",
    "grading_never_scored": "a failure while grading is never a reward-0 sample",
    "retries_exhausted": "every level said retry and the attempts are used up",
}

# Kinds whose statuses are not theirs: the request that noticed them failed because of them.
STATUS_BLIND_KINDS = frozenset({"provider_oom_killed"})

# Optional artifacts: failing to produce one never costs a graded reward (it is a warning then).
WARNING_KINDS = frozenset({"transcript_export_failed"})
# The phases that only produce optional artifacts: whatever fails there (the provider's download of
# OpenCode's data timing out or finding no file, the snapshot, the export) is such a failure, under
# whichever kind the provider gave it.
WARNING_STAGES = frozenset({FailureStage.TRANSCRIPT})


def is_warning(failure: FailureEvent) -> bool:
    """A failure about an optional artifact: it decides the outcome only when nothing was graded."""
    return failure.kind in WARNING_KINDS or failure.stage in WARNING_STAGES


class Decision(BaseModel):
    """The policy's verdict on one failure; ``rule`` says which table entry decided it.

    ``warning``: the failure is about an optional artifact (``WARNING_KINDS``); ``action`` is what
    it means when it decides, which it does only when the verifier graded nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    failure_class: FailureClass
    rule: str
    level: DecisionLevel
    retries_exhausted: bool = False
    warning: bool = False


def describe_decision(decision: Decision) -> str:
    """Which table entry (or named rule) decided, in words: ``rule 'oom_survived' (…)``,
    ``HTTP status '5xx'``, ``kind 'agent_timeout@agent'``, ``class 'evaluation'``, ``the default``."""
    rule = decision.rule
    if decision.level == "rule" or rule in NAMED_RULES:
        what = NAMED_RULES.get(rule)
        words = f"rule '{rule}'" + (f": {what}" if what else "")
    elif decision.level == "default":
        words = "the default action"
    else:
        label = {"http_status": "HTTP status", "kind": "kind", "failure_class": "class"}[decision.level]
        words = f"{label} '{rule}'"
    if decision.retries_exhausted and rule != "retries_exhausted":
        words += " (retries exhausted)"
    if decision.warning:
        words += "; a warning: it decides only when nothing was graded"
    return words


def _survived_oom(failure: FailureEvent) -> bool:
    return (
        failure.kind == "provider_oom_killed"
        and isinstance(failure.details, OomDetails)
        and failure.details.victim is OomVictim.COMMAND
    )


def _retry_allowed(key: str, attempt: int, policy: OutcomePolicyConfig) -> bool:
    if attempt >= policy.max_attempts:
        return False
    limit = policy.max_retries.get(key)
    return limit is None or attempt <= limit


def decide(
    failure: FailureEvent,
    *,
    attempt: int = 1,
    policy: OutcomePolicyConfig = DEFAULT_POLICY,
    classification: ClassificationConfig = DEFAULT_CLASSIFICATION,
) -> Decision:
    """Pick the action for ``failure`` on the given 1-based attempt.

    A ``retry`` on the last allowed attempt falls through to the next precedence level, so a
    bounded retry never loops and never silently turns into a reward.
    """
    failure_class = classify(failure, classification)
    candidates: list[tuple[DecisionLevel, str, Action]] = []
    if _survived_oom(failure):
        candidates.append(("rule", "oom_survived", policy.oom_survived))
    if failure.http_status is not None and failure.kind not in STATUS_BLIND_KINDS:
        status = str(failure.http_status)
        for key in (status, f"{status[0]}xx"):
            if key in policy.http_status:
                candidates.append(("http_status", key, policy.http_status[key]))
                break
    for key in _kind_candidates(failure.kind, failure.stage):
        if key in policy.kind:
            candidates.append(("kind", key, policy.kind[key]))
            break
    if failure_class in policy.failure_class:
        candidates.append(("failure_class", failure_class.value, policy.failure_class[failure_class]))
    candidates.append(("default", "default", policy.default))

    warning = is_warning(failure)
    exhausted = False
    for level, key, action in candidates:
        if action is Action.RETRY and not _retry_allowed(key, attempt, policy):
            exhausted = True
            continue
        if action is Action.COUNT_AS_ZERO and failure.stage is FailureStage.VERIFICATION:
            # A grading failure says nothing about the model: never a reward-0 sample.
            return Decision(
                action=Action.MARK_EVALUATION_ERROR,
                failure_class=failure_class,
                rule="grading_never_scored",
                level="rule",
                retries_exhausted=exhausted,
                warning=warning,
            )
        return Decision(
            action=action,
            failure_class=failure_class,
            rule=key,
            level=level,
            retries_exhausted=exhausted,
            warning=warning,
        )
    # Every level said retry and attempts are used up: nothing is known about the outcome.
    return Decision(
        action=Action.KEEP_UNKNOWN,
        failure_class=failure_class,
        rule="retries_exhausted",
        level="default",
        retries_exhausted=True,
        warning=warning,
    )
