"""One exec or PTY in a container over its attach socket, driven by a daemon thread.

See "Exec streaming" and "PTY" in core/sandbox/docker/provider.py's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import socket
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from opencode_tui_core.failures import (
    FailureStage,
)
from opencode_tui_core.sandbox.base import (
    ExecResult,
    PtyHandle,
    QueuedOutput,
)
from opencode_tui_core.sandbox.docker.common import (
    CALL_DEADLINE_S,
    EXIT_POLL_S,
    OUTPUT_CAP_BYTES,
    PTY_END_DEADLINE_S,
    PTY_WRITE_DEADLINE_S,
    _blocking,
    _engine_error,
)
from opencode_tui_core.sandbox.docker.engine_socket import EngineSocket
from opencode_tui_core.sandbox.errors import SandboxClosedError, SandboxError

log = logging.getLogger(__name__)


class TerminalHost(Protocol):
    """What a terminal needs of its container (``DockerSandbox`` is one)."""

    owned: bool
    _api: Any  # the engine's low-level API client
    _ptys: set[DockerPty]  # open terminals (one forgets itself when it closes)

    @property
    def closed(self) -> bool: ...

    async def _run_exec(
        self, argv: Sequence[str], *, timeout: float, user: str | None = None
    ) -> ExecResult: ...


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


class _ExecState:
    """What both exec jobs keep of one execution, and the state ``_run_exec`` reads."""

    def __init__(
        self,
        container_id: str,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        user: str | None,
    ):
        self.container_id = container_id
        self.argv = list(argv)
        self.cwd = cwd
        self.env = dict(env) if env else None
        self.stdin = stdin
        self.user = user
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.exec_id: str | None = None
        self.started = False  # the start request was sent: the command may be running
        self.abandoned = False
        self.finished = False

    def abandon(self) -> None:
        self.abandoned = True


class _SocketExecJob(_ExecState):
    """One execution driven from the event loop through the engine's Unix socket (``EngineSocket``):
    the same messages on ``queue`` as ``_ExecJob``, with no thread and no SDK in between.

    Once abandoned (deadline, cancellation) it keeps draining output (so the process never blocks on
    a full pipe) but reports nothing more; ``close`` ends its stream."""

    def __init__(
        self,
        engine: EngineSocket,
        container_id: str,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        user: str | None = None,
    ):
        super().__init__(container_id, argv, cwd, env, stdin, user)
        self.engine = engine
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def close(self) -> None:
        self.abandoned = True
        if self._writer is not None:
            self._writer.transport.abort()
        elif self._task is not None and not self.started:
            self._task.cancel()  # still creating: nothing runs yet

    def _post(self, kind: str, payload: Any) -> None:
        if not self.abandoned:
            self.queue.put_nowait((kind, payload))

    async def _run(self) -> None:
        stage = "create"
        try:
            config = {
                "AttachStdin": self.stdin is not None,
                "AttachStdout": True,
                "AttachStderr": True,
                "Tty": False,
                "Cmd": self.argv,
                # "" is the container's user (the image's USER, or SandboxSpec.user at create).
                "User": self.user or "",
                **({"Env": [f"{k}={v}" for k, v in self.env.items()]} if self.env else {}),
                **({"WorkingDir": self.cwd} if self.cwd else {}),
            }
            created = await self.engine.call("POST", f"/containers/{self.container_id}/exec", config)
            self.exec_id = str(created["Id"])
            if self.abandoned:
                return  # never started: the command did not run
            stage = "start"
            self.started = True
            reader, self._writer = await self.engine.attach(
                "POST", f"/exec/{self.exec_id}/start", {"Detach": False, "Tty": False}
            )
            stage = "stream"
            feeding = asyncio.ensure_future(self._write_stdin(self._writer))
            lost: BaseException | None = None
            try:
                await self._read_frames(reader)
            except (OSError, EOFError, ValueError, asyncio.IncompleteReadError) as exc:
                lost = exc
            finally:
                feeding.cancel()
            stage = "exit"
            exit_code, note = await self._exit_code()
            if lost is not None and exit_code is None:
                self._post("error", ("stream", lost))
            else:
                if lost is not None:
                    note = f"output stream broke ({lost}); exit code read from the engine"
                self._post("done", (exit_code, note))
        except asyncio.CancelledError:
            pass  # closed while creating: nothing was started
        except Exception as exc:
            self._post("error", (stage, exc))
        finally:
            self.finished = True
            if self._writer is not None:
                self._writer.transport.abort()

    async def _write_stdin(self, writer: asyncio.StreamWriter) -> None:
        try:
            if self.stdin:
                writer.write(self.stdin)
                await writer.drain()
            if self.stdin is not None:
                writer.write_eof()
        except (OSError, RuntimeError) as exc:
            log.debug("stdin write to exec %s failed: %s", self.exec_id, exc)

    async def _read_frames(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                header = await reader.readexactly(8)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise EOFError(
                        f"attach stream ended inside a frame header ({len(exc.partial)} of 8 bytes)"
                    ) from exc
                return
            stream_id, size = struct.unpack(">BxxxL", header)
            if size == 0:
                continue
            data = await reader.readexactly(size)
            if stream_id in (1, 2):
                self._post("out", ("stdout" if stream_id == 1 else "stderr", data))

    async def _exit_code(self) -> tuple[int | None, str | None]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + EXIT_POLL_S
        last_error: str | None = None
        while not self.abandoned:
            try:
                info = await self.engine.call("GET", f"/exec/{self.exec_id}/json")
            except Exception as exc:
                last_error = f"exec inspect failed: {exc}"
            else:
                if not info.get("Running") and isinstance(info.get("ExitCode"), int):
                    return info["ExitCode"], None
            if loop.time() >= deadline:
                break
            await asyncio.sleep(0.05)
        return None, last_error or "the engine did not report an exit code after the output ended"


class _ExecJob(_ExecState):
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
        super().__init__(container_id, argv, cwd, env, stdin, user)
        self.api = api
        self.loop = loop
        self.conn: _AttachConn | None = None
        self.thread = threading.Thread(target=self._run, name="docker-exec", daemon=True)

    def start(self) -> None:
        self.thread.start()

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
        sandbox: TerminalHost,
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
