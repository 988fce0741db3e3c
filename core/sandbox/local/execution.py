"""The host side of one exec or pty in a local sandbox: output pumps, deadline, exit status.

See "Exec" in core/sandbox/local/provider.py's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Sequence
from datetime import datetime
from typing import Any, Protocol

from opencode_tui_core.failures import (
    CommandDetails,
    Delivery,
    FailureStage,
)
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.sandbox.base import (
    ExecResult,
    OutputCallback,
    OutputChunk,
    PtyHandle,
)
from opencode_tui_core.sandbox.errors import SandboxClosedError
from opencode_tui_core.sandbox.local.common import _error
from opencode_tui_core.sandbox.local.keeper import _Keeper, _Launch, _StatusReader
from opencode_tui_core.sandbox.local.procs import _ChildHandle, _kill_tree, _pidfd_wait_status


class ExecHost(Protocol):
    """What a running command or terminal needs of its local sandbox (``LocalSandbox`` is one)."""

    sandbox_id: str
    share_pidns: bool  # commands join the keeper's PID namespace
    _keeper: _Keeper | None  # the sandbox's pid 1, when one is known
    _ptys: set[_LocalPty]  # open terminals (one forgets itself when it closes)

    def _command_started(self, host_pid: int, argv: Sequence[str]) -> None:
        """The live fault watch learns the command's process before it runs (see ``FaultWatcher.remember``)."""


_DRAIN_IDLE_S = 0.1  # after the command exits: keep reading while output still arrives this often
_DRAIN_MAX_S = 1.0
_PTY_BUFFER_MAX = 1 << 20
_PTY_REAP_S = 1.5  # a closed terminal's bwrap exits within this once its command is killed


class _Pump:
    """Reads one output pipe as data arrives and queues it for the dispatcher."""

    def __init__(self, fd: int, stream: str, queue: asyncio.Queue[tuple[str, bytes] | None], sink: bytearray):
        self.fd = fd
        self.stream = stream
        self.queue = queue
        self.sink = sink
        self.eof = False
        self.last_data = 0.0
        os.set_blocking(fd, False)

    def read_available(self) -> None:
        while not self.eof:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.eof = True
                return
            self.sink += data
            self.last_data = time.monotonic()
            self.queue.put_nowait((self.stream, data))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.read_available()
            if self.eof:
                return
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.fd, lambda f=fut: f.done() or f.set_result(None))  # type: ignore[misc]  # mypy cannot infer a lambda with a default (it binds this loop's future)
            try:
                await fut
            finally:
                loop.remove_reader(self.fd)


def _kill_exec_tree(sb: ExecHost, child: int, pidfd: int | None) -> None:
    """Kill what one exec started. In the sandbox's shared PID namespace: the command's session and
    descendants. In an exec's own PID namespace (non-root): its pid 1, and the kernel kills the rest.

    Only while the keeper lives: a dead keeper's namespace is empty (the kernel killed everything in
    it), and its inode number, which ``_kill_tree`` takes for the sandbox, is handed to the next new
    namespace at once: another sandbox's, whose processes may by then carry this exec's old numbers.
    """
    if sb.share_pidns:
        k = sb._keeper
        if k is not None and k.alive():  # its namespace is pinned (see _Keeper.pin): the inode is ours
            _kill_tree(child, k.pidns)
    elif pidfd is not None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)


