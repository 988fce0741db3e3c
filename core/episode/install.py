"""The install phase: the pinned OpenCode placed in the sandbox and checked there, within its budget."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode.common import StageFailure, failure_from
from opencode_tui_core.events import Event
from opencode_tui_core.failures import DeadlineDetails, FailureEvent, FailureStage
from opencode_tui_core.sandbox.base import Sandbox, SandboxUser
from opencode_tui_core.tasks import Task

if TYPE_CHECKING:
    from opencode_tui_core.model.endpoint import ModelEndpoint
    from opencode_tui_core.runtime.installer import Installer
    from opencode_tui_core.runtime.opencode import OpenCodeHarness
    from opencode_tui_core.runtime.prepare import PreparedRuntime


@dataclass(frozen=True)
class Installed:
    """The harness that will run OpenCode, and the runtime it runs on (binary, python, layout)."""

    harness: OpenCodeHarness
    runtime: PreparedRuntime


async def install(
    sandbox: Sandbox,
    installer: Installer,
    *,
    run_id: str,
    task: Task,
    config: AgentConfig,
    endpoint: ModelEndpoint,
    user: SandboxUser,
    emit: Callable[[Event], object],
) -> Installed:
    """Build the harness and prepare its runtime; a timeout or a provider's failure ends the episode's
    agent part (``StageFailure``), keeping the provider's kind, cause and evidence."""
    from opencode_tui_core.runtime.opencode import OpenCodeHarness
    from opencode_tui_core.runtime.prepare import RuntimeNotReady, prepare_runtime

    harness = OpenCodeHarness(run_id, task, config, endpoint)
    harness.owner = user.ids  # sandbox user (issue 17)
    budget = config.budgets.install_s
    try:
        runtime = await asyncio.wait_for(
            prepare_runtime(
                sandbox,
                installer,
                harness.layout,
                emit=emit,
                version=config.runtime.opencode_version,
                budget_s=budget,
            ),
            budget,
        )
    except TimeoutError as exc:
        raise StageFailure(
            FailureEvent(
                kind="install_timeout",
                stage=FailureStage.INSTALL,
                operation="install opencode",
                message=f"installing OpenCode did not finish within {budget:g}s",
                details=DeadlineDetails(budget_s=budget),
            )
        ) from exc
    except RuntimeNotReady as exc:
        # [install causes] a provider's failure keeps its kind, cause and evidence; stage: install.
        raise StageFailure(
            failure_from(exc, "install_failed", FailureStage.INSTALL, "install opencode")
        ) from exc
    return Installed(harness=harness, runtime=runtime)


def prepared(
    runtime: PreparedRuntime,
    *,
    run_id: str,
    task: Task,
    config: AgentConfig,
    endpoint: ModelEndpoint,
    user: SandboxUser,
) -> Installed:
    """The install phase of a warm sandbox: its runtime was prepared by the batch's pool (the same
    ``prepare_runtime``, earlier); only this run's harness is built."""
    from opencode_tui_core.runtime.opencode import OpenCodeHarness

    harness = OpenCodeHarness(run_id, task, config, endpoint)
    harness.owner = user.ids  # sandbox user (issue 17)
    return Installed(harness=harness, runtime=runtime)
