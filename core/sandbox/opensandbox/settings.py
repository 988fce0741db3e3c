"""The OpenSandbox provider's settings: the config's ``sandbox.opensandbox:`` (see docs/opensandbox.md).

Validated here, where they are defined; the config refers to them by the provider's name.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from opencode_tui_core.config import _finite_positive


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenSandboxAction(StrEnum):
    """What an OpenSandbox operation does about one failed request (scoped to that operation).

    ``retry`` re-issues the same request within the operation's own attempt budget. For operations
    that change state (``create``, ``submit``) the provider executes a retry only when the failed
    attempt is proven not to have taken effect (see docs/opensandbox.md); otherwise it fails.
    """

    RETRY = "retry"
    FAIL = "fail"


# Operations the OpenSandbox policy rules can be scoped to (``"<operation>:<key>"``).
OPENSANDBOX_OPERATIONS = (
    "create",  # POST /sandboxes
    "read",  # GET sandbox, list, endpoints
    "delete",  # DELETE /sandboxes/{id}
    "renew",  # POST renew-expiration
    "ping",  # execd GET /ping (readiness)
    "submit",  # execd POST /command
    "status",  # execd command status and logs, by execution id
    "interrupt",  # execd DELETE /command
    "upload",  # execd POST /files/upload
    "download",  # execd GET /files/download
    "pty",  # execd PTY create/delete and WebSocket attach
    "diagnostics",  # lifecycle status and diagnostics reads made while diagnosing a failure
)
_OS_STATUS_KEY = re.compile(r"[1-5](?:\d\d|xx)")
_OS_KIND_KEY = re.compile(r"(?:[a-z][a-z0-9_-]*:)?[a-z][a-z0-9]*_[a-z0-9_]+")


def _os_scoped_key(key: str, inner: re.Pattern[str], what: str) -> str:
    op, sep, rest = key.partition(":")
    if sep and op in OPENSANDBOX_OPERATIONS:
        body = rest
    else:
        body = key
    if not inner.fullmatch(body):
        raise ValueError(
            f"{what} key {key!r} must be '<{what}>' or '<operation>:<{what}>' "
            f"(operations: {', '.join(OPENSANDBOX_OPERATIONS)})"
        )
    return key


class RetryBudget(_Model):
    """Attempts and backoff of one operation (the first attempt counts)."""

    max_attempts: int = Field(default=3, ge=1, le=20)
    initial_delay_s: float = Field(default=0.25, ge=0, le=60)
    max_delay_s: float = Field(default=2.0, ge=0, le=300)
    multiplier: float = Field(default=2.0, ge=1, le=10)

    def delay(self, attempt: int) -> float:
        """The pause before attempt ``attempt + 1`` (``attempt`` is 1-based)."""
        return min(self.initial_delay_s * self.multiplier ** (attempt - 1), self.max_delay_s)


class StatusRecovery(_Model):
    """Following a command by its execution id after its output stream broke."""

    enabled: bool = True
    poll_initial_s: float = Field(default=0.25, gt=0, le=60)
    poll_max_s: float = Field(default=2.0, gt=0, le=300)
    multiplier: float = Field(default=1.5, ge=1, le=10)
    fetch_logs: bool = True  # after the status shows the exit, read the command's log once


class EvidencePolling(_Model):
    """Watching the lifecycle for a terminal transition while diagnosing (inside the hard cap)."""

    enabled: bool = True
    interval_s: float = Field(default=0.5, gt=0, le=60)
    budget_s: float = Field(default=5.0, ge=0, le=600)


class DiagnosticTimeouts(_Model):
    """Per-request timeouts of the diagnostic reads (each is also cut to the remaining deadline)."""

    lifecycle_s: float = Field(default=2.0, gt=0, le=120)
    events_s: float = Field(default=3.0, gt=0, le=120)
    inspect_s: float = Field(default=3.0, gt=0, le=120)


class OpenSandboxPolicyConfig(_Model):
    """Timeouts, recovery and retry rules of the OpenSandbox provider.

    Action precedence for one failed request of operation ``op`` (first match wins):
    ``http_status["op:<status>"]`` → ``http_status["op:<N>xx"]`` → ``http_status["<status>"]`` →
    ``http_status["<N>xx"]`` → ``kind["op:<kind>"]`` → ``kind["<kind>"]`` → ``default``.
    Rules change actions only: the failure's kind and delivery are decided by the protocol, never
    by a rule.
    """

    command_timeout_headroom_s: float = Field(default=5.0, ge=0, le=3600)
    status_recovery: StatusRecovery = Field(default_factory=StatusRecovery)
    evidence_polling: EvidencePolling = Field(default_factory=EvidencePolling)
    diagnostic_timeouts: DiagnosticTimeouts = Field(default_factory=DiagnosticTimeouts)
    http_status: dict[str, OpenSandboxAction] = Field(default_factory=dict)
    kind: dict[str, OpenSandboxAction] = Field(default_factory=dict)
    default: OpenSandboxAction = OpenSandboxAction.FAIL
    attempts: dict[str, RetryBudget] = Field(default_factory=dict)  # by operation; "*" for the rest

    @field_validator("http_status")
    @classmethod
    def _status_keys(cls, table: dict[str, OpenSandboxAction]) -> dict[str, OpenSandboxAction]:
        for key in table:
            _os_scoped_key(key, _OS_STATUS_KEY, "status")
        return table

    @field_validator("kind")
    @classmethod
    def _kind_keys(cls, table: dict[str, OpenSandboxAction]) -> dict[str, OpenSandboxAction]:
        for key in table:
            _os_scoped_key(key, _OS_KIND_KEY, "kind")
        return table

    @field_validator("attempts")
    @classmethod
    def _attempt_keys(cls, table: dict[str, RetryBudget]) -> dict[str, RetryBudget]:
        bad = [k for k in table if k != "*" and k not in OPENSANDBOX_OPERATIONS]
        if bad:
            raise ValueError(f"attempts keys must be operations or '*'; bad: {bad}")
        return table

    def budget(self, operation: str) -> RetryBudget:
        return self.attempts.get(operation) or self.attempts.get("*") or RetryBudget()


class OpenSandboxPolicyOverrides(_Model):
    """A partial OpenSandbox policy as a user writes it. Tables merge key by key into the defaults;
    nested sections merge field by field (only the fields written here change)."""

    command_timeout_headroom_s: float | None = Field(default=None, ge=0, le=3600)
    status_recovery: StatusRecovery | None = None
    evidence_polling: EvidencePolling | None = None
    diagnostic_timeouts: DiagnosticTimeouts | None = None
    http_status: dict[str, OpenSandboxAction] | None = None
    kind: dict[str, OpenSandboxAction] | None = None
    default: OpenSandboxAction | None = None
    attempts: dict[str, RetryBudget] | None = None

    @model_validator(mode="after")
    def _validate_tables(self) -> OpenSandboxPolicyOverrides:
        OpenSandboxPolicyConfig(
            http_status=self.http_status or {}, kind=self.kind or {}, attempts=self.attempts or {}
        )
        return self


class OpenSandboxSettings(_Model):
    """How to reach an OpenSandbox server and what to ask of it (see docs/opensandbox.md)."""

    url: str = "http://127.0.0.1:8080"
    api_prefix: str = "/v1"
    api_key_env: str | None = "OPEN_SANDBOX_API_KEY"  # the key is read from this variable, never stored
    # Per-request timeouts (seconds); the connect timeout applies to every request.
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    create_timeout_s: float = 180.0  # POST /sandboxes answers once the container has started
    delete_timeout_s: float = 60.0
    file_timeout_s: float = 300.0
    # Connection pool, shared by every sandbox of one provider.
    max_connections: int = Field(default=20, gt=0)
    max_keepalive_connections: int = Field(default=10, ge=0)
    keepalive_expiry_s: float = 3.0
    # What the sandboxes get.
    execd_port: int = Field(default=44772, ge=1, le=65535)
    use_server_proxy: bool = False  # reach execd through the server's /proxy route
    sandbox_timeout_s: int | None = Field(default=14400, ge=60)  # server-side expiry backstop; None: never
    entrypoint: list[str] = Field(default_factory=lambda: ["tail", "-f", "/dev/null"], min_length=1)
    default_cpu: str = "1"
    default_memory: str = "2Gi"
    verify_identity: bool = True  # readiness checks the daemon answers for *this* sandbox
    # Commands run as this user when set; a provider-confirmed refusal before launch (one of the
    # codes below) falls back to the image's default user without recording a failure.
    command_uid: int | None = Field(default=None, ge=0)
    command_gid: int | None = Field(default=None, ge=0)
    fallback_to_default_user: bool = True
    expected_refusal_codes: list[str] = Field(
        default_factory=lambda: ["ROOT_NOT_ALLOWED", "USER_NOT_ALLOWED", "UID_NOT_ALLOWED"]
    )
    # OOM evidence (opencode_tui_core.sandbox.oom). The lifecycle status's ``reason`` is a machine-readable code:
    # one of these codes, matched exactly, in a terminal state confirms an OOM kill (its free-text
    # ``message`` never does). Server 1.1.x's Docker runtime sets none of them (an OOM-killed main
    # process reads Failed / CONTAINER_EXITED_ERROR); ``OOMKilled`` is Kubernetes' termination reason.
    oom_reason_codes: list[str] = Field(default_factory=lambda: ["OOMKilled"])
    # The diagnostics reports (the events descriptor, with the deprecated inspect text as fallback)
    # are display text the diagnostics API says not to parse: confirming an OOM from their
    # ``OOMKilled`` line is opt-in. When on, a diagnosis makes one report round and, if the lifecycle
    # turns terminal later, one final round, all inside the execution's deadline.
    oom_from_diagnostics: bool = False
    policy: OpenSandboxPolicyOverrides = Field(default_factory=OpenSandboxPolicyOverrides)

    @field_validator(
        "connect_timeout_s",
        "request_timeout_s",
        "create_timeout_s",
        "delete_timeout_s",
        "file_timeout_s",
        "keepalive_expiry_s",
    )
    @classmethod
    def _timeouts(cls, value: float, info: Any) -> float:
        return _finite_positive(info.field_name, value)

    @field_validator("url")
    @classmethod
    def _os_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"opensandbox url {value!r} must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("api_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        value = value.strip("/")
        return f"/{value}" if value else ""
