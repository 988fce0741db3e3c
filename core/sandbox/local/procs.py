"""Host processes seen through /proc and pidfds: process tables, PID namespaces, killing a tree."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import struct
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# /proc helpers


# The kernel's PF_EXITING task flag (/proc/PID/stat's 9th field): the process is in do_exit. A PID
# namespace's init that was killed stays there, sleeping, until every process of its namespace has
# been reaped, which can take seconds; it is ending, though its state is not yet Z.
_PF_EXITING = 0x4


@dataclass(frozen=True)
class _ProcStat:
    ppid: int
    pgrp: int
    sid: int
    state: str
    start_time: int
    flags: int = 0

    @property
    def exiting(self) -> bool:
        return bool(self.flags & _PF_EXITING)


def _proc_stat(pid: int) -> _ProcStat | None:
    try:
        # (open, not pathlib: a Path interns its parts, so every pid ever seen stayed in memory)
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return _ProcStat(
            ppid=int(rest[1]),
            pgrp=int(rest[2]),
            sid=int(rest[3]),
            state=rest[0].decode(),
            start_time=int(rest[19]),
            flags=int(rest[6]),
        )
    except (IndexError, ValueError):
        return None


def _scan_procs() -> dict[int, _ProcStat]:
    table: dict[int, _ProcStat] = {}
    with os.scandir("/proc") as it:
        for entry in it:
            if entry.name.isdigit():
                st = _proc_stat(int(entry.name))
                if st is not None:
                    table[int(entry.name)] = st
    return table


def _ns_inode(pid: int, ns: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{ns}").st_ino
    except OSError:
        return None


def _kill_tree(root_pid: int, pidns: int | None) -> set[int]:
    """SIGKILL ``root_pid``, every member of its session and every descendant.

    The tree is first frozen with SIGSTOP (rescanning until no new process appears) so that nothing
    forks out of it or gets reparented while we kill; only processes in PID namespace ``pidns`` are
    signalled, so a recycled pid outside the sandbox can never be hit.
    """

    def in_sandbox(pid: int) -> bool:
        return pidns is not None and _ns_inode(pid, "pid") == pidns

    stopped: set[int] = set()
    for _ in range(20):
        table = _scan_procs()
        children: dict[int, list[int]] = {}
        for pid, st in table.items():
            children.setdefault(st.ppid, []).append(pid)
        members = {pid for pid, st in table.items() if pid == root_pid or st.sid == root_pid}
        stack = list(members)
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in members:
                    members.add(child)
                    stack.append(child)
        new = {pid for pid in members - stopped if table[pid].state != "Z" and in_sandbox(pid)}
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return stopped


class _ChildHandle:
    """A child process of ours, signalled through a pidfd taken right after it was spawned, never
    through its number.

    asyncio's child watcher (Python 3.11: a thread per child) reaps an exited child first and tells
    the event loop later, so ``Process.returncode is None`` does not mean "not reaped": in between,
    the number is free and the host may give it to any new process. The host's pid space is small
    (``kernel.pid_max`` is often 32768) and wraps within minutes under load, so a long-lived exec's
    number is reused right after it ends. A ``killpg`` by that number then hits whatever process group
    leader got it (another sandbox's exec launcher: its command dies by SIGKILL through bwrap's
    ``--die-with-parent``). A pidfd names one process for good; signalling it after the process was
    reaped is a harmless ESRCH.
    """

    def __init__(self, pid: int):
        self.pid = pid
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
            # Opened after the watcher reaped it, the number could already be someone else's.
            if _proc_parent(pid) == os.getpid():
                self._fd = fd
            else:
                os.close(fd)

    def kill(self) -> None:
        """SIGKILL the child if it still exists (the exec launchers lead a process group of their own
        holding nothing else: bwrap's command runs in a session of its own and dies with it)."""
        if self._fd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _pids_in_ns(pidns: int) -> list[int]:
    out = []
    with os.scandir("/proc") as it:
        for entry in it:
            if entry.name.isdigit() and _ns_inode(int(entry.name), "pid") == pidns:
                out.append(int(entry.name))
    return out


# PIDFD_GET_INFO = _IOWR(0xFF, 11, struct pidfd_info); the 64-byte first version already carries
# exit_code (offset 60). PIDFD_INFO_EXIT = 1 << 3.
_PIDFD_INFO_SIZE = 64
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 1 << 3
_pidfd_info_supported: bool | None = None


def _pidfd_wait_status(pidfd: int) -> int | None:
    """The raw wait status of a reaped process, if this kernel reports it (Linux 6.15+)."""
    global _pidfd_info_supported
    if _pidfd_info_supported is False:
        return None
    buf = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("Q", buf, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf, True)
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
            _pidfd_info_supported = False
        return None
    _pidfd_info_supported = True
    (mask,) = struct.unpack_from("Q", buf, 0)
    if not mask & _PIDFD_INFO_EXIT:
        return None
    (status,) = struct.unpack_from("i", buf, 60)
    return status


def _proc_parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def _protect_from_oom_killer(pid: int) -> None:
    """Never the OOM killer's choice: losing pid 1 would end every process of the sandbox.

    Only the keeper itself (and its ``sleep``) get this; exec'd processes do not descend from it.
    Needs CAP_SYS_RESOURCE (root); otherwise left as is.
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text("-1000")
