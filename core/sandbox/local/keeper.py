"""The keeper (a sandbox's pid 1) and its holder process, and the bwrap launch plumbing.

See "One sandbox" in core/sandbox/local/provider.py's docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencode_tui_core.sandbox.local.common import _HOST_ENV
from opencode_tui_core.sandbox.local.procs import _proc_stat, _ProcStat

# PID-namespace init it only receives signals it handles, so nothing inside can kill it.
_KEEPER_SCRIPT = (
    "command -v sleep >/dev/null 2>&1 || exit 127; echo ready; exec >/dev/null; "
    "while :; do sleep 3600 & wait; done"
)
_CGROUP_WRAPPER = 'echo $$ > "$0" && exec "$@"'
# The same into two cgroups (memory, pids): $0 and $1 are their cgroup.procs files.
_CGROUPS_WRAPPER = 'echo $$ > "$0" && echo $$ > "$1" && shift && exec "$@"'
# The keeper's parent (see the module docstring). argv: control fd, status fd, then the keeper's argv.
# Stdlib only and run with -I -S: it starts in a few milliseconds and reads no site or environment.
_HOLDER_SCRIPT = r"""
import os, select, signal, sys
ctl, status, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
pid = os.fork()
if pid == 0:
    os.close(ctl)
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        os.write(2, f"holder: cannot exec {argv[0]}: {exc}\n".encode())
    os._exit(127)
# Our copies of the status and ready pipes would hide the keeper's early death from the engine.
os.close(status)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.close(null)
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)
pidfd = os.pidfd_open(pid)
poll = select.poll()
poll.register(ctl, select.POLLIN)
poll.register(pidfd, select.POLLIN)
kept = False
while True:
    for fd, _ in poll.poll():
        if fd == pidfd:
            os.waitpid(pid, 0)
            sys.exit(0)
        try:
            data = os.read(ctl, 64)
        except OSError:
            data = b""
        if data.startswith(b"keep"):
            kept = True
        if not data:
            if not kept:
                # The engine is gone and did not keep the sandbox: end it (as --die-with-parent would).
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                sys.exit(0)
            poll.unregister(ctl)
            os.close(ctl)
"""


@dataclass
class _Keeper:
    pid: int  # host pid of the sandbox's pid 1
    start_time: int
    pidns: int
    bwrap_pid: int | None = None
    popen: subprocess.Popen[bytes] | None = None  # the holder, when this process started it
    ctl_w: int | None = None  # our end of the holder's control pipe (see the module docstring)
    pidns_fd: int | None = None  # holds the PID namespace, so its inode number stays this sandbox's

    def _stat(self) -> _ProcStat | None:
        """Its /proc stat while the number is still this keeper's and it is not a zombie."""
        st = _proc_stat(self.pid)
        if st is None or st.start_time != self.start_time or st.state in ("Z", "X"):
            return None
        return st

    def alive(self) -> bool:
        """It exists (its namespace and processes may still be there): what a release waits out."""
        return self._stat() is not None

    def usable(self) -> bool:
        """Alive and not being killed: a command can still start in its namespace. A killed keeper
        is lost at once, while the kernel reaps its namespace's processes (see _PF_EXITING)."""
        st = self._stat()
        return st is not None and not st.exiting

    def pin(self) -> None:
        """Hold the keeper's PID namespace open while we may use ``pidns`` to tell its processes.

        The kernel hands a freed namespace inode number to the next new namespace at once (another
        sandbox's keeper, a moment later), so a number kept past the namespace's end would name
        someone else's processes. An open fd keeps the namespace, and so its number, ours.
        """
        if self.pidns_fd is not None:
            return
        try:
            fd = os.open(f"/proc/{self.pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        if os.fstat(fd).st_ino == self.pidns and self.alive():
            self.pidns_fd = fd
        else:
            os.close(fd)

    def unpin(self) -> None:
        if self.pidns_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidns_fd)
            self.pidns_fd = None


@dataclass
class _Launch:
    argv: list[str]
    pass_fds: tuple[int, ...]
    status_r: int  # our end of --json-status-fd
    block_w: int  # our end of --block-fd
    child_fds: list[int] = field(default_factory=list)  # to close in the parent after spawn

    def close_child_fds(self) -> None:
        for fd in self.child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.child_fds.clear()

    def close_all(self) -> None:
        self.close_child_fds()
        for fd in (self.status_r, self.block_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class _StatusReader:
    """Reads bwrap's ``--json-status-fd`` documents (one JSON object per line) without blocking."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self._buf = b""
        self.docs: list[dict[str, Any]] = []
        self.eof = False

    def _pump(self) -> None:
        while not self.eof:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        if self.eof and self._buf:
            lines.append(self._buf)
            self._buf = b""
        for line in lines:
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    self.docs.append(doc)

    def get(self, key: str) -> Any:
        self._pump()
        for doc in self.docs:
            if key in doc:
                return doc[key]
        return None

    async def wait_for(self, key: str, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        end = loop.time() + max(timeout, 0)
        while True:
            value = self.get(key)
            if value is not None or self.eof:
                return value
            remaining = end - loop.time()
            if remaining <= 0:
                return None
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.fd, lambda f=fut: f.done() or f.set_result(None))  # type: ignore[misc]  # mypy cannot infer a lambda with a default (it binds this loop's future)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(self.fd)


async def _read_token(fd: int, token: bytes, timeout: float) -> bool:
    """Read ``fd`` until ``token`` has been seen (True), or EOF / timeout (False)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + max(timeout, 0)
    os.set_blocking(fd, False)
    buf = b""
    while token not in buf:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            remaining = end - loop.time()
            if remaining <= 0:
                return False
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, lambda f=fut: f.done() or f.set_result(None))  # type: ignore[misc]  # mypy cannot infer a lambda with a default (it binds this loop's future)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(fd)
            continue
        if not data:
            return False
        buf += data
    return True


def _spawn_keeper(
    argv: list[str], log_path: Path, status_w: int, ready_w: int, ctl_r: int
) -> subprocess.Popen[bytes]:
    """The holder (own session, so terminal signals never reach it) with the keeper as its child."""
    holder = [sys.executable, "-I", "-S", "-c", _HOLDER_SCRIPT, str(ctl_r), str(status_w), *argv]
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            holder,
            stdin=subprocess.DEVNULL,
            stdout=ready_w,
            stderr=logf,
            pass_fds=(status_w, ctl_r),
            start_new_session=True,
            env=_HOST_ENV,
        )


async def _stop_keeper(k: _Keeper, budget: float = 5.0) -> None:
    """Kill the sandbox's pid 1: the kernel then kills every process in its PID namespace, and the
    keeper is only fully gone once they all are. (Only a keeper verified by its start time is
    signalled; its bwrap parent exits by itself. No pid is ever signalled by namespace inode after
    the namespace may have died: inode numbers are recycled.)"""
    if k.alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(k.pid, signal.SIGKILL)
    # poll() reaps the holder if it has ended: a number is only signalled while it is still ours.
    if k.popen is not None and k.popen.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(k.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(k.popen.wait, budget)
    if k.ctl_w is not None:
        with contextlib.suppress(OSError):
            os.close(k.ctl_w)
        k.ctl_w = None
    for _ in range(int(budget / 0.02)):
        if not k.alive():
            break
        await asyncio.sleep(0.02)
    k.unpin()
