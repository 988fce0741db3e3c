"""Run configuration: budgets, model settings, sandbox selection, runtime pin, failure policy.

Every model forbids unknown fields, so a typo in a config file is an error naming the field, not a
silently ignored setting. ``load_config`` reads YAML or TOML and formats validation errors for humans.
"""

from __future__ import annotations

import math
import re
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.failures import ClassificationConfig, OutcomePolicyOverrides
from core.sandbox.base import NetworkPolicy, parse_user_spec

DEFAULT_OPENCODE_VERSION = "1.18.32"
DEFAULT_IMAGE = "opencode-tui/base:bookworm"


class ConfigError(ValueError):
    """A configuration or request problem, phrased for the user (what is wrong, what to do)."""


def _finite_positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds greater than 0 (got {value!r})")
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budgets(_Model):
    """Time budgets in seconds; all finite and > 0. ``close_s`` bounds the whole close (stop and
    receipt, collect, inspect, transcript export, release) as one deadline; a quarter of it is kept
    for the release (see ``core.session.CloseDeadline``); verification has its own deadline."""

    run_s: float = 10800.0
    install_s: float = 600.0
    close_s: float = 60.0

    @field_validator("run_s", "install_s", "close_s")
    @classmethod
    def _check(cls, value: float, info: Any) -> float:
        return _finite_positive(info.field_name, value)


class ModelSettings(_Model):
    """The model OpenCode talks to (through the recording proxy).

    ``context_window`` and ``output_cap`` are independent: lowering the output cap never shrinks
    the context window OpenCode assumes.
    """

    name: str = "scripted"
    url: str | None = None  # None: the embedded scripted model replays the task's trajectory
    api_key_env: str | None = None
    context_window: int = Field(default=262144, gt=0)
    output_cap: int = Field(default=32768, gt=0)
    thinking: bool = True
    request_timeout_s: float = 600.0  # a whole model request
    stall_timeout_s: float = 300.0  # the longest silence between streamed chunks before OpenCode retries

    @field_validator("request_timeout_s", "stall_timeout_s")
    @classmethod
    def _timeout(cls, value: float, info: Any) -> float:
        return _finite_positive(info.field_name, value)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"model url {value!r} must start with http:// or https://")
        return value.rstrip("/") if value else value


class ProviderName(StrEnum):
    LOCAL = "local"
    DOCKER = "docker"
    OPENSANDBOX = "opensandbox"


# ------------------------------------------------------------------------------------ OpenSandbox


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
    # OOM evidence (core.sandbox.oom). The lifecycle status's ``reason`` is a machine-readable code:
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


class SandboxConfig(_Model):
    """Which provider, owned or borrowed, and the network policy of owned sandboxes."""

    provider: ProviderName = ProviderName.LOCAL
    mode: Literal["owned", "borrowed"] = "owned"
    sandbox_id: str | None = None  # required when borrowed
    network: NetworkPolicy = NetworkPolicy.MODEL_ONLY
    image: str | None = None  # overrides the task's image
    # Who the agent, the shell and the verifier run as (a name, uid or uid:gid); overrides the task's
    # ``user:`` and the image's own user.
    user: str | None = None
    keep_sandbox: bool = False
    opensandbox: OpenSandboxSettings = Field(default_factory=OpenSandboxSettings)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None:
            parse_user_spec(value)
        return value

    @model_validator(mode="after")
    def _borrowed_needs_id(self) -> SandboxConfig:
        if self.mode == "borrowed" and not self.sandbox_id:
            raise ValueError("sandbox.mode 'borrowed' needs sandbox.sandbox_id (the sandbox to attach to)")
        if self.mode == "owned" and self.sandbox_id:
            raise ValueError("sandbox.sandbox_id is only meaningful with sandbox.mode 'borrowed'")
        return self


# ``runtime.permissions`` profiles; what each means to OpenCode is core/runtime/opencode.py's
# PERMISSION_PROFILES.
PermissionProfile = Literal["default", "allow-all"]


