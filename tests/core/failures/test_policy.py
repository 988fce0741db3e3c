"""Outcome policy: precedence HTTP status → kind → class → default; overrides; classification."""

import logging

import pytest

from opencode_tui_core.failures import (
    DEFAULT_POLICY,
    Action,
    ClassificationConfig,
    FailureClass,
    FailureEvent,
    OutcomePolicyConfig,
    OutcomePolicyOverrides,
    classify,
    decide,
    merged,
)
from opencode_tui_core.failures import kinds as kinds_mod

POLICY = OutcomePolicyConfig(
    http_status={"429": Action.RETRY, "5xx": Action.MARK_EVALUATION_ERROR, "503": Action.STOP},
    kind={
        "model_rate_limited": Action.KEEP_UNKNOWN,
        "agent_timeout@agent": Action.COUNT_AS_ZERO,
        "provider_oom_killed": Action.STOP,
    },
    failure_class={FailureClass.MODEL: Action.COUNT_AS_ZERO},
    default=Action.KEEP_UNKNOWN,
    max_attempts=3,
)


def f(kind="sandbox_lost", stage="agent", status=None, cls=None):
    return FailureEvent(
        kind=kind, stage=stage, operation="op", message="m", http_status=status, failure_class=cls
    )


@pytest.mark.parametrize(
    ("failure", "attempt", "action", "level", "rule"),
    [
        # HTTP status beats kind.
        (f("model_rate_limited", status=429), 1, Action.RETRY, "http_status", "429"),
        # Exact status beats its class.
        (f("model_server_error", status=503), 1, Action.STOP, "http_status", "503"),
        (f("model_server_error", status=500), 1, Action.MARK_EVALUATION_ERROR, "http_status", "5xx"),
        # Retry exhausted on the last attempt falls through to the kind rule.
        (f("model_rate_limited", status=429), 3, Action.KEEP_UNKNOWN, "kind", "model_rate_limited"),
        # kind@stage beats plain kind and class.
        (f("agent_timeout", stage="agent"), 1, Action.COUNT_AS_ZERO, "kind", "agent_timeout@agent"),
        # Kind beats supplied class.
        (f("provider_oom_killed", cls=FailureClass.MODEL), 1, Action.STOP, "kind", "provider_oom_killed"),
        # Supplied class beats default.
        (f("sandbox_lost", cls=FailureClass.MODEL), 1, Action.COUNT_AS_ZERO, "failure_class", "model"),
        # Nothing matches: default.
        (f("sandbox_lost", cls=FailureClass.UNKNOWN), 1, Action.KEEP_UNKNOWN, "default", "default"),
        # A status with no rule does not block lower levels.
        (
            f("agent_timeout", stage="agent", status=404),
            1,
            Action.COUNT_AS_ZERO,
            "kind",
            "agent_timeout@agent",
        ),
    ],
)
def test_precedence_table(failure, attempt, action, level, rule):
    d = decide(failure, attempt=attempt, policy=POLICY)
    assert (d.action, d.level, d.rule) == (action, level, rule)


def test_all_levels_retry_and_exhausted_keeps_unknown():
    p = OutcomePolicyConfig(http_status={"429": Action.RETRY}, default=Action.RETRY, max_attempts=2)
    assert decide(f(status=429), attempt=1, policy=p).action is Action.RETRY
    d = decide(f(status=429), attempt=2, policy=p)
    assert d.action is Action.KEEP_UNKNOWN and d.retries_exhausted


def test_defaults_oom_at_agent_counts_as_zero_model():
    d = decide(f("provider_oom_killed", stage="agent"))
    assert (d.action, d.failure_class) == (Action.COUNT_AS_ZERO, FailureClass.MODEL)


