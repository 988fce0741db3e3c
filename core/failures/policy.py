"""Classification (who is to blame) and the outcome policy (what to do about it).

The two are deliberately separate: the classifier maps (kind, stage) to a FailureClass; the policy
maps a failure to an action. Overriding an action therefore never changes a failure's class.

Action precedence, highest first: HTTP status → failure kind → class → default. Within a table the
most specific key wins: ``kind@stage`` before ``kind`` before ``namespace:*``; an exact status before
its class (``5xx``).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.failures.model import FailureClass, FailureEvent, FailureStage


class Action(StrEnum):
    """What the episode runner does with a failure."""

    RETRY = "retry"  # run a fresh attempt, bounded by max_attempts
    COUNT_AS_ZERO = "count_as_zero"  # a real sample with reward 0
    MARK_EVALUATION_ERROR = "mark_evaluation_error"  # not a sample: the evaluation failed
    KEEP_UNKNOWN = "keep_unknown"  # not a sample, cause left unknown
    STOP = "stop"  # stop the batch


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

    @field_validator("http_status")
    @classmethod
    def _status_keys(cls, table: dict[str, Action]) -> dict[str, Action]:
        bad = [k for k in table if not _STATUS_KEY.fullmatch(k)]
        if bad:
            raise ValueError(
                f"http_status keys must be a status like '429' or a class like '5xx'; bad: {bad}"
            )
        return table

    @field_validator("kind")
    @classmethod
    def _kind_keys(cls, table: dict[str, Action]) -> dict[str, Action]:
        bad = [k for k in table if not _kind_key_ok(k)]
        if bad:
            raise ValueError(f"kind keys must be 'kind' or 'kind@stage'; bad: {bad}")
        return table


class OutcomePolicyOverrides(BaseModel):
    """A partial policy as a user writes it; every field is optional."""

    model_config = ConfigDict(extra="forbid")

    http_status: dict[str, Action] | None = None
    kind: dict[str, Action] | None = None
    failure_class: dict[FailureClass, Action] | None = None
    default: Action | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=100)

    @model_validator(mode="after")
    def _validate_tables(self) -> OutcomePolicyOverrides:
        # Reuse the full model's key checks.
        OutcomePolicyConfig(http_status=self.http_status or {}, kind=self.kind or {})
        return self


DEFAULT_CLASSIFICATION = ClassificationConfig(
    rules={
        # The agent's own container ran out of memory while the agent worked: the model's doing.
        "provider_oom_killed@agent": FailureClass.MODEL,
        "provider_oom_killed": FailureClass.EVALUATION,
        "agent_timeout@agent": FailureClass.MODEL,
        "agent_context_limit": FailureClass.MODEL,
        "agent_did_not_finish": FailureClass.MODEL,
        "agent_nonzero_exit": FailureClass.UNKNOWN,
        "model_rate_limited": FailureClass.EVALUATION,
        "model_server_error": FailureClass.EVALUATION,
        "model_unreachable": FailureClass.EVALUATION,
        "model_stalled": FailureClass.EVALUATION,
        "model_malformed_response": FailureClass.EVALUATION,
        "model_api_error": FailureClass.EVALUATION,
        "verification_inconclusive": FailureClass.EVALUATION,
        "verifier_error": FailureClass.EVALUATION,
        "verifier_timeout": FailureClass.EVALUATION,
        # Staged inputs the sandbox user cannot use: our set-up (or the task's), never the model's.
        "sandbox_permission_denied": FailureClass.EVALUATION,
        "*@seed": FailureClass.EVALUATION,
        "*@install": FailureClass.EVALUATION,
        "*@admission": FailureClass.EVALUATION,
        "*@cleanup": FailureClass.EVALUATION,
        "run_cancelled": FailureClass.UNKNOWN,
    }
)

DEFAULT_POLICY = OutcomePolicyConfig(
    http_status={"408": Action.RETRY, "425": Action.RETRY, "429": Action.RETRY, "5xx": Action.RETRY},
    kind={
        "provider_oom_killed@agent": Action.COUNT_AS_ZERO,
        "agent_timeout@agent": Action.COUNT_AS_ZERO,
        "agent_context_limit": Action.COUNT_AS_ZERO,
        "cleanup_unconfirmed": Action.KEEP_UNKNOWN,
        "run_cancelled": Action.STOP,
        "task_invalid": Action.STOP,
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


class Decision(BaseModel):
    """The policy's verdict on one failure; ``rule`` says which table entry decided it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    failure_class: FailureClass
    rule: str
    level: Literal["http_status", "kind", "failure_class", "default"]
    retries_exhausted: bool = False


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
    candidates: list[tuple[str, str, Action]] = []
    if failure.http_status is not None:
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

    exhausted = False
    for level, key, action in candidates:
        if action is Action.RETRY and attempt >= policy.max_attempts:
            exhausted = True
            continue
        return Decision(
            action=action, failure_class=failure_class, rule=key, level=level, retries_exhausted=exhausted
        )
    # Every level said retry and attempts are used up: nothing is known about the outcome.
    return Decision(
        action=Action.KEEP_UNKNOWN,
        failure_class=failure_class,
        rule="retries_exhausted",
        level="default",
        retries_exhausted=True,
    )
