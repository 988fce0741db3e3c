"""The Docker provider: owned containers from a local image, or borrowed containers by id.

Design notes
------------
* **Blocking SDK calls never run on the event loop.** Short calls run in ``asyncio.to_thread``
  under ``asyncio.wait_for`` (every wait has a deadline). Long-lived streams (exec output, PTYs)
  are read by daemon threads of their own: an abandoned stream (a command past its deadline keeps
  running) must not hold up interpreter or event-loop shutdown, which joins the default executor.
* **Main process.** The container's main process is an idle shell loop under Docker's init
  (``init=True``: docker-init/tini as PID 1). Processes started by ``exec`` that orphan (a
  backgrounded relay, a daemon) are re-parented to PID 1, and tini reaps them, so zombies do not
  pile up. tini does not interfere with OOM semantics: the memory cgroup's OOM killer picks the
  task with the largest footprint (tini is ~1 MB and is never the choice while anything else is
  alive); an OOM kill of an exec'd process leaves tini and the idle loop running (the container
  stays up; evidence comes from the ``oom`` event and the cgroup counter); if the main process
  itself is OOM-killed, tini exits with its status and the engine records ``State.OOMKilled``.
  ``memswap_limit`` equals ``mem_limit`` so the limit cannot be dodged by swapping: OOM is real.
* **Exec streaming** uses the exec's attach socket (``exec_start(socket=True)``) and parses
  Docker's multiplexed frames ourselves: the SDK's ``stream=True`` generator keeps the client's read
  timeout, so a command quiet for longer than that would break, and the socket lets us write stdin
  and half-close it. Each frame goes to ``on_output`` as soon as it is read. Bytes buffered by the
  HTTP layer past the upgrade headers are read through the same buffered reader, never lost.
* **PTY**: exec with ``tty=True, stdin=True``; raw bytes over the attach socket, read by a
  daemon thread into an ``asyncio.Queue``; ``resize`` is ``exec_resize``.
* **Evidence** (``inspect``) is scoped to this container id only: ``docker.state``,
  ``docker.events`` (bounded ``since``/``until`` query) and ``cgroup.memory`` (the container's own
  cgroup, found from its PID and checked to contain its id). See ``core.sandbox.oom``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect as pyinspect
import io
import logging
import os
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import docker
import docker.errors
import requests
from docker.types import Mount as DockerMount

from core.failures import (
    CommandDetails,
    Delivery,
    Evidence,
    FailureCause,
    FailureEvent,
    FailureStage,
    GenericDetails,
)
from core.failures.model import FailureDetails
from core.sandbox import tarsafe
from core.sandbox.base import (
    LABEL_INVOCATION,
    LABEL_OWNER,
    LABEL_RUN,
    SANDBOX_MODEL_SOCKET,
    ExecResult,
    NetworkPolicy,
    OutputCallback,
    OutputChunk,
    PtyHandle,
    QueuedOutput,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxProbe,
    SandboxProvider,
    SandboxRecord,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    SandboxUser,
    check_exec_args,
    default_owner,
    invocation_id,
    new_execution_id,
)
from core.sandbox.oom import SOURCE_CGROUP, SOURCE_EVENTS, SOURCE_STATE

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_IMAGE = "opencode-tui/base:bookworm"
# The idle main process (under docker-init): portable to any image with /bin/sh.
IDLE_MAIN = ("/bin/sh", "-c", "while :; do sleep 3600; done")
BUILD_HINT = "build it locally with scripts/build-images (there is no registry to pull from)"

API_TIMEOUT_S = 60.0  # the SDK's socket timeout for ordinary requests
CALL_DEADLINE_S = 60.0  # deadline for one short engine call (create, start, inspect...)
INSPECT_DEADLINE_S = 10.0  # the whole of one inspect()
EVENTS_DEADLINE_S = 5.0
RELEASE_DEADLINE_S = 30.0
FILE_DEADLINE_S = 300.0  # put_archive / get_archive
PTY_WRITE_DEADLINE_S = 30.0
EXIT_POLL_S = 5.0  # after the output ends, how long to wait for the engine to report the exit code
OUTPUT_CAP_BYTES = 4 << 20  # per stream, tail kept
# Every PTY process carries this variable (value unique per terminal): close() ends the processes
# that carry it, since a closed attach socket alone leaves an interactive shell running.
PTY_MARKER_ENV = "OPENCODE_TUI_PTY"
PTY_END_DEADLINE_S = 5.0
_END_MARKED_SH = r"""
m=$1
pids() {
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -Fqx -- "$m" && echo "$p"
  done
}
p=$(pids)
[ -z "$p" ] && exit 0
kill -HUP $p 2>/dev/null
kill -CONT $p 2>/dev/null
i=0
while [ $i -lt 15 ]; do
  sleep 0.1
  p=$(pids)
  [ -z "$p" ] && exit 0
  i=$((i + 1))
