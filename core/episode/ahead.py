"""OpenCode's server started ahead of its task, in a sandbox the warm pool prepared (issue 31).

The pool stages the session directory (config, plugin, runner, relay) exactly as the agent phase
would, with an access token of its own, and launches the serve runner under the supervisor with
``--ahead``: ``opencode serve`` boots, the relay starts, the runner connects to the event stream
(and, when the task holds no git repository, opens the session), notes ``runner.ready`` and waits.
The supervisor's run deadline has not started: it starts when the task arrives (``launch_script``'s
clock file), and the wait itself is capped by the pool's ``warm_max_age_s``.

The episode that takes the sandbox takes this session too: its proxy accepts the token the config
names (``ModelEndpoint(access_token=…)``) and hands the runner its task over the relay
(``opencode_tui_core.episode.handoff``: the files and access check in the seed phase, the prompt in the agent
phase, with no upload or exec through the provider); the output buffered so far is replayed into
its run directory, and its close stops this supervisor like any other (stop file, receipt).
Unused, the pool closes it the same way before destroying the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode.handoff import TaskHandoff, TaskOffer
from opencode_tui_core.events import Event
from opencode_tui_core.inside.serve_runner import AHEAD, AHEAD_SESSION
from opencode_tui_core.runtime import access
from opencode_tui_core.sandbox.base import SANDBOX_MODEL_SOCKET, ExecResult, OutputChunk, Sandbox, SandboxUser
from opencode_tui_core.sandbox.tarsafe import tree_tar
from opencode_tui_core.session import Collect, SandboxSession
from opencode_tui_core.tasks import Task

if TYPE_CHECKING:
    from opencode_tui_core.runtime.opencode import OpenCodeHarness
    from opencode_tui_core.runtime.prepare import PreparedRuntime

# What the runner prints once it waits for its task (a line of its stdout, ``runner.ready``).
READY_MARK = b'"type":"runner.ready"'
# Spare time of the supervisor past the pool's age limit: the pool discards an old sandbox first.
WAIT_SLACK_S = 60.0


@dataclass(frozen=True)
class AheadEndpoint:
    """What the harness reads of a model endpoint before the episode's exists: the relay's socket
    (bound by the pool, served later by the episode's proxy) and the token OpenCode will present."""

    unix_path: str
    access_token: str
    tcp_url: str | None = None


def can_start_ahead(task: Task, config: AgentConfig, socket_path: str | None) -> bool:
    """A server can be started ahead only where its config names nothing the episode decides later:
    the serve harness, reaching the model through the relay to a socket the pool bound."""
    from opencode_tui_core.runtime.opencode import OpenCodeHarness

    if socket_path is None or config.runtime.harness != "serve":
        return False
    probe = OpenCodeHarness("probe", task, config, AheadEndpoint(unix_path=socket_path, access_token="x"))
    return bool(probe.use_relay)


def opens_session_ahead(task: Task) -> bool:
    """OpenCode decides a session's project (a git repository or none) when it is opened: only a
    task with no repository among its files may have its session opened before they arrive."""
    return task.files_dir is None or not (task.files_dir / ".git").exists()


@dataclass
class ServerAhead:
    """The serve runner launched ahead in a prepared sandbox, waiting for its task."""

    run_id: str  # the pool's: the session directory /tmp/.opencode-tui-<run_id>
    token: str
    session: SandboxSession
    session_ahead: bool
    exec_task: asyncio.Task[ExecResult] | None = None
    handoff: TaskHandoff = field(default_factory=TaskHandoff)  # its task, through the relay
    _buffer: list[OutputChunk] = field(default_factory=list)
    _seen: bytes = b""
    _sink: Callable[[OutputChunk], None] | None = None
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def on_output(self, chunk: OutputChunk) -> None:
        if self._sink is not None:
            self._sink(chunk)
            return
        self._buffer.append(chunk)
        if not self._ready.is_set() and chunk.stream == "stdout":
            self._seen = (self._seen + chunk.data)[-4096:]
            if READY_MARK in self._seen:
                self._ready.set()

    async def wait_ready(self, timeout: float) -> None:
        """Until the runner waits for its task; raises when it ended first or did not get there."""
        assert self.exec_task is not None
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            done, _ = await asyncio.wait(
                {ready, self.exec_task}, timeout=timeout, return_when="FIRST_COMPLETED"
            )
        finally:
            ready.cancel()
        if self._ready.is_set():
            return
        if self.exec_task in done:
            result = self.exec_task.result()
            said = (result.stderr or b"").decode("utf-8", "replace").strip()[-400:]
            raise RuntimeError(f"OpenCode's server started ahead ended before it was ready: {said}")
        raise TimeoutError(f"OpenCode's server started ahead was not ready within {timeout:g}s")

    async def stage(self, task: Task, user: SandboxUser, *, model_socket: bool) -> None:
        """The seed phase's task files and access check, through the runner (``TaskHandoff``) rather
        than an upload and an exec. Raises as ``access.stage_inputs`` does."""
        assert self.exec_task is not None
        archive, inputs = await access.task_archive(task.files_dir, user)
        offer = TaskOffer(
            workdir=task.workdir,
            listing=access.preflight_listing(inputs),
            check=access.PREFLIGHT_SH,
            socket=SANDBOX_MODEL_SOCKET if model_socket else "",
        )
        result = await self.handoff.stage(
            offer, archive, runner=self.exec_task, timeout=access.PREFLIGHT_TIMEOUT_S
        )
        access.judge_preflight(result, user)

    async def run(
        self,
        harness: OpenCodeHarness,
        on_output: Callable[[OutputChunk], None],
        emit: Callable[[Event], object],
        collect: Collect,
    ) -> ExecResult:
        """The episode's agent phase on this server: what it printed so far goes to ``on_output``
        first, then its prompt is handed over (which starts the run deadline) and the run waited for."""
        assert self.exec_task is not None
        self.session.handover(emit, collect)
        for chunk in self._buffer:
            on_output(chunk)
        self._buffer.clear()
        self._sink = on_output
        self.handoff.go(
            tree_tar(harness.task_files(), owner=self.session.owner, root_mode=access.SESSION_DIR_MODE)
        )
        return await asyncio.shield(self.exec_task)

    async def stop(self, timeout: float) -> bool:
        """Unused (the pool's discard, or an episode that failed before its agent phase): stop the
        runner and confirm it through the supervisor's receipt. True when confirmed."""
        self.handoff.withdraw()
        try:
            receipt = await asyncio.wait_for(self.session.finalize(), timeout)
            confirmed = receipt.cleanup_confirmed
        except Exception:
            confirmed = False
        await self.joined(timeout)
        return confirmed

    async def joined(self, timeout: float) -> None:
        """The launch exec has returned (it does once the supervisor stops or the sandbox is gone)."""
        if self.exec_task is None:
            return
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self.exec_task), timeout)
        if not self.exec_task.done():
            self.exec_task.cancel()