class _ExecRun:
    """The host side of one exec: status fd, output pumps, dispatcher, deadline."""

    def __init__(
        self,
        sandbox: ExecHost,
        eid: str,
        proc: asyncio.subprocess.Process,
        launch: _Launch,
        out_r: int,
        err_r: int,
        on_output: OutputCallback | None,
        argv: Sequence[str],
    ):
        self.sb = sandbox
        self.eid = eid
        self.argv = list(argv)
        self.proc = proc
        self.launch = launch
        self.launcher = _ChildHandle(proc.pid)  # bwrap: signalled by pidfd, never by its number
        self.status = _StatusReader(launch.status_r)
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        self.pumps = [
            _Pump(out_r, "stdout", self.queue, self.stdout),
            _Pump(err_r, "stderr", self.queue, self.stderr),
        ]
        self.on_output = on_output
        self.callback_error: BaseException | None = None
        self.child: int | None = None
        self.pidfd: int | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.dispatcher: asyncio.Task[None] | None = None

    async def _dispatch(self) -> None:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if self.on_output is None or self.callback_error is not None:
                continue
            stream, data = item
            try:
                res = self.on_output(OutputChunk(execution_id=self.eid, stream=stream, data=data))  # type: ignore[arg-type]
                if isinstance(res, Awaitable):
                    await res
            except Exception as exc:
                self.callback_error = exc

    def _result(self, started: datetime, **kw: Any) -> ExecResult:
        return ExecResult(
            execution_id=self.eid,
            stdout=bytes(self.stdout),
            stderr=bytes(self.stderr),
            started_at=started,
            ended_at=utcnow(),
            **kw,
        )

    async def run(self, deadline: float, stdin: bytes | None, started: datetime) -> ExecResult:
        loop = asyncio.get_running_loop()
        child = await self.status.wait_for("child-pid", deadline - loop.time())
        if not isinstance(child, int):
            return await self._setup_failed(started, deadline)
        self.child = child
        with contextlib.suppress(OSError):
            self.pidfd = os.pidfd_open(child)
        self.sb._command_started(child, self.argv)
        # The command is held by --block-fd until now: it starts only once we can observe it.
        os.write(self.launch.block_w, b"x")
        self.dispatcher = asyncio.ensure_future(self._dispatch())
        self.tasks = [asyncio.ensure_future(p.run()) for p in self.pumps]
        if stdin is not None and self.proc.stdin is not None:
            self.tasks.append(asyncio.ensure_future(self._feed(stdin)))
        try:
            await asyncio.wait_for(self.proc.wait(), max(deadline - loop.time(), 0))
        except TimeoutError:
            await self._terminate()
            await self._drain(0.05)
            await self._finish_dispatch()
            return self._result(
                started,
                exit_code=None,
                observed=False,
                deadline_expired=True,
                error="the exec deadline expired; the command's process tree was killed",
            )
        await self._drain(_DRAIN_MAX_S)
        await self._finish_dispatch()
        if self.callback_error is not None:
            raise self.callback_error
        return self._decode_exit(started)

    async def _feed(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()

    def _decode_exit(self, started: datetime) -> ExecResult:
        raw = _pidfd_wait_status(self.pidfd) if self.pidfd is not None else None
        if raw is not None:
            if os.WIFSIGNALED(raw):
                return self._result(started, exit_code=None, signal=os.WTERMSIG(raw), observed=True)
            if os.WIFEXITED(raw):
                return self._result(started, exit_code=os.WEXITSTATUS(raw), observed=True)
        code = self.status.get("exit-code")
        if isinstance(code, int):
            return self._result(started, exit_code=code, observed=True)
        rc = self.proc.returncode
        if rc is not None and rc >= 0:
            return self._result(started, exit_code=rc, observed=True)
        return self._result(
            started,
            exit_code=None,
            observed=False,
            error=f"bwrap ended by signal {-rc if rc else '?'} before reporting the command's exit",
        )

    async def _drain(self, budget: float) -> None:
        """After the command exited: read what is still coming, but never wait for a background
        process that inherited the pipes."""
        loop = asyncio.get_running_loop()
        end = loop.time() + budget
        while loop.time() < end:
            pending = [t for t in self.tasks[:2] if not t.done()]
            if not pending:
                break
            await asyncio.wait(pending, timeout=_DRAIN_IDLE_S)
            last = max(p.last_data for p in self.pumps)
            if time.monotonic() - last >= _DRAIN_IDLE_S:
                break
        for t in self.tasks[:2]:
            t.cancel()
        await asyncio.gather(*self.tasks[:2], return_exceptions=True)
        for p in self.pumps:
            p.read_available()

    async def _finish_dispatch(self) -> None:
        self.queue.put_nowait(None)
        if self.dispatcher is not None:
            await self.dispatcher

    async def _setup_failed(self, started: datetime, deadline: float) -> ExecResult:
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline and not self.status.eof:
            await self._terminate()
            return self._result(
                started,
                exit_code=None,
                observed=False,
                deadline_expired=True,
                error="the exec deadline expired before the sandbox started the command (it never ran)",
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 5)
        for p in self.pumps:
            p.read_available()
        why = (bytes(self.stderr) + bytes(self.stdout)).decode("utf-8", "replace").strip() or "no output"
        keeper_alive = self.sb._keeper is not None and self.sb._keeper.usable()
        kind = "command_failed" if keeper_alive else "sandbox_lost"
        raise _error(
            kind,
            "exec",
            f"local sandbox {self.sb.sandbox_id} could not start the command (it never ran): {why}",
            stage=FailureStage.AGENT,
            details=CommandDetails(execution_id=self.eid, delivery=Delivery.NOT_SENT),
        )

    async def _terminate(self) -> None:
        """Kill the command's tree; bwrap then reaps its child and exits by itself (killing bwrap
        first would hand the command's zombie to the host's init). bwrap itself only as a fallback."""
        if self.child is not None:
            _kill_exec_tree(self.sb, self.child, self.pidfd)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 1.5)
        if self.proc.returncode is None:  # (reaped or not: see _ChildHandle)
            self.launcher.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 2)

    async def cleanup(self) -> None:
        if self.proc.returncode is None:
            await self._terminate()
        pending = [t for t in self.tasks if not t.done()]
        if self.dispatcher is not None and not self.dispatcher.done():
            pending.append(self.dispatcher)
        for t in pending:
            t.cancel()
        # The pumps must have removed their readers before their fds are closed.
        await asyncio.gather(*pending, return_exceptions=True)
        for fd in [p.fd for p in self.pumps]:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
        self.launcher.close()
        self.launch.close_all()


