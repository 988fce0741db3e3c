"""One Docker container as a sandbox: exec, terminal, status and release; its evidence (evidence.py) and
tar transfer (transfer.py) are mixins over the same state. Design notes: core/sandbox/docker/provider.py."""

from __future__ import annotations

import asyncio
import contextlib
import inspect as pyinspect
import logging
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors

from opencode_tui_core.failures import (
    CommandDetails,
    Delivery,
    FailureStage,
)
from opencode_tui_core.sandbox.base import (
    ExecResult,
    OutputCallback,
    OutputChunk,
    PtyHandle,
    Sandbox,
    SandboxProbe,
    SandboxState,
    SandboxStatus,
    SandboxUser,
    SingleFlight,
    exec_start,
)
from opencode_tui_core.sandbox.docker.common import (
    _STATE_MAP,
    CALL_DEADLINE_S,
    PTY_MARKER_ENV,
    RELEASE_DEADLINE_S,
    _blocking,
    _engine_error,
    _engine_timed_out,
    _http_status,
    _now,
)
from opencode_tui_core.sandbox.docker.engine_socket import EngineSocket
from opencode_tui_core.sandbox.docker.evidence import ContainerEvidence
from opencode_tui_core.sandbox.docker.execution import DockerPty, _AttachConn, _ExecJob, _SocketExecJob, _Tail
from opencode_tui_core.sandbox.docker.oom_rules import SOURCE_STATE
from opencode_tui_core.sandbox.docker.transfer import ContainerTransfer
from opencode_tui_core.sandbox.errors import SandboxClosedError, SandboxError, sandbox_failure
from opencode_tui_core.sandbox.faults import kernel_log_note

log = logging.getLogger(__name__)