async def start_ahead(
    sandbox: Sandbox,
    runtime: PreparedRuntime,
    template: Task,
    config: AgentConfig,
    *,
    run_id: str,
    user: SandboxUser,
    socket_path: str,
    ready_s: float,
) -> ServerAhead:
    """Stage the session directory and launch the runner ahead; returns once it waits for its task
    (within ``ready_s``). On failure the caller releases the sandbox (which ends what was started)."""
    from opencode_tui_core.episode.agent import run_budget_of
    from opencode_tui_core.runtime.opencode import OpenCodeHarness

    token = secrets.token_urlsafe(24)
    harness = OpenCodeHarness(
        run_id, template, config, AheadEndpoint(unix_path=socket_path, access_token=token)
    )
    harness.owner = user.ids
    # The server's working directory, made the user's before it starts (the task's files come later).
    await access.stage_task_files(sandbox, None, template.workdir, user)
    session = SandboxSession(
        sandbox,
        harness.layout.session_dir,
        run_timeout_s=run_budget_of(template, config),
        close_timeout_s=config.budgets.close_s,
        python=runtime.python,
        owner=user.ids,
    )
    ahead = ServerAhead(
        run_id=run_id, token=token, session=session, session_ahead=opens_session_ahead(template)
    )
    argv, env = harness.command(runtime, ahead=AHEAD_SESSION if ahead.session_ahead else AHEAD)
    from opencode_tui_core.inside.serve_runner import GO_NAME

    ahead.exec_task = asyncio.ensure_future(
        session.execute(
            argv,
            files=harness.staged_files(runtime),
            env=env,
            cwd=template.workdir,
            on_output=ahead.on_output,
            clock=(GO_NAME, config.batch.warm_max_age_s + WAIT_SLACK_S),
        )
    )
    ahead.exec_task.add_done_callback(lambda t: t.cancelled() or t.exception())
    await ahead.wait_ready(ready_s)
    return ahead
