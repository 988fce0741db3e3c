"""The OpenSandbox provider's request policy: defaults, merging user overrides, and rule selection.

Modelled on the outcome policy (``opencode_tui_core.failures.policy``): ordered tables, overrides merged key by
key into the defaults, and an explicit precedence. The policy only picks an *action*; the failure's
kind and delivery come from the protocol (``opencode_tui_core.sandbox.opensandbox``) and no rule changes them.

Precedence for one failed request of operation ``op`` (first match wins)::

    http_status["op:502"] → http_status["op:5xx"] → http_status["502"] → http_status["5xx"]
    → kind["op:<kind>"] → kind["<kind>"] → default

Budgets stay scoped to the operation (``attempts[op]``, else ``attempts["*"]``), and the operation
boundary decides whether an action is executable: a ``retry`` of ``create`` or ``submit`` is
executed only when the failed attempt provably did not take effect.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.sandbox.opensandbox.settings import (
    DiagnosticTimeouts,
    EvidencePolling,
    OpenSandboxAction,
    OpenSandboxPolicyConfig,
    OpenSandboxPolicyOverrides,
    RetryBudget,
    StatusRecovery,
)

RETRY, FAIL = OpenSandboxAction.RETRY, OpenSandboxAction.FAIL
M = TypeVar("M", bound=BaseModel)

DEFAULT_OPENSANDBOX_POLICY = OpenSandboxPolicyConfig(
    command_timeout_headroom_s=5.0,
    status_recovery=StatusRecovery(),
    evidence_polling=EvidencePolling(),
    diagnostic_timeouts=DiagnosticTimeouts(),
    http_status={
        # Transient answers: worth another attempt of an idempotent request.
        "408": RETRY,
        "425": RETRY,
        "429": RETRY,
        "502": RETRY,
        "503": RETRY,
        "504": RETRY,
        # A server error while creating may have left a half-made sandbox: the provider deletes
        # it (found by the attempt's nonce label) and then fails rather than trying again.
        "create:5xx": FAIL,
        # Diagnosis runs against a deadline; a second attempt would only eat into it.
        "diagnostics:5xx": FAIL,
    },
    kind={
        # Connection refused/reset before the request was sent: nothing happened, try again.
        "provider_unavailable": RETRY,
        # A read that timed out may simply be retried; a state-changing one never is (boundary).
        "read:provider_io_timeout": RETRY,
        "status:provider_io_timeout": RETRY,
        "download:provider_io_timeout": RETRY,
        "diagnostics:provider_unavailable": FAIL,
    },
    default=FAIL,
    attempts={
        "*": RetryBudget(max_attempts=3, initial_delay_s=0.25, max_delay_s=2.0),
        "create": RetryBudget(max_attempts=2, initial_delay_s=1.0, max_delay_s=5.0),
        # A submission rejected before it started (502, connection refused) is resubmitted with
        # 0.25 s · 2^(n-1) backoff capped at 2 s, four attempts in all.
        "submit": RetryBudget(max_attempts=4, initial_delay_s=0.25, max_delay_s=2.0),
        "status": RetryBudget(max_attempts=3, initial_delay_s=0.2, max_delay_s=1.0),
        "ping": RetryBudget(max_attempts=1),
        "diagnostics": RetryBudget(max_attempts=1),
        "pty": RetryBudget(max_attempts=2, initial_delay_s=0.2, max_delay_s=1.0),
    },
)


def _merge_section(base: M, override: M | None) -> M:
    """Only the fields the user wrote (``model_fields_set``) replace the base's."""
    if override is None:
        return base
    return base.model_copy(update={name: getattr(override, name) for name in override.model_fields_set})


def merged_policy(
    base: OpenSandboxPolicyConfig, overrides: OpenSandboxPolicyOverrides | None
) -> OpenSandboxPolicyConfig:
    """Merge user overrides into ``base``: tables key by key, sections field by field."""
    if overrides is None:
        return base
    attempts = dict(base.attempts)
    for op, budget in (overrides.attempts or {}).items():
        attempts[op] = _merge_section(attempts.get(op) or base.budget(op), budget)
    return OpenSandboxPolicyConfig(
        command_timeout_headroom_s=(
            overrides.command_timeout_headroom_s
            if overrides.command_timeout_headroom_s is not None
            else base.command_timeout_headroom_s
        ),
        status_recovery=_merge_section(base.status_recovery, overrides.status_recovery),
        evidence_polling=_merge_section(base.evidence_polling, overrides.evidence_polling),
        diagnostic_timeouts=_merge_section(base.diagnostic_timeouts, overrides.diagnostic_timeouts),
        http_status={**base.http_status, **(overrides.http_status or {})},
        kind={**base.kind, **(overrides.kind or {})},
        default=overrides.default or base.default,
        attempts=attempts,
    )


class RequestDecision(BaseModel):
    """Which rule decided the action for one failed request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: OpenSandboxAction
    rule: str
    level: Literal["http_status", "kind", "default"]


def decide_request(
    policy: OpenSandboxPolicyConfig, *, operation: str, http_status: int | None, kind: str
) -> RequestDecision:
    """The action for one failed request, by the documented precedence."""
    if http_status is not None:
        status = str(http_status)
        klass = f"{status[0]}xx"
        for key in (f"{operation}:{status}", f"{operation}:{klass}", status, klass):
            if key in policy.http_status:
                return RequestDecision(action=policy.http_status[key], rule=key, level="http_status")
    for key in (f"{operation}:{kind}", kind):
        if key in policy.kind:
            return RequestDecision(action=policy.kind[key], rule=key, level="kind")
    return RequestDecision(action=policy.default, rule="default", level="default")
