"""One Docker container as a sandbox; the design notes are in core/sandbox/docker/provider.py."""

from __future__ import annotations

import asyncio
import contextlib
import inspect as pyinspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors

from core.events import FaultKind, SandboxFault
from core.failures import (
    CommandDetails,
    Delivery,
    Evidence,
    FailureStage,
)
from core.sandbox import tarsafe
from core.sandbox.base import (
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
    check_exec_args,
    new_execution_id,
)
from core.sandbox.cgroup import read_memory
from core.sandbox.docker.cgroup import (
    CGROUP_ROOT,
    CGROUP_V1_ROOT,
    _cgroup_present,
    find_memory_cgroup,
    find_pids_cgroup,
)
from core.sandbox.docker.common import (
    _STATE_MAP,
    CALL_DEADLINE_S,
    EVENTS_DEADLINE_S,
    EVENTS_KEPT,
    EVENTS_POLL_S,
    FILE_DEADLINE_S,
    INSPECT_DEADLINE_S,
    PTY_MARKER_ENV,
    RELEASE_DEADLINE_S,
    _blocking,
    _engine_error,
    _engine_timed_out,
    _http_status,
    _now,
    _ts,
)
from core.sandbox.docker.execution import DockerPty, _AttachConn, _ExecJob, _Tail
from core.sandbox.docker.oom_rules import SOURCE_EVENTS, SOURCE_STATE
from core.sandbox.errors import SandboxClosedError, SandboxError, SandboxFileNotFoundError, sandbox_failure
from core.sandbox.faults import FaultWatcher, kernel_log_note
from core.sandbox.oom import SOURCE_CGROUP
from core.sandbox.pids import pids_evidence, read_pids_cgroup

log = logging.getLogger(__name__)