class _LocalPty(PtyHandle):
    """A terminal inside the sandbox: bwrap spawned on a pty (ptyprocess), read via ``add_reader``."""

    def __init__(self, sandbox: ExecHost, proc: Any, child: int, pidfd: int | None):
        self._sb = sandbox
        self._proc = proc
        self._child = child
        self._pidfd = pidfd
        self._fd: int = proc.fd
        self._buf = bytearray()
        self._eof = False
        self._closed = False
        self._reading = False
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        os.set_blocking(self._fd, False)
        self._start_reading()

    def _start_reading(self) -> None:
        if not self._reading and not self._eof and not self._closed:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every process holding the terminal has gone
            data = b""
        if data:
            self._buf += data
            if len(self._buf) >= _PTY_BUFFER_MAX:
                self._stop_reading()  # back-pressure until the reader catches up
        else:
            self._eof = True
            self._stop_reading()
        self._event.set()

    async def read(self, max_bytes: int = 65536) -> bytes:
        while not self._buf and not self._eof and not self._closed:
            self._event.clear()
            await self._event.wait()
        if self._buf and not self._closed:
            out = bytes(self._buf[:max_bytes])
            del self._buf[:max_bytes]
            self._start_reading()
            return out
        return b""

    async def write(self, data: bytes) -> None:
        if self._closed:
            raise SandboxClosedError("the terminal was closed")
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                await asyncio.sleep(0.005)
                continue
            except OSError as exc:
                raise _error(
                    "sandbox_pty_failed",
                    "pty write",
                    f"terminal write failed: {exc}",
                    stage=FailureStage.AGENT,
                    exc=exc,
                ) from exc
            view = view[n:]

    async def resize(self, cols: int, rows: int) -> None:
        if self._closed:
            raise SandboxClosedError("the terminal was closed")
        self._proc.setwinsize(rows, cols)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_reading()
        self._event.set()
        _kill_exec_tree(self._sb, self._child, self._pidfd)
        # bwrap reaps its killed child and exits by itself: killing bwrap first would hand the
        # child's zombie to the host's init, and the keeper (the PID namespace's init) then waits
        # for that zombie to be reaped before it can die; a slow host init made every release of a
        # sandbox with a digest server take over a second. bwrap itself only as a fallback.
        for _ in range(int(_PTY_REAP_S / 0.005)):
            if not self._proc.isalive():  # (reaps it: a number waited for is never signalled)
                break
            await asyncio.sleep(0.005)
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._proc.close, True)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._sb._ptys.discard(self)
