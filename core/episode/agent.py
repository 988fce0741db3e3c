"""The agent phase: OpenCode under the uploaded supervisor, its output streamed to the run directory.

Two steps, so the episode holds the session before anything is staged (a cancel asks its supervisor
to stop): ``open_session`` → ``run_agent``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from opencode_tui_core.artifacts import RunDir
from opencode_tui_core.episode.install import Installed
from opencode_tui_core.events import Event, ToolCall, Warning_
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.runtime.supervisor_client import CleanupReceipt
from opencode_tui_core.sandbox.base import ExecResult, Sandbox, SandboxUser
from opencode_tui_core.session import SandboxSession
from opencode_tui_core.tasks import Task

if TYPE_CHECKING:
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.episode.ahead import ServerAhead
    from opencode_tui_core.runtime.opencode import OpenCodeHarness

# After the agent ends, how long the live fault watch may take for its last look.
FAULT_WATCH_FINAL_S = 3.0


def run_budget_of(task: Task, config: AgentConfig) -> float:
    """The agent's run budget: the config's, capped by the task's own limit."""
    cap = task.limits.run_s
    return min(config.budgets.run_s, cap) if cap else config.budgets.run_s


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
    started_at: datetime | None = None,
    ahead: ServerAhead | None = None,
) -> AgentRun:
    """Stage and launch the harness under the supervisor and wait for it (within the run deadline).
    ``ahead``: the harness was launched by the warm pool (``session`` is its session) and waits for
    its task, which this hands over instead.

    OpenCode's database and logs come into the run directory only after confirmed cleanup (the
    session's ``collect`` hook)."""
    harness = installed.harness

    async def collect(sandbox: Sandbox, receipt: CleanupReceipt) -> None:
        await harness.collect(sandbox, run_dir)

    argv, env = harness.command(installed.runtime)
    harness.record_inputs(run_dir)  # the prompt and instructions as sent (run directory)
    shells = _Shells()

    def tracked(event: Event) -> object:
        shells.see(event)
        return emit(event)

    stop = asyncio.Event()
    watch = asyncio.ensure_future(
        _watch_faults(session.sandbox, stop, shells, harness, emit, started_at or utcnow())
    )
    try:
        if ahead is not None:
            result = await ahead.run(harness, harness.on_output(tracked, run_dir), emit, collect)
        else:
            result = await session.execute(
                argv,
                files=harness.staged_files(installed.runtime),  # one upload with the session's own files
                collect=collect,
                stdin=harness.prompt_bytes(),
                env=env,
                cwd=task.workdir,
                on_output=harness.on_output(tracked, run_dir),
            )
    except BaseException:
        watch.cancel()
        raise
    stop.set()  # the watch takes one last look (a kill at the very end), within its deadline
    try:
        await asyncio.wait({watch}, timeout=FAULT_WATCH_FINAL_S)
    finally:
        watch.cancel()  # nothing once it has ended
    harness.flush(tracked)
    return AgentRun(result=result)


class _Shells:
    """The agent's shell commands with when they ran (call id -> command, start, end), to name the one
    a fault happened during: the fault is reported after it happened, maybe after the command ended."""

    # The command's running event reaches us after it started: OpenCode reports it over its event
    # stream, seconds late on a busy machine (a disk filled by ``dd`` is full within a second).
    START_SLACK = timedelta(seconds=5)
    END_SLACK = timedelta(seconds=1)  # the fault watch polls (0.2 s); its report may follow the end

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, datetime, datetime | None]] = {}

    def see(self, event: Event) -> None:
        if not isinstance(event, ToolCall) or event.tool != "bash":
            return
        command, started, _ = self.calls.get(
            event.call_id, (str(event.input.get("command", "")), event.ts, None)
        )
        self.calls[event.call_id] = (command, started, None if event.status == "running" else event.ts)

    def during(self, ts: datetime) -> tuple[str | None, str | None]:
        """The latest command that was running at ``ts``: (call id, command), or (None, None)."""
        # A command seen running at ``ts`` first; only then one whose running event came late, or that
        # had just ended (a full disk is seen by a poll: the writing command may have failed already).
        for start_slack, end_slack in ((timedelta(0), timedelta(0)), (self.START_SLACK, self.END_SLACK)):
            for call_id, (command, started, ended) in reversed(self.calls.items()):
                if started - start_slack <= ts and (ended is None or ended + end_slack >= ts):
                    return call_id, command
        return None, None


async def _watch_faults(
    sandbox: Sandbox,
    stop: asyncio.Event,
    shells: _Shells,
    harness: OpenCodeHarness,
    emit: Callable[[Event], object],
    started_at: datetime,
) -> None:
    """Each kernel kill or full disk the provider sees while the agent runs: an event (at the time it
    happened, naming the shell command then running) and a line in the terminal. Observation only:
    a watch that fails is said once and the close-time check stays the authority."""
    try:
        async for fault in sandbox.watch_faults(stop):
            call_id, command = shells.during(fault.ts)
            fault = fault.model_copy(update={"tool_call_id": call_id, "tool_command": command})
            emit(fault)
            for event in harness.on_fault(fault, _offset(fault.ts, started_at)):
                emit(event)
    except Exception as exc:
        emit(Warning_(code="fault_watch_failed", message=f"the live watch for kernel kills stopped: {exc}"))


def _offset(ts: datetime, start: datetime) -> str:
    seconds = max(int((ts - start).total_seconds()), 0)
    return f"+{seconds // 60}:{seconds % 60:02d}"