def test_defaults_infrastructure_never_becomes_zero():
    for kind, stage in [
        ("sandbox_allocation_failed", "seed"),
        ("install_failed", "install"),
        ("model_server_error", "agent"),
        ("verification_inconclusive", "verification"),
        ("provider_oom_killed", "verification"),
    ]:
        for attempt in (1, 2, 3):
            d = decide(
                f(kind, stage=stage, status=500 if kind.startswith("model") else None), attempt=attempt
            )
            assert d.action is not Action.COUNT_AS_ZERO, (kind, stage, attempt)
            assert d.failure_class is FailureClass.EVALUATION


def test_unknown_cause_stays_unknown():
    d = decide(f("agent_nonzero_exit"))
    assert (d.action, d.failure_class) == (Action.KEEP_UNKNOWN, FailureClass.UNKNOWN)


def test_overrides_merge_into_defaults():
    ov = OutcomePolicyOverrides(
        kind={"provider_oom_killed@agent": Action.MARK_EVALUATION_ERROR}, max_attempts=5
    )
    p = merged(DEFAULT_POLICY, ov)
    assert p.kind["provider_oom_killed@agent"] is Action.MARK_EVALUATION_ERROR
    assert p.kind["agent_context_limit"] is Action.COUNT_AS_ZERO  # untouched default kept
    assert p.http_status == DEFAULT_POLICY.http_status
    assert p.max_attempts == 5


def test_changing_an_action_never_changes_the_class():
    failure = f("provider_oom_killed", stage="agent")
    before = decide(failure)
    after = decide(
        failure,
        policy=merged(
            DEFAULT_POLICY,
            OutcomePolicyOverrides(
                kind={"provider_oom_killed@agent": Action.STOP},
                failure_class={FailureClass.MODEL: Action.KEEP_UNKNOWN},
            ),
        ),
    )
    assert before.action != after.action
    assert before.failure_class == after.failure_class == FailureClass.MODEL


def test_classification_is_stage_aware_and_configurable():
    assert classify(f("provider_oom_killed", stage="agent")) is FailureClass.MODEL
    assert classify(f("provider_oom_killed", stage="seed")) is FailureClass.EVALUATION
    custom = ClassificationConfig(rules={"*@agent": FailureClass.EVALUATION})
    assert classify(f("whatever_thing", stage="agent"), custom) is FailureClass.EVALUATION
    assert classify(f("whatever_thing", stage="seed"), custom) is FailureClass.UNKNOWN


def test_bad_policy_keys_rejected():
    with pytest.raises(ValueError, match="http_status keys"):
        OutcomePolicyConfig(http_status={"4x": Action.RETRY})
    with pytest.raises(ValueError, match="kind keys"):
        OutcomePolicyOverrides(kind={"x@nowhere": Action.RETRY})


def test_unknown_kind_kept_and_warned_once(caplog):
    kinds_mod._warned.discard("weird_thing_happened")
    with caplog.at_level(logging.WARNING, logger="opencode_tui_core.failures.kinds"):
        a = f("weird_thing_happened")
        b = f("weird_thing_happened")
    assert a.kind == b.kind == "weird_thing_happened"
    warnings = [r for r in caplog.records if "weird_thing_happened" in r.getMessage()]
    assert len(warnings) == 1


def test_register_kind_validates_name():
    with pytest.raises(ValueError):
        kinds_mod.register_kind("NotValid", "x")
    kinds_mod.register_kind("myenv:judge_crashed", "extension kind")
    assert kinds_mod.is_registered("myenv:judge_crashed")


def test_engine_lost_and_unreachable_registry_are_retried_then_evaluation_errors():
    """Issue 19: faults of the world around the episode are retried (a fresh sandbox, a fresh
    download), bounded by max_attempts, and never become a sample."""
    for kind, stage in [
        ("sandbox_engine_lost", "agent"),
        ("sandbox_engine_lost", "install"),
        ("install_registry_unreachable", "install"),
        ("install_timeout", "install"),
    ]:
        assert decide(f(kind, stage=stage), attempt=1).action is Action.RETRY, kind
        last = decide(f(kind, stage=stage), attempt=3)
        assert (last.action, last.failure_class) == (Action.MARK_EVALUATION_ERROR, FailureClass.EVALUATION)
