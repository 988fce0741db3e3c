"""The kernel's own record of an OOM kill, read from ``/dev/kmsg`` where this process may read it.

For every OOM kill the kernel logs one structured line (Linux 4.19+)::

    oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/x,task_memcg=/x/y,task=python3,pid=4242,uid=0

It names the killed process (host pid, task name) and the memory cgroup it was charged to, so a kill
is attributed to a sandbox by its cgroup path, never by a name. Reading needs ``CAP_SYSLOG`` or
``kernel.dmesg_restrict=0``; without it the reader says why (``error``) and yields nothing.
A reader starts at the end of the log: only kills from then on are seen.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

KMSG = "/dev/kmsg"
_OOM_KILL = re.compile(
    r"oom-kill:.*?oom_memcg=(?P<oom_memcg>[^,]*),task_memcg=(?P<task_memcg>[^,]*),"
    r"task=(?P<task>.*),pid=(?P<pid>\d+),uid=(?P<uid>\d+)"
)
_READ_SIZE = 8192  # one /dev/kmsg read returns one record; records are at most ~1 KiB
_MAX_RECORDS_PER_READ = 10_000  # a flood of log lines cannot hold a poll forever


@dataclass(frozen=True)
class OomKillRecord:
    """One ``oom-kill:`` line: the killed process and the cgroup it was charged to."""

    pid: int  # as the host sees it
    task: str  # the kernel's task name (comm, at most 15 characters)
    task_memcg: str  # relative to the memory hierarchy's root, e.g. /docker/<id>
    oom_memcg: str
    uid: int
    at: datetime

    def in_cgroup(self, memcg: str) -> bool:
        """Charged to ``memcg`` (a path relative to the hierarchy's root) or a cgroup below it."""
        memcg = "/" + memcg.strip("/")
        return self.task_memcg == memcg or self.task_memcg.startswith(memcg + "/")


def _wall_time(usec_since_boot: int) -> datetime:
    # The record's clock is the kernel's local clock, which runs with CLOCK_MONOTONIC.
    ago = time.clock_gettime(time.CLOCK_MONOTONIC) - usec_since_boot / 1e6
    return datetime.fromtimestamp(time.time() - max(ago, 0.0), UTC)


def parse_record(record: str) -> OomKillRecord | None:
    """An ``oom-kill:`` record (``prio,seq,usec,flags;message``) or None for any other record."""
    head, sep, message = record.partition(";")
    if not sep:
        return None
    match = _OOM_KILL.match(message.split("\n", 1)[0])
    fields = head.split(",")
    if match is None or len(fields) < 3 or not fields[2].isdigit():
        return None
    return OomKillRecord(
        pid=int(match["pid"]),
        task=match["task"],
        task_memcg=match["task_memcg"],
        oom_memcg=match["oom_memcg"],
        uid=int(match["uid"]),
        at=_wall_time(int(fields[2])),
    )


class KernelLog:
    """A non-blocking reader of ``/dev/kmsg`` from its end (blocking calls: run it in a thread)."""

    def __init__(self, path: str = KMSG) -> None:
        self.fd: int | None = None
        self.error: str | None = None
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError as exc:
            self.close()
            self.error = f"the kernel log ({path}) is not readable: {exc.strerror or exc}"

    def oom_kills(self) -> list[OomKillRecord]:
        """The ``oom-kill:`` records logged since the last call."""
        out: list[OomKillRecord] = []
        if self.fd is None:
            return out
        for _ in range(_MAX_RECORDS_PER_READ):
            try:
                data = os.read(self.fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten before we read them: go on
                    continue
                self.error = f"reading the kernel log failed: {exc.strerror or exc}"
                break
            if not data:
                break
            record = parse_record(data.decode("utf-8", "replace"))
            if record is not None:
                out.append(record)
        return out

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
