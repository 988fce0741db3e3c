"""Which process on which machine runs an episode, and whether it is still alive.

A pid alone is reused; the pid with the kernel's start time of that process (``/proc/PID/stat``
field 22) names one process for the machine's uptime. Run directories record it (``run.json``), so a
later invocation can tell an episode whose controller died (SIGKILL, power loss) from one still running.
"""

from __future__ import annotations

import os
import socket
from functools import cache

from pydantic import BaseModel, ConfigDict


def _start_time(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 overall: starttime, in clock ticks since boot
    except (IndexError, ValueError):
        return None


class Invocation(BaseModel):
    """One controller process: host, pid and the process's start time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    pid: int
    start_time: int | None = None

    @property
    def label(self) -> str:
        return f"{self.host}:{self.pid}:{self.start_time}"

    def alive(self) -> bool | None:
        """True or False on this host; None for another machine's process (not knowable here)."""
        if self.host != socket.gethostname():
            return None
        now = _start_time(self.pid)
        return now is not None and (self.start_time is None or now == self.start_time)


@cache
def current() -> Invocation:
    pid = os.getpid()
    return Invocation(host=socket.gethostname(), pid=pid, start_time=_start_time(pid))
