"""Sandbox providers as plug-ins, found through the entry-point group ``opencode_tui.providers``.

A provider package declares one entry point whose object is a ``ProviderPlugin``: its name, its
settings model, what it can do (``Capabilities``), its ``preflight()`` checks (what ``doctor`` prints)
and a factory for the ``SandboxProvider``. The CLI's ``--provider`` choices, ``doctor``, ``sweep``
and the config's ``sandbox.provider`` all come from here, and the engine asks capabilities instead of
comparing provider names. docs/providers.md says how a new provider is added.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.plugins import Registry

# The names and the built-in table live in core/provider_names.py (read without loading a plug-in).
from opencode_tui_core.provider_names import BUILTIN, ENTRY_POINT_GROUP

if TYPE_CHECKING:
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.sandbox.base import SandboxProvider
    from opencode_tui_core.sandbox.oom import OomRule


class Capabilities(BaseModel):
    """What a provider can do. The engine, the CLI and the contract tests ask these, never the name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Model-only network: no network inside, and the model proxy's host Unix socket bound at
    # SANDBOX_MODEL_SOCKET (OpenCode then reaches the model through the in-sandbox relay).
    model_socket: bool = False
    memory_limit: bool = False  # spec.memory_bytes is enforced (where the host allows; status() says)
    cpu_limit: bool = False  # spec.cpus is enforced
    pids_limit: bool = False
    disk_limit: bool = False
    pty: bool = False  # pty(): an interactive terminal (the TUI's shell, attach)
    # Evidence sources from which an OOM kill can be confirmed: each has a rule, core's
    # (opencode_tui_core.sandbox.oom.CORE_RULES) or the plug-in's own (ProviderPlugin.oom_rules).
    oom_evidence: frozenset[str] = frozenset()
    borrowed: bool = False  # connect() to a sandbox it did not create (sandbox.mode: borrowed)
    images: bool = False  # spec.image is what runs (False: the host's own system)
    # A task's image can be built from its Dockerfile on the provider's engine (core/image_build.py).
    image_build: bool = False
    users: bool = False  # spec.user and exec(user=...) run as another uid than the provider's own
    host_mounts: bool = False  # spec.mounts: host paths appear inside (else files are uploaded)
    listing: bool = False  # listed()/remove(): sweep and attach can find its sandboxes
    # Listing needs nothing configured (no server to name), so a bare ``sweep`` covers it.
    sweep_by_default: bool = False
    # A batch may prepare its sandboxes ahead of the episodes that take them (core/episode/pool.py):
    # created before the episode exists, alongside the running ones, and labelled so that ``sweep``
    # finds an unused one after a SIGKILL.
    warm: bool = False


class Check(BaseModel):
    """One preflight result, as ``doctor`` prints it: ``fail`` makes doctor exit non-zero."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    status: Literal["ok", "warn", "fail"]
    detail: str


class ProviderPlugin(abc.ABC):
    """One sandbox provider as the rest of the program sees it (the entry point's object)."""

    name: str
    summary: str = ""  # one line for help texts
    settings_model: type[BaseModel]  # pydantic, extra="forbid"; the config's ``sandbox.<name>:``
    capabilities: Capabilities = Capabilities()
    # How each kind of OOM evidence this provider produces confirms a kill (opencode_tui_core.sandbox.oom): a
    # provider with a new kind of evidence contributes its rule here, core iterates over them.
    oom_rules: Sequence[OomRule] = ()

    @abc.abstractmethod
    def provider(self, settings: BaseModel) -> SandboxProvider:
        """The factory: a provider configured by ``settings`` (an instance of ``settings_model``)."""

    def settings(self, raw: Mapping[str, Any] | BaseModel | None = None) -> BaseModel:
        """``raw`` validated by this provider's settings model (``ValidationError`` names the field)."""
        if isinstance(raw, self.settings_model):
            return raw
        if isinstance(raw, BaseModel):
            raw = raw.model_dump()
        return self.settings_model.model_validate(raw or {})

    async def preflight(self, config: AgentConfig) -> list[Check]:
        """What ``doctor`` checks and prints for this provider (may create a throwaway sandbox)."""
        return []

    async def admit(self, config: AgentConfig, images: Sequence[str]) -> list[Check]:
        """Quick checks before a run of owned sandboxes from ``images`` (a ``fail`` refuses the run)."""
        return []

    async def build_image(self, task: Any, config: AgentConfig, log: Callable[[str], None]) -> str:
        """Build ``task.image`` from ``task.build`` (only for ``capabilities.image_build``): the tag.
        ``log`` takes the build's output as it comes (from any thread). Raises
        ``opencode_tui_core.sandbox.errors.ImageBuildFailed`` (``image_build_failure``) with the log's end as evidence."""
        raise NotImplementedError(f"the {self.name} provider builds no images")

    def short_id(self, sandbox_id: str) -> str:
        """How a sandbox id is shown to a person (``sweep`` accepts any unique prefix)."""
        return sandbox_id


class UnknownProviderError(ValueError):
    """A provider name no plug-in registers; the message lists the registered ones."""


class PluginLoadError(ValueError):
    """A registered plug-in could not be loaded or is not a ProviderPlugin (a ValueError so that a
    config naming it fails validation with this message)."""


_REGISTRY: Registry[ProviderPlugin] = Registry(
    ENTRY_POINT_GROUP, BUILTIN, "sandbox provider", ProviderPlugin, UnknownProviderError, PluginLoadError
)


def names() -> list[str]:
    """Every registered provider name, sorted."""
    return _REGISTRY.names()


def check_name(name: str) -> str:
    return _REGISTRY.check_name(name)


def get(name: str) -> ProviderPlugin:
    """The plug-in registered as ``name`` (loaded once)."""
    return _REGISTRY.get(name)


def plugins() -> list[ProviderPlugin]:
    return [get(name) for name in names()]


def swept_by_default() -> list[str]:
    """The providers a bare ``sweep`` (``--provider all``) covers: those listing without configuration.

    A plug-in that cannot be loaded is left out here (the command that names it reports why)."""
    out = []
    for name in names():
        try:
            caps = get(name).capabilities
        except PluginLoadError:
            continue
        if caps.listing and caps.sweep_by_default:
            out.append(name)
    return out