class RuntimeSettings(_Model):
    opencode_version: str = DEFAULT_OPENCODE_VERSION
    # ``serve``: OpenCode's server event stream (running commands' output and text live); ``run``:
    # ``opencode run --format json`` (tool calls shown once finished), kept as a fallback.
    harness: Literal["serve", "run"] = "serve"
    # What OpenCode may do without asking (nobody can answer an ask: it is rejected and the turn ends as
    # ``agent_permission_rejected``). ``default``: OpenCode's own rules (it asks before touching a path
    # outside the workdir, reading a ``.env`` file, or repeating one tool call three times) with edit
    # and bash allowed; ``allow-all``: nothing is asked. Web fetches are denied either way.
    permissions: PermissionProfile = "default"
    registry_url: str = "https://registry.npmjs.org"
    cache_dir: str | None = None


class RaySettings(_Model):
    """Where a Ray batch runs (``executor.name: ray``); see docs/scaling.md."""

    # The cluster (``HOST:PORT`` of its head, or ``ray://…`` for Ray Client); None: Ray's own choice
    # (``$RAY_ADDRESS``, else a cluster already running on this machine, else a new local one).
    address: str | None = None
    # Ray's CPU resource per episode attempt: how many attempts share a node (its CPUs / this).
    num_cpus_per_episode: float = Field(default=1.0, gt=0, le=1024)


class ExecutorSettings(_Model):
    """Where a batch's episodes run: this process (``local``, the default) or a Ray cluster."""

    name: Literal["local", "ray"] = "local"
    ray: RaySettings = Field(default_factory=RaySettings)


class AgentConfig(_Model):
    """Everything that configures a run; the defaults are the embedded defaults (local, scripted)."""

    budgets: Budgets = Field(default_factory=Budgets)
    model: ModelSettings = Field(default_factory=ModelSettings)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    policy: OutcomePolicyOverrides = Field(default_factory=OutcomePolicyOverrides)
    classification: ClassificationConfig | None = None
    runs_dir: str = "runs"
    theme: str = "opencode-dark"
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)


def yaml_error_text(exc: Exception) -> str:
    """A YAML (or TOML) parse error on one line: what is wrong and where."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


def format_validation_error(exc: ValidationError, where: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (not supported here; check the spelling or remove it)"
        lines.append(f"{where}: {loc}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> AgentConfig:
    """Read a YAML or TOML config file (or none) and apply ``overrides`` (nested dicts) on top."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            raw = p.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from exc
        try:
            loaded = tomllib.loads(raw) if p.suffix == ".toml" else yaml.safe_load(raw)
        except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
            kind = "TOML" if p.suffix == ".toml" else "YAML"
            raise ConfigError(f"config file {p} is not valid {kind}: {yaml_error_text(exc)}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        data = loaded
    data = _deep_merge(data, overrides or {})
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path or "config"))) from exc


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Fields a caller may NOT set on a sandbox session, with the reason shown to the user.
_REFUSED_SESSION_FIELDS = {
    "env": "custom sandbox environment variables are not supported for sandbox sessions; bake them into "
    "the task image or the task files",
    "command": "a custom command is not supported for sandbox sessions; the engine always runs the pinned "
    "OpenCode under its supervisor",
    "extra_args": "extra OpenCode CLI arguments are not supported for sandbox sessions; use the config "
    "file's model/budget settings",
    "cli_args": "extra OpenCode CLI arguments are not supported for sandbox sessions; use the config "
    "file's model/budget settings",
}


class SessionRequest(_Model):
    """What a caller may ask of one sandbox session: an explicit allow-list of fields."""

    task_id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    workdir: str
    run_timeout_s: float | None = None
    instructions: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, why in _REFUSED_SESSION_FIELDS.items():
                if name in data:
                    raise ValueError(f"field '{name}' is refused: {why}")
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                allowed = ", ".join(cls.model_fields)
                raise ValueError(
                    f"unsupported field(s) {', '.join(repr(u) for u in unknown)}; allowed: {allowed}"
                )
        return data

    @field_validator("run_timeout_s")
    @classmethod
    def _timeout(cls, value: float | None) -> float | None:
        return None if value is None else _finite_positive("run_timeout_s", value)