done
kill -KILL $p 2>/dev/null
exit 0
"""
CGROUP_V1_ROOT = Path("/sys/fs/cgroup/memory")
CGROUP_ROOT = Path("/sys/fs/cgroup")

_STATE_MAP = {
    "created": SandboxState.CREATING,
    "running": SandboxState.RUNNING,
    "paused": SandboxState.UNKNOWN,
    "restarting": SandboxState.UNKNOWN,
    "removing": SandboxState.GONE,
    "exited": SandboxState.EXITED,
    "dead": SandboxState.FAILED,
}


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(epoch: float) -> str:
    return f"{epoch:.9f}"


async def _blocking(fn: Callable[..., T], *args: Any, within: float, **kwargs: Any) -> T:
    """Run one blocking call in a worker thread; raise TimeoutError after ``within`` seconds."""
    return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), max(within, 0.001))


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
    return status if isinstance(status, int) and 100 <= status <= 599 else None


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and len(out) < 10:
        out.append(node)
        node = node.__cause__ or node.__context__
    return out


def _engine_timed_out(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError | requests.exceptions.Timeout)


def _engine_unreachable(exc: BaseException) -> bool:
    """The engine could not be talked to at all (socket missing, refused, connection dropped)."""
    if isinstance(exc, docker.errors.APIError):
        return False
    if "Error while fetching server API version" in str(exc):
        return True
    return any(
        isinstance(e, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError)
        for e in _chain(exc)
    )


def _failure(
    kind: str,
    *,
    stage: FailureStage,
    operation: str,
    message: str,
    exc: BaseException | None = None,
    evidence: Sequence[Evidence] = (),
    details: FailureDetails | None = None,
) -> FailureEvent:
    return FailureEvent(
        kind=kind,
        stage=stage,
        operation=operation,
        message=message[:2000],
        http_status=_http_status(exc) if exc is not None else None,
        cause=FailureCause.from_exception(exc) if exc is not None else None,
        evidence=list(evidence),
        details=details,
    )


def _engine_error(
    exc: BaseException,
    *,
    stage: FailureStage,
    operation: str,
    default_kind: str,
    what: str,
    details: FailureDetails | None = None,
) -> SandboxError:
    """Map an engine exception to a SandboxError carrying a FailureEvent."""
    if _engine_timed_out(exc):
        kind, message = "provider_io_timeout", f"{what}: the Docker engine did not answer in time"
    elif isinstance(exc, docker.errors.ImageNotFound):
        kind, message = "provider_image_missing", f"{what}: image not found ({exc}); {BUILD_HINT}"
    elif _engine_unreachable(exc):
        kind = "provider_unavailable"
        message = (
            f"{what}: the Docker engine is not reachable ({exc}); is dockerd running? (scripts/start-dockerd)"
        )
    else:
        kind, message = default_kind, f"{what}: {exc}"
    failure = _failure(kind, stage=stage, operation=operation, message=message, exc=exc, details=details)
    error = SandboxError(message, failure=failure)
    error.__cause__ = exc
    return error


def _slug(text: str, limit: int = 40) -> str:
    slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.") or "run"
    return slug[:limit]


def _parse_kv(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def find_memory_cgroup(container_id: str, pid: int | None) -> tuple[Path, int] | None:
    """The memory cgroup directory of a container and its cgroup version, or ``None``.

    Discovered from the main process's ``/proc/<pid>/cgroup`` when that is visible, else from the
    usual cgroupfs/systemd locations. A candidate must contain the full container id, so a PID that
    means something else in our PID namespace can never point at another container's cgroup.
    """
    candidates: list[Path] = []
    if pid:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
                rel = path.lstrip("/")
                if "memory" in controllers.split(","):
                    candidates.append(CGROUP_V1_ROOT / rel)
                elif hierarchy == "0" and controllers == "":
                    candidates.append(CGROUP_ROOT / rel)
    candidates += [
        CGROUP_V1_ROOT / "docker" / container_id,
        CGROUP_V1_ROOT / "system.slice" / f"docker-{container_id}.scope",
        CGROUP_ROOT / "system.slice" / f"docker-{container_id}.scope",
        CGROUP_ROOT / "docker" / container_id,
    ]
    for cand in candidates:
        if container_id not in str(cand):
            continue
        if (cand / "memory.oom_control").is_file():
            return cand, 1
        if (cand / "memory.events").is_file():
            return cand, 2
    return None


def read_memory_cgroup(path: Path, version: int) -> dict[str, Any]:
    """Read the OOM counter and memory numbers of one memory cgroup (v1 or v2)."""
    if version == 1:
        oom = _parse_kv((path / "memory.oom_control").read_text())
        return {
            "cgroup_version": 1,
            "path": str(path),
            "oom_kill": oom.get("oom_kill"),
            "under_oom": oom.get("under_oom"),
            "max_usage_in_bytes": _read_int(path / "memory.max_usage_in_bytes"),
            "usage_in_bytes": _read_int(path / "memory.usage_in_bytes"),
            "limit_in_bytes": _read_int(path / "memory.limit_in_bytes"),
            "failcnt": _read_int(path / "memory.failcnt"),
        }
    events = _parse_kv((path / "memory.events").read_text())
    return {
        "cgroup_version": 2,
        "path": str(path),
        "oom_kill": events.get("oom_kill"),
        "oom": events.get("oom"),
        "max_usage_in_bytes": _read_int(path / "memory.peak"),
        "usage_in_bytes": _read_int(path / "memory.current"),
        "limit_in_bytes": _read_int(path / "memory.max"),
    }


def _cgroup_present(found: tuple[Path, int]) -> bool:
    path, version = found
    return (path / ("memory.oom_control" if version == 1 else "memory.events")).is_file()


class _Tail:
    """A byte buffer keeping at most ``cap`` bytes: the newest ones."""

    def __init__(self, cap: int = OUTPUT_CAP_BYTES):
        self.cap = cap
        self.buf = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        self.buf += data
        excess = len(self.buf) - self.cap
        if excess > 0:
            del self.buf[:excess]
            self.dropped += excess

    def value(self) -> bytes:
        return bytes(self.buf)


class _AttachConn:
    """The hijacked attach connection of one exec: buffered reads, raw writes, shutdown."""

    def __init__(self, sock: Any):
        self._sockio = sock
        raw = getattr(sock, "_sock", sock)
        self.sock: socket.socket | None = raw if isinstance(raw, socket.socket) else None
        reader = None
        response = getattr(sock, "_response", None)
        with contextlib.suppress(AttributeError):
            # The HTTP layer's buffered reader may already hold bytes that followed the upgrade
            # headers; reading through it (not the raw socket) keeps them.
            reader = response.raw._fp.fp  # type: ignore[union-attr]
        if reader is None or not hasattr(reader, "read1"):
            reader = io.BufferedReader(sock)
        self.reader = reader
        if self.sock is not None:
            self.sock.settimeout(None)  # reads wait for the process; deadlines live on the async side
        self._closed = False
        self._lock = threading.Lock()

    def read1(self, n: int = 65536) -> bytes:
        return self.reader.read1(n)

    def read_exactly(self, n: int) -> bytes | None:
        """``n`` bytes, or ``None`` at a clean end of stream before the first byte."""
        data = self.reader.read(n)
        if not data:
            return None
        if len(data) < n:
            raise EOFError(f"attach stream ended inside a frame ({len(data)} of {n} bytes)")
        return data

    def sendall(self, data: bytes) -> None:
        if self.sock is not None:
            self.sock.sendall(data)
        else:
            view = memoryview(data)
            while view:
                n = self._sockio.write(view)
                view = view[n or 0 :]

    def shutdown_write(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        with contextlib.suppress(Exception):
            self._sockio.close()
        with contextlib.suppress(Exception):
            self._sockio._response.close()
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()


class _ExecJob:
    """One execution, driven by a daemon thread that reports to the event loop through a queue.

    Messages: ``("out", (stream, data))``, ``("done", (exit_code, note))``, ``("error", (stage, exc))``.
    Once abandoned (deadline, cancellation) the thread keeps draining output (so the process never
    blocks on a full pipe) but reports nothing more; release() closes its connection.
    """

    def __init__(
        self,
        api: Any,
        container_id: str,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        loop: asyncio.AbstractEventLoop,
        user: str | None = None,
    ):
        self.api = api
        self.user = user
        self.container_id = container_id
        self.argv = list(argv)
        self.cwd = cwd
        self.env = dict(env) if env else None
        self.stdin = stdin
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.exec_id: str | None = None
        self.started = False  # the start request was sent: the command may be running
        self.conn: _AttachConn | None = None
        self.abandoned = False
        self.finished = False
        self.thread = threading.Thread(target=self._run, name="docker-exec", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def abandon(self) -> None:
        self.abandoned = True

    def close(self) -> None:
        self.abandoned = True
        if self.conn is not None:
            self.conn.close()

    def _post(self, kind: str, payload: Any) -> None:
        if self.abandoned:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))

    def _run(self) -> None:
        stage = "create"
        try:
            created = self.api.exec_create(
                self.container_id,
                self.argv,
                stdout=True,
                stderr=True,
                stdin=self.stdin is not None,
                tty=False,
                environment=self.env,
                workdir=self.cwd,
                # "" is the container's user (the image's USER, or SandboxSpec.user at create).
                user=self.user or "",
            )
            self.exec_id = created["Id"]
            if self.abandoned:
                return  # never started: the command did not run
            stage = "start"
            self.started = True
            self.conn = _AttachConn(self.api.exec_start(self.exec_id, socket=True))
            stage = "stream"
            if self.stdin is not None:
                threading.Thread(target=self._write_stdin, name="docker-exec-stdin", daemon=True).start()
            lost: BaseException | None = None
            try:
                self._read_frames()
            except (OSError, EOFError, ValueError) as exc:
                lost = exc
            stage = "exit"
            exit_code, note = self._exit_code()
            if lost is not None and exit_code is None:
                self._post("error", ("stream", lost))
            else:
                if lost is not None:
                    note = f"output stream broke ({lost}); exit code read from the engine"
                self._post("done", (exit_code, note))
        except BaseException as exc:
            self._post("error", (stage, exc))
        finally:
            self.finished = True
            if self.conn is not None:
                self.conn.close()

    def _write_stdin(self) -> None:
        assert self.conn is not None and self.stdin is not None
        try:
            if self.stdin:
                self.conn.sendall(self.stdin)
        except OSError as exc:
            log.debug("stdin write to exec %s failed: %s", self.exec_id, exc)
        finally:
            self.conn.shutdown_write()

    def _read_frames(self) -> None:
        assert self.conn is not None
        while True:
            header = self.conn.read_exactly(8)
            if header is None:
                return
            stream_id, size = struct.unpack(">BxxxL", header)
            if size == 0:
                continue
            data = self.conn.read_exactly(size)
            if data is None:
                raise EOFError("attach stream ended after a frame header")
            if stream_id in (1, 2):
                self._post("out", ("stdout" if stream_id == 1 else "stderr", data))

    def _exit_code(self) -> tuple[int | None, str | None]:
        deadline = time.monotonic() + EXIT_POLL_S
        last_error: str | None = None
        while not self.abandoned:
            try:
                info = self.api.exec_inspect(self.exec_id)
            except Exception as exc:
                last_error = f"exec_inspect failed: {exc}"
            else:
                if not info.get("Running") and isinstance(info.get("ExitCode"), int):
                    return info["ExitCode"], None
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        return None, last_error or "the engine did not report an exit code after the output ended"


class DockerPty(PtyHandle):
    """An interactive terminal: a tty exec over its attach socket."""

    def __init__(
        self,
        sandbox: DockerSandbox,
        exec_id: str,
        conn: _AttachConn,
        loop: asyncio.AbstractEventLoop,
        marker: str,
    ):
        self._sandbox = sandbox
        self.exec_id = exec_id
        self.marker = marker  # "OPENCODE_TUI_PTY=<token>" in the environment of the terminal's processes
        self._conn = conn
        self._loop = loop
        self._out = QueuedOutput()
        self._closed = False
        self._thread = threading.Thread(target=self._pump, name="docker-pty", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while True:
                data = self._conn.read1(65536)
                if not data:
                    break
                self._post(data)
        except (OSError, ValueError):
            pass
        finally:
            self._post(b"")

    def _post(self, data: bytes) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._out.put, data)

    async def read(self, max_bytes: int = 65536) -> bytes:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if self._closed:
            return b""  # closed by us: whatever was still queued is dropped
        return await self._out.read(max_bytes)

    async def write(self, data: bytes) -> None:
        if self._closed or self._sandbox.closed:
            raise SandboxClosedError("the terminal is closed")
        try:
            await _blocking(self._conn.sendall, bytes(data), within=PTY_WRITE_DEADLINE_S)
        except (OSError, TimeoutError) as exc:
            raise self._pty_error("write", exc) from exc

    async def resize(self, cols: int, rows: int) -> None:
        if self._closed or self._sandbox.closed:
            raise SandboxClosedError("the terminal is closed")
        if cols <= 0 or rows <= 0:
            raise ValueError("cols and rows must be positive")
        try:
            await _blocking(
                self._sandbox._api.exec_resize, self.exec_id, height=rows, width=cols, within=CALL_DEADLINE_S
            )
        except Exception as exc:
            raise self._pty_error("resize", exc) from exc

    async def close(self) -> None:
        """Disconnect and end the terminal's processes (HUP, then KILL after a short grace)."""
        if self._closed:
            return
        self._closed = True
        self._conn.close()
        self._sandbox._ptys.discard(self)
        if self._sandbox.owned and self._sandbox.closed:
            return  # the container itself is being destroyed
        try:
            await self._sandbox._run_exec(
                # As root: it must see (in /proc) and signal whatever the terminal's user started.
                ["/bin/sh", "-c", _END_MARKED_SH, "sh", self.marker],
                timeout=PTY_END_DEADLINE_S,
                user="0",
            )
        except SandboxError as exc:
            log.warning("could not end the processes of terminal %s: %s", self.exec_id[:12], exc)

    def close_now(self) -> None:
        """Disconnect only (the owned container is about to be removed)."""
        self._closed = True
        self._conn.close()

    def _pty_error(self, operation: str, exc: BaseException) -> SandboxError:
        return _engine_error(
            exc,
            stage=FailureStage.AGENT,
            operation=f"pty.{operation}",
            default_kind="sandbox_pty_failed",
            what=f"terminal {operation} failed",
        )


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
        self._release_lock = asyncio.Lock()

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
        if self.owned:
            # We created it: its cgroup is fresh, so every OOM kill it ever counts is ours.
            self._oom_baseline = 0
            return
        self._oom_killed_at_connect = bool(state.get("OOMKilled"))
        if found is not None:
            with contextlib.suppress(OSError, TimeoutError):
                data = await _blocking(read_memory_cgroup, *found, within=5.0)
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
        failure = _failure(
            kind,
            stage=FailureStage.AGENT,
            operation="exec",
            message=message,
            exc=exc,
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
        target = PurePosixPath(dest_dir)
        if target.name and any(m.isdir() and PurePosixPath(m.name) == PurePosixPath(".") for m in members):
            # The engine skips a "." entry when the target exists; extracted from the parent, the
            # target's own owner and mode come from the archive (and "." is the target by name).
            archive = tarsafe.reroot(archive, target.name)
            dest_dir = str(target.parent)
        # As root, whatever the image's user: the engine extracts as root with the archive's owners.
        made = await self.exec(["mkdir", "-p", "--", dest_dir], timeout=CALL_DEADLINE_S, user="0")
        if not made.ok:
            detail = made.stderr.decode("utf-8", "replace").strip() or made.error or f"exit {made.exit_code}"
            message = f"upload: cannot create {dest_dir!r} in the sandbox: {detail}"
            raise SandboxError(
                message,
                failure=_failure(
                    "sandbox_file_failed", stage=FailureStage.SEED, operation="upload", message=message
                ),
            )
        try:
            ok = await _blocking(
                self._api.put_archive, self.sandbox_id, dest_dir, archive, within=FILE_DEADLINE_S
            )
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
                failure=_failure(
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
                failure=_failure(
                    "sandbox_file_failed",
                    stage=FailureStage.SEED,
                    operation="download",
                    message=message,
                    exc=exc,
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
        out = [Evidence(source=SOURCE_EVENTS, scope=cid, data={**window, "matched": len(events)})]
        for ev in events:
            actor = ev.get("Actor") or {}
            container_id = actor.get("ID") or ev.get("id")
            if container_id != cid:
                continue  # never another container's report
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
            data = await _blocking(read_memory_cgroup, *found, within=budget_s)
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
            notes.append(f"network_mode={host.get('NetworkMode')}")
            if host.get("Init"):
                notes.append("init=docker-init")
        if not limit:
            notes.append("no memory limit set")
        return SandboxStatus(
            sandbox_id=self.sandbox_id,
            provider=self.provider,
            owned=self.owned,
            state=state,
            memory_limit_enforced=True if limit else None,
            notes=notes,
            evidence=evidence,
        )

    async def probe(self, timeout: float) -> SandboxProbe:
        """The engine's answer about this container, also after release (issue 19: engine lost)."""
        from core.sandbox.docker.probe import probe_container

        # Only a container we created is known to have started after ``_since`` (a borrowed one was
        # started before we connected).
        since = self._since if self.owned else None
        return await probe_container(self._api, self.sandbox_id, timeout, since=since)

    # --------------------------------------------------------------------------------- release

    async def release(self) -> None:
        async with self._release_lock:
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
            except docker.errors.APIError as exc:
                if not (_http_status(exc) == 409 and "already in progress" in str(exc)):
                    raise _engine_error(
                        exc,
                        stage=FailureStage.CLEANUP,
                        operation="release",
                        default_kind="sandbox_release_failed",
                        what=f"removing container {self.sandbox_id[:12]} failed",
                    ) from exc
            except Exception as exc:
                raise _engine_error(
                    exc,
                    stage=FailureStage.CLEANUP,
                    operation="release",
                    default_kind="sandbox_release_failed",
                    what=f"removing container {self.sandbox_id[:12]} failed",
                ) from exc
            self._removed = True


class DockerProvider(SandboxProvider):
    """Docker containers as sandboxes (docker SDK; local images only, never a bridge network).

    ``main_argv`` replaces the idle main process (e.g. for an image with its own init, or for tests
    that need the main process itself to be the workload); ``use_init`` runs it under docker-init.
    """

    name = "docker"

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        base_url: str | None = None,
        owner: str | None = None,
        default_image: str = DEFAULT_IMAGE,
        main_argv: Sequence[str] | None = None,
        use_init: bool = True,
        api_timeout: float = API_TIMEOUT_S,
    ):
        self._client = client
        self._base_url = base_url
        self.owner = owner or default_owner()
        self.default_image = default_image
        self.main_argv = tuple(main_argv) if main_argv else IDLE_MAIN
        self.use_init = use_init
        self.api_timeout = api_timeout

    def _make_client(self) -> docker.DockerClient:
        if self._base_url:
            return docker.DockerClient(base_url=self._base_url, timeout=int(self.api_timeout))
        return docker.from_env(timeout=int(self.api_timeout))

    async def _get_client(self, stage: FailureStage, operation: str) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = await _blocking(self._make_client, within=CALL_DEADLINE_S)
            except Exception as exc:
                raise _engine_error(
                    exc,
                    stage=stage,
                    operation=operation,
                    default_kind="provider_unavailable",
                    what="connecting to the Docker engine failed",
                ) from exc
        return self._client

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        stage, op = FailureStage.SEED, "create"
        client = await self._get_client(stage, op)
        image = spec.image or self.default_image
        try:
            await _blocking(client.api.inspect_image, image, within=CALL_DEADLINE_S)
        except docker.errors.NotFound as exc:
            message = f"image {image!r} is not available on this Docker engine; {BUILD_HINT}"
            raise SandboxError(
                message,
                failure=_failure(
                    "provider_image_missing",
                    stage=stage,
                    operation=op,
                    message=message,
                    exc=exc,
                    details=GenericDetails(data={"image": image}),
                ),
            ) from exc
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_allocation_failed",
                what="checking the image",
            ) from exc

        mounts = [
            DockerMount(target=m.target, source=m.source, type="bind", read_only=m.read_only)
            for m in spec.mounts
        ]
        if spec.model_socket:
            source = os.path.abspath(spec.model_socket)  # noqa: ASYNC240 (pure string operation)
            if not await asyncio.to_thread(os.path.exists, source):
                message = f"model socket {source!r} does not exist on the host; start the model proxy first"
                raise SandboxError(
                    message,
                    failure=_failure("sandbox_allocation_failed", stage=stage, operation=op, message=message),
                )
            # Read-only: connect() still works, but the sandbox cannot chmod/chown the host's socket.
            mounts.append(
                DockerMount(target=SANDBOX_MODEL_SOCKET, source=source, type="bind", read_only=True)
            )
        name = f"opencode-tui-{_slug(spec.run_id)}-{uuid.uuid4().hex[:8]}"
        kwargs: dict[str, Any] = {
            "image": image,
            "entrypoint": list(self.main_argv),
            "name": name,
            "labels": {
                **spec.labels,
                LABEL_RUN: spec.run_id,
                LABEL_OWNER: self.owner,
                LABEL_INVOCATION: invocation_id(),
            },
            "init": self.use_init,
            "network_mode": "host" if spec.network is NetworkPolicy.HOST else "none",
            "working_dir": spec.workdir,
            "environment": dict(spec.env),
            "mounts": mounts,
            # Empty keeps the image's USER; every exec and terminal then runs as this user.
            "user": spec.user or "",
            "detach": True,
        }
        if spec.memory_bytes:
            kwargs["mem_limit"] = spec.memory_bytes
            kwargs["memswap_limit"] = spec.memory_bytes  # no swap: the limit is real and OOM is real
        if spec.cpus:
            kwargs["nano_cpus"] = int(spec.cpus * 1e9)

        since = time.time() - 1.0
        try:
            container = await _blocking(client.containers.create, within=CALL_DEADLINE_S, **kwargs)
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                await self._remove_quietly(client, name)  # the create may still land later
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_allocation_failed",
                what="creating the container",
            ) from exc
        try:
            await _blocking(container.start, within=CALL_DEADLINE_S)
            attrs = await _blocking(client.api.inspect_container, container.id, within=CALL_DEADLINE_S)
        except Exception as exc:
            await self._remove_quietly(client, container.id)
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_allocation_failed",
                what="starting the container",
            ) from exc

        sandbox = DockerSandbox(
            client, container.id, owned=True, since=since, name=name, memory_bytes=spec.memory_bytes
        )
        try:
            await sandbox._record_baseline(attrs=attrs)
            reason = await sandbox._wait_ready(spec.ready_timeout_s)
        except BaseException:
            await sandbox.release()
            raise
        if reason is not None:
            evidence: list[Evidence] = []
            with contextlib.suppress(Exception):
                evidence = await sandbox.inspect()
            await sandbox.release()
            message = (
                f"container {container.id[:12]} did not become ready within {spec.ready_timeout_s:g}s "
                f"(exec `true`): {reason}"
            )
            raise SandboxError(
                message,
                failure=_failure(
                    "sandbox_not_ready", stage=stage, operation=op, message=message, evidence=evidence
                ),
            )
        return sandbox

    async def _remove_quietly(self, client: docker.DockerClient, ref: str) -> None:
        try:
            await _blocking(client.api.remove_container, ref, force=True, v=True, within=RELEASE_DEADLINE_S)
        except docker.errors.NotFound:
            pass
        except Exception as exc:
            log.warning(
                "could not remove container %s after a failed create: %s (sweep will find it)", ref, exc
            )

    async def connect(self, sandbox_id: str) -> DockerSandbox:
        stage, op = FailureStage.SEED, "connect"
        client = await self._get_client(stage, op)
        since = time.time()
        try:
            attrs = await _blocking(client.api.inspect_container, sandbox_id, within=CALL_DEADLINE_S)
        except docker.errors.NotFound as exc:
            message = f"no container {sandbox_id!r} on this Docker engine"
            raise SandboxError(
                message, failure=_failure("sandbox_lost", stage=stage, operation=op, message=message, exc=exc)
            ) from exc
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_lost",
                what=f"connecting to {sandbox_id!r}",
            ) from exc
        memory = (attrs.get("HostConfig") or {}).get("Memory") or None
        sandbox = DockerSandbox(
            client,
            attrs["Id"],
            owned=False,
            since=since,
            name=(attrs.get("Name") or "").lstrip("/"),
            memory_bytes=memory,
        )
        await sandbox._record_baseline(attrs=attrs)
        return sandbox

    async def sweep(self, *, dry_run: bool = False, owner: str | None = None) -> list[str]:
        stage, op = FailureStage.CLEANUP, "sweep"
        ids = [record.sandbox_id for record in await self.listed(owner=owner)]
        if dry_run:
            return ids
        client = await self._get_client(stage, op)
        removed: list[str] = []
        failures: list[str] = []
        for cid in ids:
            try:
                await _blocking(
                    client.api.remove_container, cid, force=True, v=True, within=RELEASE_DEADLINE_S
                )
            except docker.errors.NotFound:
                pass  # gone already: still a leftover that no longer exists
            except Exception as exc:
                failures.append(f"{cid[:12]}: {exc}")
                continue
            removed.append(cid)
        if failures:
            message = (
                f"sweep removed {len(removed)} container(s) but failed on {len(failures)}: "
                + "; ".join(failures)
            )
            raise SandboxError(
                message,
                failure=_failure("sandbox_release_failed", stage=stage, operation=op, message=message),
            )
        return removed

    async def listed(self, *, owner: str | None = None) -> list[SandboxRecord]:
        stage, op = FailureStage.CLEANUP, "list"
        client = await self._get_client(stage, op)
        label = f"{LABEL_OWNER}={owner}" if owner else LABEL_OWNER
        try:
            found = await _blocking(
                client.api.containers, all=True, filters={"label": label}, within=CALL_DEADLINE_S
            )
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_release_failed",
                what="listing sandboxes",
            ) from exc
        return [
            SandboxRecord(provider=self.name, sandbox_id=c["Id"], labels=dict(c.get("Labels") or {}))
            for c in found
        ]

    async def remove(self, sandbox_id: str) -> None:
        stage, op = FailureStage.CLEANUP, "remove"
        client = await self._get_client(stage, op)
        try:
            await _blocking(
                client.api.remove_container, sandbox_id, force=True, v=True, within=RELEASE_DEADLINE_S
            )
        except docker.errors.NotFound:
            pass
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_release_failed",
                what=f"removing container {sandbox_id[:12]} failed",
            ) from exc
