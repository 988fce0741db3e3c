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

from opencode_tui_core import DEFAULT_PROVIDER
from opencode_tui_core.breaks import parse_break
from opencode_tui_core.failures import ClassificationConfig, OutcomePolicyOverrides

# The pin. Checked against registry.npmjs.org: opencode-linux-x64-musl and opencode-linux-x64-baseline-musl
# stop at 1.18.32, while opencode-linux-x64 goes on to 1.18.34 and opencode-linux-x64-baseline to 1.18.33,
# so 1.18.32 is the newest version with all four x64 packages (opencode-ai@1.18.32 lists all of them as
# optionalDependencies). The registry serves the arm64 packages only up to 1.18.18 (1.18.14, 1.18.15,
# 1.18.18), so an arm64 target fails at this pin with a message naming what the registry has.
DEFAULT_OPENCODE_VERSION = "1.18.32"
DEFAULT_REGISTRY_URL = "https://registry.npmjs.org"
DEFAULT_IMAGE = "opencode-tui/base:bookworm"
# Listen addresses that mean "every address": a proxy there needs an address to advertise.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


_MEMORY = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_memory(value: str | int) -> int:
    """``"256m"``, ``"1GiB"``, ``268435456`` → bytes."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("memory must be > 0 bytes")
        return value
    m = _MEMORY.match(value)
    if not m:
        raise ValueError(f"memory {value!r} is not a size like 256m, 1g or a number of bytes")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError("memory must be > 0 bytes")
    return n


class NetworkPolicy(StrEnum):
    """``model-only``: no network inside; the model proxy is reached through a bound Unix socket."""

    MODEL_ONLY = "model-only"
    HOST = "host"


def parse_user_spec(value: str) -> tuple[str | None, int | None, int | None]:
    """``"agent"`` → (name, None, None); ``"1000"`` → (None, 1000, None); ``"1000:1000"`` → both ids."""
    value = value.strip()
    if not value:
        raise ValueError("a sandbox user must not be empty")
    head, _, tail = value.partition(":")
    if head.isdigit():
        gid = int(tail) if tail.isdigit() else None
        if tail and gid is None:
            raise ValueError(f"sandbox user {value!r}: the group must be a number (uid:gid)")
        return None, int(head), gid
    if tail:
        raise ValueError(f"sandbox user {value!r}: give a name or uid[:gid]")
    return head, None, None


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
    for the release (see ``opencode_tui_core.session.CloseDeadline``); verification has its own deadline."""

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
    # Where the episode's recording proxy listens for sandboxes that reach it over TCP (providers
    # without a model socket, such as OpenSandbox), and the host name those sandboxes use for it.
    # The default suits sandboxes sharing this machine's network. Sandboxes in other pods (OpenSandbox
    # on Kubernetes, the engine on a Ray worker) need e.g. proxy_host 0.0.0.0 and proxy_advertise the
    # worker pod's IP. Every call must carry the episode's own token, so an address reachable by
    # others never lends them the upstream API key.
    proxy_host: str = "127.0.0.1"
    proxy_advertise: str | None = None
    # No progress is a failure (core/calls/progress.py): this many model answers in a row that gave the
    # agent nothing (an empty, choice-less, unterminated or error 2xx; no text, tool call or token), or
    # this many in the whole episode, stop the agent as ``model_empty_response``. 0 turns a limit off.
    empty_answers_limit: int = Field(default=5, ge=0)
    empty_answers_total_limit: int = Field(default=20, ge=0)
    # Token capture for RL (core/calls/token_capture.py): the proxy asks the upstream for token ids and
    # logprobs (vLLM's parameters) on every chat-completions call and records what comes back in the
    # run directory's tokens.jsonl. Off by default: the requests then go upstream exactly as OpenCode
    # sent them. An upstream that refuses unknown parameters (OpenAI's API does) refuses every call.
    capture_tokens: bool = False

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

    @field_validator("proxy_host", "proxy_advertise")
    @classmethod
    def _host(cls, value: str | None, info: Any) -> str | None:
        if value is None:
            return value
        host = value.strip().strip("[]")
        if not host or any(c in host for c in "/ @?#") or (host.count(":") == 1):
            raise ValueError(
                f"model.{info.field_name} {value!r} must be a host name or an IP address (no scheme, "
                "port or path), e.g. 127.0.0.1 or 10.0.3.7"
            )
        return host

    @model_validator(mode="after")
    def _advertised(self) -> ModelSettings:
        if self.proxy_advertise in WILDCARD_HOSTS:
            raise ValueError(
                f"model.proxy_advertise {self.proxy_advertise} is not an address a sandbox can reach: "
                "give this machine's address as the sandboxes see it (e.g. the pod IP)"
            )
        if self.proxy_host in WILDCARD_HOSTS and self.proxy_advertise is None:
            raise ValueError(
                f"model.proxy_host {self.proxy_host} listens on every address, so sandboxes cannot be "
                "told where to reach the proxy: set model.proxy_advertise to this machine's address as "
                "the sandboxes see it (e.g. the pod IP)"
            )
        return self

    @property
    def proxy_address(self) -> str:
        """The host part of the proxy URL given to sandboxes (IPv6 in brackets)."""
        host = self.proxy_advertise or self.proxy_host
        return f"[{host}]" if ":" in host else host


