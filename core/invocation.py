"""Which process on which machine created something (a sandbox, a run), and whether it still runs.

A pid alone is reused; with the kernel's start time of that process (``/proc/PID/stat`` field 22), the
boot it ran in, and the host and PID namespace, it names one process. Sandboxes carry this as their
``opencode-tui.invocation`` label (``sweep`` spares live jobs) and run.json records its controller's
(the next batch tells a run whose controller died from one still running).
"""

from __future__ import annotations

import hashlib
import os
import socket
from enum import StrEnum


def _proc_start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot): with the pid, it names one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[0] not in (b"Z", b"X") else None


def _machine_key() -> tuple[str, str]:
    """(this host and PID namespace, this boot): where a pid and start time can be checked."""
    try:
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pidns = "?"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:8]
    except OSError:
        boot = "00000000"
    host = hashlib.sha256(f"{socket.gethostname()}|{pidns}".encode()).hexdigest()[:10]
    return host, boot


def invocation_id(pid: int | None = None) -> str:
    """``<host key>.<boot>.<pid>.<start ticks>`` of this process: the ``opencode-tui.invocation`` label.

    Short and made of ``[0-9a-f.]`` only, so every provider's label rules accept it as is.
    """
    pid = os.getpid() if pid is None else pid
    host, boot = _machine_key()
    return f"{host}.{boot}.{pid}.{_proc_start_ticks(pid) or 0}"


class Liveness(StrEnum):
    ALIVE = "alive"  # the process that created the sandbox still runs
    GONE = "gone"  # it provably ended (same host and namespace: no such pid with that start time)
    UNKNOWN = "unknown"  # made on another host or PID namespace: cannot be checked from here
    UNLABELLED = "unlabelled"  # made by a version without the label


def invocation_liveness(label: str | None) -> Liveness:
    if not label:
        return Liveness.UNLABELLED
    parts = label.split(".")
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        return Liveness.UNKNOWN
    host, boot = _machine_key()
    if parts[0] != host:
        return Liveness.UNKNOWN
    if parts[1] != boot:
        return Liveness.GONE  # this host rebooted since: every process of that boot has ended
    started = _proc_start_ticks(int(parts[2]))
    return Liveness.ALIVE if started is not None and started == int(parts[3]) else Liveness.GONE


def pid_of(label: str | None) -> int | None:
    """The pid named by an invocation label (for messages)."""
    parts = (label or "").split(".")
    return int(parts[2]) if len(parts) == 4 and parts[2].isdigit() else None