class DockerSandbox(Sandbox):
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
        self._jobs: set[_ExecJob] = set()
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

    async def _record_baseline(self, *, attrs: dict[str, Any] | None = None) -> None:
        """Remember the cgroup OOM counter (and, borrowed, OOMKilled) as found at create/connect."""
        if attrs is None:
            attrs = await _blocking(self._api.inspect_container, self.sandbox_id, within=CALL_DEADLINE_S)
        state = attrs.get("State") or {}
        found = await _blocking(find_memory_cgroup, self.sandbox_id, state.get("Pid"), within=5.0)
        self._cgroup = found
        # The process limit's refused-fork counter as found now (0 for a container we created).
        pids_cg = await _blocking(find_pids_cgroup, self.sandbox_id, state.get("Pid"), within=5.0)
        self._pids_cgroup = pids_cg
        if pids_cg is not None:
            self._pids_baseline = (await _blocking(read_pids_cgroup, pids_cg, within=5.0)).get("max_events")
        if self.owned:
            # We created it: its cgroup is fresh, so every OOM kill it ever counts is ours.
            self._oom_baseline = 0
            return
        self._oom_killed_at_connect = bool(state.get("OOMKilled"))
        if found is not None:
            with contextlib.suppress(OSError, TimeoutError):
                data = await _blocking(read_memory, *found, within=5.0)
                if isinstance(data.get("oom_kill"), int):
                    self._oom_baseline = data["oom_kill"]

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
                        attrs = await _blocking(
                            self._api.inspect_container, self.sandbox_id, within=min(remaining, 10.0)
                        )
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
        check_exec_args(argv, timeout)
        execution_id = execution_id or new_execution_id()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        started_at = _now()
        self._jobs = {j for j in self._jobs if not j.finished}
        job = _ExecJob(self._api, self.sandbox_id, argv, cwd, env, stdin, loop, user)
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

    def _exec_error(self, stage: str, exc: BaseException, execution_id: str, job: _ExecJob) -> SandboxError:
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

    async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
        self._ensure_open("upload")
        if not PurePosixPath(dest_dir).is_absolute():
            raise ValueError(f"dest_dir must be an absolute path inside the sandbox, got {dest_dir!r}")
        members = tarsafe.check_archive(archive)  # raises UnsafeArchiveError before anything is written
        archive = tarsafe.without_special_bits(archive)  # put_archive keeps setuid/setgid as given
        target = PurePosixPath(dest_dir)
        if target.name and any(m.isdir() and PurePosixPath(m.name) == PurePosixPath(".") for m in members):
            # The engine skips a "." entry when the target exists; extracted from the parent, the
            # target's own owner and mode come from the archive (and "." is the target by name).
            archive = tarsafe.reroot(archive, target.name)
            dest_dir = str(target.parent)
        try:
            try:
                ok = await _blocking(
                    self._api.put_archive, self.sandbox_id, dest_dir, archive, within=FILE_DEADLINE_S
                )
            except docker.errors.NotFound:
                # The destination does not exist yet (the engine refused before writing anything):
                # create it, as root whatever the image's user (the engine extracts as root with the
                # archive's owners), and put the archive once more. Usually it exists (the workdir,
                # /tmp): then no exec is spent on it.
                await self._mkdir_as_root(dest_dir)
                ok = await _blocking(
                    self._api.put_archive, self.sandbox_id, dest_dir, archive, within=FILE_DEADLINE_S
                )
        except SandboxError:
            raise
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=FailureStage.SEED,
                operation="upload",
                default_kind="sandbox_file_failed",
                what=f"upload into {dest_dir!r} failed",
            ) from exc
        if not ok:
            message = f"upload into {dest_dir!r}: the engine refused the archive"
            raise SandboxError(
                message,
                failure=sandbox_failure(
                    "sandbox_file_failed", stage=FailureStage.SEED, operation="upload", message=message
                ),
            )

    async def _mkdir_as_root(self, dest_dir: str) -> None:
        made = await self.exec(["mkdir", "-p", "--", dest_dir], timeout=CALL_DEADLINE_S, user="0")
        if not made.ok:
            detail = made.stderr.decode("utf-8", "replace").strip() or made.error or f"exit {made.exit_code}"
            message = f"upload: cannot create {dest_dir!r} in the sandbox: {detail}"
            raise SandboxError(
                message,
                failure=sandbox_failure(
                    "sandbox_file_failed", stage=FailureStage.SEED, operation="upload", message=message
                ),
            )

    async def download_tar(self, path: str) -> bytes:
        self._ensure_open("download")
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"path must be absolute inside the sandbox, got {path!r}")

        def fetch() -> bytes:
            chunks, _stat = self._api.get_archive(self.sandbox_id, path)
            return b"".join(chunks)

        try:
            archive = await _blocking(fetch, within=FILE_DEADLINE_S)
        except docker.errors.NotFound as exc:
            message = f"download: {path!r} does not exist in sandbox {self.sandbox_id[:12]}"
            raise SandboxFileNotFoundError(
                message,
                failure=sandbox_failure(
                    "sandbox_file_failed",
                    stage=FailureStage.SEED,
                    operation="download",
                    message=message,
                    cause=exc,
                    http_status=_http_status(exc),
                ),
            ) from exc
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=FailureStage.SEED,
                operation="download",
                default_kind="sandbox_file_failed",
                what=f"download of {path!r} failed",
            ) from exc
        tarsafe.check_archive(archive)
        return archive

    def host_ids(self, user: SandboxUser) -> tuple[int, int] | None:
        # Without user-namespace remapping in the engine, ids inside a container are host ids.
        return user.ids

    # -------------------------------------------------------------------------------- evidence

    async def inspect(self) -> list[Evidence]:
        self._ensure_open("inspect")
        _attrs, evidence = await self._gather()
        return evidence

    async def _gather(self) -> tuple[dict[str, Any] | None, list[Evidence]]:
        """Engine state, this container's events and its cgroup, all inside INSPECT_DEADLINE_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + INSPECT_DEADLINE_S
        cid = self.sandbox_id
        evidence: list[Evidence] = []
        attrs: dict[str, Any] | None = None
        try:
            attrs = await _blocking(self._api.inspect_container, cid, within=deadline - loop.time())
        except docker.errors.NotFound:
            evidence.append(Evidence(source=SOURCE_STATE, scope=cid, data={"exists": False}))
        except Exception as exc:
            evidence.append(
                Evidence(source=SOURCE_STATE, scope=cid, data={"error": f"{type(exc).__name__}: {exc}"})
            )
        if attrs is not None:
            state = attrs.get("State") or {}
            data = {
                "exists": True,
                "Status": state.get("Status"),
                "Running": state.get("Running"),
                "ExitCode": state.get("ExitCode"),
                "OOMKilled": state.get("OOMKilled"),
                "Error": state.get("Error") or None,
                "StartedAt": state.get("StartedAt"),
                "FinishedAt": state.get("FinishedAt"),
                "MemoryLimit": (attrs.get("HostConfig") or {}).get("Memory") or None,
            }
            if self._oom_killed_at_connect is not None:
                data["OOMKilledAtConnect"] = self._oom_killed_at_connect
            evidence.append(Evidence(source=SOURCE_STATE, scope=cid, data=data))
        evidence.extend(await self._events_evidence(min(EVENTS_DEADLINE_S, max(deadline - loop.time(), 0.5))))
        evidence.append(await self._cgroup_evidence(attrs, max(deadline - loop.time(), 0.5)))
        if self._pids_cgroup is not None:
            with contextlib.suppress(OSError, TimeoutError):
                cg, base = self._pids_cgroup, self._pids_baseline
                evidence.append(
                    await _blocking(pids_evidence, cg, base, cid, within=max(deadline - loop.time(), 0.5))
                )
        return attrs, evidence

    async def _events_evidence(self, budget_s: float) -> list[Evidence]:
        cid = self.sandbox_id
        since, until = self._since, time.time()
        holder: dict[str, Any] = {}

        def query() -> list[dict[str, Any]]:
            stream = self._api.events(
                since=_ts(since),
                until=_ts(until),
                filters={"container": cid, "type": "container", "event": ["oom", "die", "kill"]},
                decode=True,
            )
            holder["stream"] = stream
            try:
                return list(stream)
            finally:
                with contextlib.suppress(Exception):
                    stream.close()

        window = {"since": _ts(since), "until": _ts(until)}
        try:
            events = await _blocking(query, within=budget_s)
        except Exception as exc:
            if "stream" in holder:
                with contextlib.suppress(Exception):
                    holder["stream"].close()
            return [
                Evidence(
                    source=SOURCE_EVENTS, scope=cid, data={**window, "error": f"{type(exc).__name__}: {exc}"}
                )
            ]
        ours = [ev for ev in events if ((ev.get("Actor") or {}).get("ID") or ev.get("id")) == cid]
        # Capped (a restart loop makes thousands): every oom report first, then the latest others.
        ooms = [ev for ev in ours if (ev.get("Action") or ev.get("status")) == "oom"][-EVENTS_KEPT:]
        others = [ev for ev in ours if (ev.get("Action") or ev.get("status")) != "oom"]
        kept = ooms + others[len(others) - max(EVENTS_KEPT - len(ooms), 0) :] if ours else []
        kept.sort(key=lambda ev: ev.get("timeNano") or 0)
        summary = {**window, "matched": len(events)}
        if len(kept) < len(ours):
            summary["omitted"] = len(ours) - len(kept)
        out = [Evidence(source=SOURCE_EVENTS, scope=cid, data=summary)]
        for ev in kept:
            actor = ev.get("Actor") or {}
            container_id = actor.get("ID") or ev.get("id")
            nano = ev.get("timeNano")
            observed = (
                datetime.fromtimestamp(nano / 1e9, UTC)
                if isinstance(nano, int)
                else datetime.fromtimestamp(ev.get("time", until), UTC)
            )
            attributes = actor.get("Attributes") or {}
            out.append(
                Evidence(
                    source=SOURCE_EVENTS,
                    scope=cid,
                    observed_at=observed,
                    data={
                        "action": ev.get("Action") or ev.get("status"),
                        "container_id": container_id,
                        "time_nano": nano,
                        **{k: attributes[k] for k in ("exitCode", "signal") if k in attributes},
                    },
                )
            )
        return out

    async def _cgroup_evidence(self, attrs: dict[str, Any] | None, budget_s: float) -> Evidence:
        cid = self.sandbox_id
        try:
            found = self._cgroup
            if found is None or not _cgroup_present(found):
                pid = ((attrs or {}).get("State") or {}).get("Pid")
                found = await _blocking(find_memory_cgroup, cid, pid, within=budget_s)
                if found is not None:
                    self._cgroup = found
            if found is None:
                return Evidence(
                    source=SOURCE_CGROUP,
                    scope=cid,
                    data={
                        "available": False,
                        "reason": "memory cgroup not found (container stopped, or not visible)",
                    },
                )
            data = await _blocking(read_memory, *found, within=budget_s)
        except (OSError, TimeoutError) as exc:
            return Evidence(
                source=SOURCE_CGROUP,
                scope=cid,
                data={"available": False, "reason": f"{type(exc).__name__}: {exc}"},
            )
        return Evidence(
            source=SOURCE_CGROUP,
            scope=cid,
            data={"available": True, **data, "oom_kill_baseline": self._oom_baseline},
        )

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

    async def watch_faults(self, stop: asyncio.Event) -> AsyncIterator[SandboxFault]:
        """The container's memory cgroup and the kernel's record of a kill (``FaultWatcher``) when the
        host sees them (a local engine); else Docker's own ``oom`` events, polled every second."""
        if self._closed:
            return
        if self._cgroup is not None:
            path, version = self._cgroup
            root = CGROUP_V1_ROOT if version == 1 else CGROUP_ROOT
            memcg = "/" + str(path.relative_to(root)) if path.is_relative_to(root) else None
            watcher = FaultWatcher(scope=self.sandbox_id, memory=self._cgroup, memcg=memcg)
            watcher.oom_baseline = self._oom_baseline
            async for fault in watcher.watch(stop):
                yield fault
            return
        since = time.time()
        while True:
            stopping = stop.is_set()
            until = time.time()
            for ev in await self._oom_events(since, until):
                yield ev
            since = until
            if stopping:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), EVENTS_POLL_S)

    async def _oom_events(self, since: float, until: float) -> list[SandboxFault]:
        cid = self.sandbox_id

        def query() -> list[dict[str, Any]]:
            stream = self._api.events(
                since=_ts(since), until=_ts(until), filters={"container": cid, "event": "oom"}, decode=True
            )
            try:
                return list(stream)
            finally:
                with contextlib.suppress(Exception):
                    stream.close()

        try:
            events = await _blocking(query, within=EVENTS_DEADLINE_S)
        except Exception:
            return []  # the close-time inspect reads the same events again, and says what failed
        out = []
        for ev in events:
            if ((ev.get("Actor") or {}).get("ID") or ev.get("id")) != cid:
                continue
            nano = ev.get("timeNano")
            at = datetime.fromtimestamp(nano / 1e9, UTC) if isinstance(nano, int) else datetime.now(UTC)
            out.append(
                SandboxFault(
                    ts=at,
                    kind=FaultKind.OOM_KILL,
                    source=SOURCE_EVENTS,
                    message="the kernel OOM-killed a process of the container (Docker's oom event; "
                    "it does not say which)",
                    evidence=[
                        Evidence(
                            source=SOURCE_EVENTS,
                            scope=cid,
                            observed_at=at,
                            data={"action": "oom", "container_id": cid, "time_nano": nano},
                        )
                    ],
                )
            )
        return out

    async def probe(self, timeout: float) -> SandboxProbe:
        """The engine's answer about this container, also after release (issue 19: engine lost)."""
        from core.sandbox.docker.probe import probe_container

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