class SandboxConfig(_Model):
    """Which provider, owned or borrowed, and the network policy of owned sandboxes.

    A provider's own settings are under its name (``sandbox.opensandbox:``, ``sandbox.docker:``), in
    the model that provider defines (core/provider_registry.py); ``settings_for`` returns them. Any
    other unknown key is an error naming it, as everywhere in the config.
    """

    # Extra keys are allowed only so that they can be provider settings: _provider_settings
    # validates each against its provider's model and refuses every other one.
    model_config = ConfigDict(extra="allow")

    provider: str = DEFAULT_PROVIDER
    mode: Literal["owned", "borrowed"] = "owned"
    sandbox_id: str | None = None  # required when borrowed
    network: NetworkPolicy = NetworkPolicy.MODEL_ONLY
    image: str | None = None  # overrides the task's image
    # Who the agent, the shell and the verifier run as (a name, uid or uid:gid); overrides the task's
    # ``user:`` and the image's own user.
    user: str | None = None
    keep_sandbox: bool = False

    @field_validator("provider")
    @classmethod
    def _registered(cls, value: str) -> str:
        from opencode_tui_core import provider_registry as registry

        return registry.get(value).name  # loaded now: a broken plug-in is a config error too

    @model_validator(mode="before")
    @classmethod
    def _provider_settings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        extra = [key for key in data if key not in cls.model_fields]
        if not extra:
            return data
        from opencode_tui_core import provider_registry as registry

        data = dict(data)
        errors: list[Any] = []
        for key in extra:
            if key not in registry.names():
                errors.append({"type": "extra_forbidden", "loc": (key,), "input": data[key]})
                continue
            try:
                data[key] = registry.get(key).settings(data[key])
            except registry.PluginLoadError as exc:
                errors.append(
                    {"type": "value_error", "loc": (key,), "input": data[key], "ctx": {"error": exc}}
                )
            except ValidationError as exc:
                for err in exc.errors():
                    detail = {"type": err["type"], "loc": (key, *err["loc"]), "input": err["input"]}
                    if "ctx" in err:
                        detail["ctx"] = err["ctx"]
                    errors.append(detail)
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return data

    def settings_for(self, provider: str | None = None) -> BaseModel:
        """The settings of ``provider`` (default: the configured one), its defaults when not given."""
        from opencode_tui_core import provider_registry as registry

        name = provider or self.provider
        given = (self.model_extra or {}).get(name)
        return registry.get(name).settings(given)

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
    registry_url: str = DEFAULT_REGISTRY_URL
    cache_dir: str | None = None


class HealthThresholds(_Model):
    """When core/health.py warns that an episode is going badly (warnings only: never the outcome).

    Each warning fires once per occurrence (a storm, a silent command, a repeated call), not per event.
    """

    enabled: bool = True
    # ``compaction_storm``: this many compactions within the window, or the first agent call after a
    # compaction still using at least this share of the context window (the loop where compaction
    # frees nothing and OpenCode compacts again at once).
    compaction_storm_count: int = Field(default=3, ge=2)
    compaction_storm_window_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    compaction_near_limit_ratio: float = Field(default=0.8, gt=0, le=1)
    # ``reads_without_edits``: this many file reads (read, grep, glob, list) without one file edit
    # (edit, write, patch, multiedit); a bash command counts as neither (what it did is unknown).
    reads_without_edits: int = Field(default=40, ge=1)
    # ``command_silent``: a running bash command printed nothing for this long.
    command_silent_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    # ``repeated_tool_call``: the same tool with the same arguments this many times among the last
    # ``repeated_tool_call_window`` tool calls.
    repeated_tool_call: int = Field(default=3, ge=2)
    repeated_tool_call_window: int = Field(default=10, ge=2)
    # ``retry_storm``: this many model calls answered 429 or 5xx within the window.
    retry_storm_count: int = Field(default=4, ge=2)
    retry_storm_window_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    # ``empty_answers``: this many model answers in a row gave the agent nothing (below
    # ``model.empty_answers_limit``, which ends the episode, so the warning comes first).
    empty_answers: int = Field(default=3, ge=1)


# The process limit of an owned sandbox unless the task or the config says otherwise: room for a build
# with parallel jobs, not for a fork bomb.
DEFAULT_PIDS_LIMIT = 1024


