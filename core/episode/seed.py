"""The seed phase: a sandbox (created, or borrowed), its user decided once, the task's inputs staged.

Three steps, so the episode holds the sandbox the moment it exists (a cancel or a failure after
``allocate`` must still release it): ``allocate`` → ``identify`` → ``stage``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode.common import StageFailure, failure_from
from opencode_tui_core.events import Event, SandboxReady
from opencode_tui_core.failures import FailureStage
from opencode_tui_core.runtime import access
from opencode_tui_core.sandbox.base import (
    LABEL_BATCH,
    LABEL_OWNER,
    LABEL_RUN,
    ExpectedRefusal,
    Mount,
    Sandbox,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
    SandboxStatus,
    SandboxUser,
    default_owner,
)
from opencode_tui_core.tasks import Task

if TYPE_CHECKING:
    from opencode_tui_core.episode.ahead import ServerAhead
    from opencode_tui_core.model.endpoint import ModelEndpoint
    from opencode_tui_core.runtime.installer import Installer


@dataclass(frozen=True)
class Seeded:
    """Who the sandbox runs as, and what its provider can enforce."""

    user: SandboxUser
    status: SandboxStatus


def default_installer(config: AgentConfig) -> Installer:
    """The OpenCode installer the configuration asks for (its cache is shared between episodes)."""
    from opencode_tui_core.runtime.installer import Installer, InstallerConfig

    fields: dict[str, object] = {
        "version": config.runtime.opencode_version,
        "registry_url": config.runtime.registry_url,
        "timeout_s": config.budgets.install_s,
    }
    if config.runtime.cache_dir:
        fields["cache_dir"] = Path(config.runtime.cache_dir)
    return Installer(InstallerConfig.model_validate(fields))


def model_socket(config: AgentConfig, endpoint: ModelEndpoint) -> str | None:
    """The model endpoint's Unix socket, when the sandbox reaches the model only through it."""
    return endpoint.unix_path if config.sandbox.network == "model-only" else None


def owned_spec(
    config: AgentConfig,
    task: Task,
    run_id: str,
    *,
    socket: str | None,
    cache_dir: Path,
    requested_user: str | None,
    labels: dict[str, str],
) -> SandboxSpec:
    """An owned sandbox for ``task`` (the warm pool builds the same one ahead of its episode)."""
    from opencode_tui_core.runtime.prepare import RUNTIME_CACHE_MOUNT

    sb = config.sandbox
    return SandboxSpec(
        run_id=run_id,
        image=sb.image or task.image,
        workdir=task.workdir,
        memory_bytes=task.limits.memory_bytes,
        cpus=task.limits.cpus,
        pids_limit=task.limits.pids_limit(config.limits),
        disk_bytes=task.limits.disk_bytes(config.limits),
        network=sb.network,
        model_socket=socket,
        mounts=[Mount(source=str(cache_dir), target=RUNTIME_CACHE_MOUNT)],
        user=requested_user,
        labels={LABEL_RUN: run_id, LABEL_OWNER: default_owner(), **labels},
    )


async def allocate(
    provider: SandboxProvider,
    config: AgentConfig,
    task: Task,
    run_id: str,
    *,
    endpoint: ModelEndpoint,
    cache_dir: Path,
    requested_user: str | None,
    batch_id: str | None = None,
) -> Sandbox:
    """Connect to the borrowed sandbox, or create an owned one (no network but the model's socket,
    the installer's cache mounted read-only, labels naming the run, its batch and its owner for
    ``sweep``).

    ``ExpectedRefusal`` passes through (a refusal is control flow); a provider's other failure is the
    seed phase's ``sandbox_allocation_failed``."""
    sb = config.sandbox
    # The cache is bind-mounted read-only into owned sandboxes; it must exist before the mount.
    Path(cache_dir).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    try:
        if sb.mode == "borrowed":
            assert sb.sandbox_id is not None
            return await provider.connect(sb.sandbox_id)
        spec = owned_spec(
            config,
            task,
            run_id,
            socket=model_socket(config, endpoint),
            cache_dir=cache_dir,
            requested_user=requested_user,
            labels={"opencode-tui.task": task.id, **({LABEL_BATCH: batch_id} if batch_id else {})},
        )
        return await provider.create(spec)
    except ExpectedRefusal:
        raise
    except SandboxError as exc:
        raise StageFailure(
            failure_from(exc, "sandbox_allocation_failed", FailureStage.SEED, "create sandbox")
        ) from exc


async def identify(
    sandbox: Sandbox,
    requested_user: str | None,
    user_source: Literal["image", "config", "task"],
    *,
    borrowed: bool,
    emit: Callable[[Event], object],
) -> Seeded:
    """What the provider enforces, and who the sandbox user is (issue 17), decided once."""
    status = await sandbox.status()
    try:
        user = await access.establish_user(sandbox, requested_user, user_source, borrowed=borrowed, emit=emit)
    except SandboxError as exc:
        raise StageFailure(
            failure_from(exc, "command_failed", FailureStage.SEED, "identify the sandbox user")
        ) from exc
    return Seeded(user=user, status=status)


def ready(sandbox: Sandbox, seeded: Seeded, config: AgentConfig) -> SandboxReady:
    """The event saying the sandbox is there, as whom it runs and what its provider enforces."""
    user, status = seeded.user, seeded.status
    return SandboxReady(
        sandbox_id=sandbox.sandbox_id,
        provider=sandbox.provider,
        owned=sandbox.owned,
        network=config.sandbox.network.value,
        memory_limit_enforced=status.memory_limit_enforced,
        pids_limit_enforced=status.pids_limit_enforced,
        disk_limit_enforced=status.disk_limit_enforced,
        notes=status.notes,
        user=user.label,
        uid=user.uid,
        gid=user.gid,
        user_source=user.source,
    )


def refuse_unenforced(ready: SandboxReady, config: AgentConfig) -> None:
    """``limits.enforce: strict``: a limit that was asked for and cannot be enforced refuses the run
    before anything is staged or launched (``ExpectedRefusal``: the outcome ``refused``, exit 2)."""
    missing = ready.unenforced_limits
    if config.limits.enforce != "strict" or not missing:
        return
    why = "; ".join(n for n in ready.notes if "not enforced" in n) or "the provider says it cannot"
    raise ExpectedRefusal(
        f"the {' and '.join(missing)} limit asked for cannot be enforced by the {ready.provider} "
        f"provider ({why}); limits.enforce is strict, so nothing was started. Use a provider that "
        "enforces it, or limits.enforce: warn to run without it",
        operation="enforce limits",
        code="limit_not_enforced",
        http_status=None,
    )


async def stage(
    sandbox: Sandbox,
    config: AgentConfig,
    task: Task,
    user: SandboxUser,
    endpoint: ModelEndpoint,
    ahead: ServerAhead | None = None,
) -> None:
    """The task files, workdir and model socket made the sandbox user's; then the preflight. With a
    server started ahead, its runner unpacks and checks them (one step, no round trip to the provider)."""
    socket = model_socket(config, endpoint) if config.sandbox.mode == "owned" else None
    try:
        if ahead is not None:
            if socket is not None:
                access.grant_model_socket(sandbox, user, socket)
            await ahead.stage(task, user, model_socket=socket is not None)
        else:
            await access.stage_inputs(sandbox, task.files_dir, task.workdir, user, socket)
    except access.SandboxPermissionDenied as exc:
        raise StageFailure(exc.failure) from exc
    except SandboxError as exc:
        raise StageFailure(
            failure_from(exc, "sandbox_file_failed", FailureStage.SEED, "copy task files")
        ) from exc