class DockerSandbox(ContainerTransfer, ContainerEvidence, Sandbox):
    """One container, owned (destroyed on release) or borrowed (never destroyed by us)."""

    provider = "docker"

    def __init__(
        self,
        client: docker.DockerClient,
        container_id: str,
        *,
        owned: bool,
        since: float,
        name: str | None = None,
        memory_bytes: int | None = None,
    ):
        self._client = client
        self._api = client.api
        self.sandbox_id = container_id
        self.owned = owned
        self.name = name
        self.memory_bytes = memory_bytes
        self._since = since  # epoch seconds: docker events are read from here on
        self._closed = False
        self._removed = False
        self._jobs: set[_ExecJob | _SocketExecJob] = set()
        # The engine's Unix socket, for execs straight from the event loop (None: through the SDK).
        self._engine = EngineSocket.of(client)
        self._ptys: set[DockerPty] = set()
        self._cgroup: tuple[Path, int] | None = None
        self._oom_baseline: int | None = None
        self._oom_killed_at_connect: bool | None = None
        self._pids_cgroup: Path | None = None
        self._pids_baseline: int | None = None
        self._disk_note: str | None = None  # why a requested disk limit is not enforced
        self._release_once = SingleFlight(self._release)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<DockerSandbox {self.sandbox_id[:12]} owned={self.owned} closed={self._closed}>"

    def _ensure_open(self, operation: str) -> None:
        if self._closed:
            raise SandboxClosedError(
                f"{operation} refused: docker sandbox {self.sandbox_id[:12]} was released "
                "(nothing runs on the host instead)"
            )

    # ----------------------------------------------------------------------------------- setup

    async def _inspect_attrs(self, within: float) -> dict[str, Any]:
        """The engine's inspect of this container (raises NotFound when it is gone)."""
        if self._engine is not None:
            attrs = await asyncio.wait_for(
                self._engine.call("GET", f"/containers/{self.sandbox_id}/json"), max(within, 0.001)
            )
            return dict(attrs)
        inspected: dict[str, Any] = await _blocking(
            self._api.inspect_container, self.sandbox_id, within=within
        )
        return inspected

    async def _wait_ready(self, budget_s: float) -> str | None:
        """Exec ``true`` until it succeeds; None when ready, else the last reason."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        reason = "no attempt finished"
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return reason
            try:
                result = await self.exec(["true"], timeout=min(remaining, 10.0))
            except SandboxError as exc:
                reason = str(exc)
                if exc.failure is not None and exc.failure.kind == "sandbox_lost":
                    with contextlib.suppress(Exception):
                        attrs = await self._inspect_attrs(min(remaining, 10.0))
                        state = attrs.get("State") or {}
                        if state.get("Status") in ("exited", "dead"):
                            return f"the container's main process ended (exit code {state.get('ExitCode')})"
            else:
                if result.ok:
                    return None
                reason = result.error or f"`true` exited {result.exit_code} (observed={result.observed})"
            await asyncio.sleep(min(0.2, max(deadline - loop.time(), 0)))

    # ------------------------------------------------------------------------------------ exec

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
        execution_id: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        self._ensure_open("exec")
        return await self._run_exec(
            argv,
            cwd=cwd,
            env=env,
            timeout=timeout,
            stdin=stdin,
            on_output=on_output,
            execution_id=execution_id,
            user=user,
        )

    async def _run_exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
        execution_id: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        execution_id, deadline = exec_start(argv, timeout, execution_id)
        loop = asyncio.get_running_loop()
        started_at = _now()
        self._jobs = {j for j in self._jobs if not j.finished}
        job: _ExecJob | _SocketExecJob = (
            _SocketExecJob(self._engine, self.sandbox_id, argv, cwd, env, stdin, user)
            if self._engine is not None
            else _ExecJob(self._api, self.sandbox_id, argv, cwd, env, stdin, loop, user)
        )
        self._jobs.add(job)
        out, err = _Tail(), _Tail()

        def result(**fields: Any) -> ExecResult:
            return ExecResult(
                execution_id=execution_id,
                stdout=out.value(),
                stderr=err.value(),
                started_at=started_at,
                ended_at=_now(),
                **fields,
            )

        job.start()
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError
                kind, payload = await asyncio.wait_for(job.queue.get(), remaining)
                if kind == "out":
                    stream, data = payload
                    (out if stream == "stdout" else err).add(data)
                    if on_output is not None:
                        maybe = on_output(OutputChunk(execution_id=execution_id, stream=stream, data=data))
                        if pyinspect.isawaitable(maybe):
                            await asyncio.wait_for(maybe, max(deadline - loop.time(), 0.001))
                elif kind == "done":
                    exit_code, note = payload
                    return result(exit_code=exit_code, observed=exit_code is not None, error=note)
                else:
                    stage, exc = payload
                    raise self._exec_error(stage, exc, execution_id, job)
        except TimeoutError:
            job.abandon()
            when = "while it ran" if job.started else "before the command was started"
            return result(
                exit_code=None,
                observed=False,
                deadline_expired=True,
                error=f"deadline of {timeout:g}s expired {when}; the exit was not observed",
            )
        except BaseException:
            job.abandon()
            raise

    def _exec_error(
        self, stage: str, exc: BaseException, execution_id: str, job: _ExecJob | _SocketExecJob
    ) -> SandboxError:
        status = _http_status(exc) if isinstance(exc, docker.errors.APIError) else None
        gone = status in (404, 409)  # no such container / container not running
        if stage == "create":
            # Creating an exec instance never runs anything: the command was not sent.
            delivery = Delivery.NOT_SENT
            if gone:
                kind = "sandbox_lost"
            elif status is not None:
                kind = "command_failed"
            elif _engine_timed_out(exc):
                kind = "provider_io_timeout"
            else:
                kind = "provider_unavailable"
        elif stage == "start" and status is not None and status < 500:
            delivery = Delivery.NOT_SENT  # the engine refused the start
            kind = "sandbox_lost" if gone else "command_failed"
        elif stage == "start":
            delivery, kind = Delivery.POSSIBLY_DELIVERED, "command_delivery_uncertain"
        else:
            delivery, kind = Delivery.DELIVERED, "command_status_lost"
        message = f"exec {execution_id} ({job.argv[0]!r}) failed at {stage}: {exc}"
        failure = sandbox_failure(
            kind,
            stage=FailureStage.AGENT,
            operation="exec",
            message=message,
            cause=exc,
            http_status=_http_status(exc),
            details=CommandDetails(execution_id=execution_id, delivery=delivery),
        )
        error = SandboxError(message, failure=failure)
        error.__cause__ = exc
        return error

    # ------------------------------------------------------------------------------------- pty

    async def pty(
        self, argv: Sequence[str], *, cols: int = 80, rows: int = 24, cwd: str | None = None
    ) -> PtyHandle:
        self._ensure_open("pty")
        if not argv:
            raise ValueError("argv must not be empty")
        loop = asyncio.get_running_loop()
        token = uuid.uuid4().hex
        try:
            created = await _blocking(
                self._api.exec_create,
                self.sandbox_id,
                list(argv),
                stdout=True,
                stderr=True,
                stdin=True,
                tty=True,
                environment={"TERM": "xterm-256color", PTY_MARKER_ENV: token},
                workdir=cwd,
                within=CALL_DEADLINE_S,
            )
            exec_id = created["Id"]
            sock = await _blocking(
                self._api.exec_start, exec_id, socket=True, tty=True, within=CALL_DEADLINE_S
            )
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=FailureStage.AGENT,
                operation="pty.open",
                default_kind="sandbox_pty_failed",
                what=f"opening a terminal ({argv[0]!r}) failed",
            ) from exc
        handle = DockerPty(self, exec_id, _AttachConn(sock), loop, f"{PTY_MARKER_ENV}={token}")
        self._ptys.add(handle)
        # The process may not have started when the upgrade answers: retry the first resize briefly.
        for attempt in range(20):
            try:
                await handle.resize(cols, rows)
                break
            except SandboxError:
                if attempt == 19:
                    log.debug("initial terminal resize failed for exec %s", exec_id)
                await asyncio.sleep(0.05)
        return handle

    # ----------------------------------------------------------------------------------- files

    def host_ids(self, user: SandboxUser) -> tuple[int, int] | None:
        # Without user-namespace remapping in the engine, ids inside a container are host ids.
        return user.ids

    # -------------------------------------------------------------------------------- evidence

    async def status(self) -> SandboxStatus:
        if self._closed:
            return SandboxStatus(
                sandbox_id=self.sandbox_id,
                provider=self.provider,
                owned=self.owned,
                state=SandboxState.RELEASED,
                memory_limit_enforced=bool(self.memory_bytes) or None,
            )
        attrs, evidence = await self._gather()
        notes: list[str] = []
        if attrs is None:
            gone = any(e.source == SOURCE_STATE and e.data.get("exists") is False for e in evidence)
            state = SandboxState.GONE if gone else SandboxState.UNKNOWN
            limit: int | None = self.memory_bytes
        else:
            raw = (attrs.get("State") or {}).get("Status") or ""
            state = _STATE_MAP.get(raw, SandboxState.UNKNOWN)
            if state is SandboxState.UNKNOWN:
                notes.append(f"docker status {raw!r}")
            host = attrs.get("HostConfig") or {}
            limit = host.get("Memory") or None
            pids_limited = bool(host.get("PidsLimit")) or None
            disk_limited = True if (host.get("StorageOpt") or {}).get("size") else None
            notes.append(f"network_mode={host.get('NetworkMode')}")
            if host.get("Init"):
                notes.append("init=docker-init")
        if not limit:
            notes.append("no memory limit set")
        if self._cgroup is None:
            notes.append(
                "this host cannot see the container's cgroup: a kernel kill is seen live from the engine's oom events, which name no process"
            )
        elif note := kernel_log_note():
            notes.append(note)
        if self._disk_note:
            disk_limited = False
            notes.append(self._disk_note)
        return SandboxStatus(
            sandbox_id=self.sandbox_id,
            provider=self.provider,
            owned=self.owned,
            state=state,
            memory_limit_enforced=True if limit else None,
            pids_limit_enforced=pids_limited if attrs is not None else None,
            disk_limit_enforced=disk_limited if attrs is not None else None,
            notes=notes,
            evidence=evidence,
        )

    async def probe(self, timeout: float) -> SandboxProbe:
        """The engine's answer about this container, also after release (issue 19: engine lost)."""
        from opencode_tui_core.sandbox.docker.probe import probe_container

        # Only a container we created is known to have started after ``_since`` (a borrowed one was
        # started before we connected).
        since = self._since if self.owned else None
        return await probe_container(self._api, self.sandbox_id, timeout, since=since)

    # --------------------------------------------------------------------------------- release

    async def release(self) -> None:
        # One removal, however many callers: a second caller (a hurried close) joins the one in
        # flight instead of sending its own (Docker's 409 "already in progress" returned before the
        # container was gone), and a caller cancelled midway does not cut it short (SingleFlight).
        await self._release_once()

    async def _release(self) -> None:
        self._closed = True
        for job in list(self._jobs):
            job.close()
        self._jobs.clear()
        for handle in list(self._ptys):
            if self.owned:
                handle.close_now()  # removing the container ends its processes
            else:
                await handle.close()  # borrowed: end the terminals we opened, nothing else
        self._ptys.clear()
        if not self.owned or self._removed:
            return  # borrowed: disconnect only, the container is never stopped or removed
        try:
            if self._engine is not None:
                path = f"/containers/{self.sandbox_id}?force=1&v=1"
                await asyncio.wait_for(self._engine.request("DELETE", path), RELEASE_DEADLINE_S)
            else:
                await _blocking(
                    self._api.remove_container, self.sandbox_id, force=True, v=True, within=RELEASE_DEADLINE_S
                )
        except docker.errors.NotFound:
            pass  # already gone
        except Exception as exc:
            # Another remover (a sweep) got there first: the container is going, not kept.
            in_progress = (
                isinstance(exc, docker.errors.APIError)
                and _http_status(exc) == 409
                and "already in progress" in str(exc)
            )
            if not in_progress:
                raise _engine_error(
                    exc,
                    stage=FailureStage.CLEANUP,
                    operation="release",
                    default_kind="sandbox_release_failed",
                    what=f"removing container {self.sandbox_id[:12]} failed",
                ) from exc
        self._removed = True