class SandboxLimits(_Model):
    """Limits every owned sandbox gets; a task's own ``limits:`` (pids, disk) take precedence."""

    pids: int | None = Field(default=DEFAULT_PIDS_LIMIT, ge=1)  # None: no process limit
    disk: str | int | None = None  # the writable space (e.g. "2g"); None: not limited
    # A limit asked for that the provider cannot enforce (docker's disk limit on overlay2 over extfs):
    # ``warn`` runs anyway and says so (header, batch line, run.json); ``strict`` refuses to start.
    enforce: Literal["warn", "strict"] = "warn"

    @field_validator("disk")
    @classmethod
    def _disk(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            parse_memory(value)
        return value


class RaySettings(_Model):
    """Where a Ray batch runs (``executor.name: ray``); see docs/scaling.md."""

    # The cluster (``HOST:PORT`` of its head, or ``ray://…`` for Ray Client); None: Ray's own choice
    # (``$RAY_ADDRESS``, else a cluster already running on this machine, else a new local one).
    address: str | None = None
    # Ray's CPU resource per episode attempt: how many attempts share a node (its CPUs / this).
    num_cpus_per_episode: float = Field(default=1.0, gt=0, le=1024)


class ExecutorSettings(_Model):
    """Where a batch's episodes run: this process (``local``, the default), a Ray cluster, or another
    registered executor."""

    name: str = "local"  # a registered executor (core/executor_registry.py)
    ray: RaySettings = Field(default_factory=RaySettings)

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        from opencode_tui_core import executor_registry

        return executor_registry.check_name(value)


class BatchSettings(_Model):
    """How a batch runs its episodes (``run --batch``, the local executor)."""

    # Warm sandboxes prepared ahead of the running episodes (sandbox created, OpenCode installed),
    # each used by exactly one episode (core/episode/pool.py). 0: off. None: sized to the free CPU
    # (``warm_depth``: one per core not taken by ``--jobs``, at most 4; none when every core runs an
    # episode, where preparing ahead would only slow the running ones).
    warm: int | None = Field(default=None, ge=0, le=64)
    # A prepared sandbox older than this is released unused (counted as discarded), never used.
    warm_max_age_s: float = Field(default=600.0, gt=0)


def warm_depth(settings: BatchSettings, jobs: int, cpus: int | None) -> int:
    """The pool depth: the configured one, else a core per warm sandbox beyond the ``jobs`` running."""
    if settings.warm is not None:
        return settings.warm
    return max(0, min(4, (cpus or 1) - max(1, jobs)))


class DebugSettings(_Model):
    """The episode debugger (issue 27): where the recording proxy holds agent calls from the start
    (``run --break COND``); more can be set live through the run's control socket."""

    breaks: list[str] = Field(
        default_factory=list
    )  # opencode_tui_core.breaks syntax: next, call:N, tool:NAME, ...
    # A digest of the workspace before each agent model call (workspace_digests.jsonl): what a fork
    # at that step must reproduce (issue 28). On unless false (None, the default, is on: a run recorded
    # before this setting existed reads the same, `diff` sees no drift); always on in a rerun or fork.
    # Its cost: benchmarks/fork.py --digests-only (one server process per run, ~0.1-0.5 % of the agent
    # phase).
    workspace_digests: bool | None = None

    @field_validator("breaks")
    @classmethod
    def _parse(cls, value: list[str]) -> list[str]:
        return [parse_break(b).words for b in value]


class AgentConfig(_Model):
    """Everything that configures a run; the defaults are the embedded defaults (local, scripted)."""

    budgets: Budgets = Field(default_factory=Budgets)
    model: ModelSettings = Field(default_factory=ModelSettings)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    policy: OutcomePolicyOverrides = Field(default_factory=OutcomePolicyOverrides)
    classification: ClassificationConfig | None = None
    health: HealthThresholds = Field(default_factory=HealthThresholds)
    runs_dir: str = "runs"
    theme: str = "opencode-dark"
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)
    debug: DebugSettings = Field(default_factory=DebugSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)


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
    data = deep_merge(data, overrides or {})
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path or "config"))) from exc


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Fields a task may NOT set, with the reason shown to the user (``opencode_tui_core.tasks.load_task`` says it): the
# engine always runs the pinned OpenCode under its supervisor, in the sandbox the task describes.
REFUSED_TASK_FIELDS = {
    "env": "custom sandbox environment variables are not supported; bake them into the task image or "
    "the task files",
    "command": "a custom agent command is not supported; the engine always runs the pinned OpenCode "
    "under its supervisor",
    "extra_args": "extra OpenCode CLI arguments are not supported; use the config file's model and "
    "budget settings",
    "cli_args": "extra OpenCode CLI arguments are not supported; use the config file's model and "
    "budget settings",
}
