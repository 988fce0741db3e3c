"""The agent phase: OpenCode under the uploaded supervisor, its output streamed to the run directory.

Two steps, so the episode holds the session before anything is staged (a cancel asks its supervisor
to stop): ``open_session`` → ``run_agent``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.artifacts import RunDir
from core.episode.install import Installed
from core.events import Event
from core.runtime.supervisor_client import CleanupReceipt
from core.sandbox.base import ExecResult, Sandbox, SandboxUser
from core.session import SandboxSession
from core.tasks import Task


@dataclass(frozen=True)
class AgentRun:
    """The harness exec as the provider saw it (the receipt, read at the close, says the rest)."""

    result: ExecResult


def open_session(
    sandbox: Sandbox,
    installed: Installed,
    *,
    run_budget_s: float,
    close_budget_s: float,
    user: SandboxUser,
    emit: Callable[[Event], object],
) -> SandboxSession:
    return SandboxSession(
        sandbox,
        installed.harness.layout.session_dir,
        run_timeout_s=run_budget_s,
        close_timeout_s=close_budget_s,
        python=installed.runtime.python,
        emit=emit,
        owner=user.ids,  # sandbox user (issue 17)
    )


async def run_agent(
    session: SandboxSession,
    installed: Installed,
    *,
    task: Task,
    run_dir: RunDir,
    emit: Callable[[Event], object],
) -> AgentRun:
    """Stage and launch the harness under the supervisor and wait for it (within the run deadline).

    OpenCode's database and logs come into the run directory only after confirmed cleanup (the
    session's ``collect`` hook)."""
    harness = installed.harness

    async def collect(sandbox: Sandbox, receipt: CleanupReceipt) -> None:
        await harness.collect(sandbox, run_dir)

    argv, env = harness.command(installed.runtime)
    harness.record_inputs(run_dir)  # the prompt and instructions as sent (run directory)
    result = await session.execute(
        argv,
        files=harness.staged_files(installed.runtime),  # one upload with the session's own files
        collect=collect,
        stdin=harness.prompt_bytes(),
        env=env,
        cwd=task.workdir,
        on_output=harness.on_output(emit, run_dir),
    )
    harness.flush(emit)
    return AgentRun(result=result)
