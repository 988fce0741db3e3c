"""Watching a sandbox for kernel kills and a full disk while the agent runs (``Sandbox.watch_faults``).

A :class:`FaultWatcher` polls what the host can see of one sandbox, every ``POLL_S``:

- its memory cgroup's ``oom_kill`` counter (v1 ``memory.oom_control``, v2 ``memory.events``): a rise
  is a kill. Which process: the kernel's ``oom-kill:`` record for the cgroup (``kernel_log``) names its
  pid; its command line comes from the sandbox's process table, which the watcher keeps from the
  cgroup's ``cgroup.procs`` and ``/proc`` (a process is remembered for a while after it is gone).
  Without the kernel's record, the one process that vanished at the kill is named, and only then;
- the free space of its size-limited writable filesystem (``statvfs``): below ``DISK_FULL_FREE_BYTES``
  is full, the moment writes start failing with ENOSPC. Seen once until space comes back.

The watcher only observes: the close-time check (``Sandbox.inspect``) stays the authority for the
outcome; what the watcher saw is added to it (``disk_evidence``) and to the failure's evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencode_tui_core.events import FaultKind, SandboxFault
from opencode_tui_core.failures import Evidence
from opencode_tui_core.sandbox import cgroup
from opencode_tui_core.sandbox.kernel_log import KernelLog, OomKillRecord
from opencode_tui_core.sandbox.oom import SOURCE_CGROUP

POLL_S = 0.2
# After the counter rises, how long the kernel's record of the kill is waited for.
KERNEL_RECORD_WAIT_S = 0.5
# A process's command line is read again at each poll for this long after it first appears (execs).
REDESCRIBE_S = 3.0
# A process is remembered this long after it left the table (the kill's record may come later).
GONE_KEEP_S = 30.0
# Free space below this is a full disk (ext4 without reserved blocks hands out the last ones).
DISK_FULL_FREE_BYTES = 1 << 20
# Once full, free space above this share of the size arms the watcher again.
DISK_REARM_SHARE = 0.05
COMMAND_CAP = 300
# Processes that ended this recently are still listed with the ones running (``ended``).
RECENT_S = 2.0
PROCESSES_SHOWN = 12
# Started processes waiting for the next poll (a watcher that is not polling keeps no more).
STARTED_CAP = 256

SOURCE_KERNEL_LOG = "kernel.log"
SOURCE_DISK = "sandbox.disk"

# What a provider without a live watch says in ``status().notes``.
NOT_WATCHED_NOTE = (
    "kernel kills and a full disk are not observed while the agent runs on this provider; "
    "they are checked when the sandbox closes"
)


@dataclass
class _Proc:
    host_pid: int
    pid: int | None  # as the sandbox sees it (the last NSpid entry)
    command: str
    first_seen: float = field(default_factory=time.monotonic)
    gone_at: float | None = None


@dataclass
class FaultWatcher:
    """One sandbox's live watch. ``memory``: its memory cgroup directory and version (1 or 2);
    ``memcg``: that cgroup's path relative to the hierarchy's root (how the kernel names it);
    ``disk``: the mount point of its size-limited writable filesystem and the size."""

    scope: str
    memory: tuple[Path, int] | None = None
    memcg: str | None = None
    oom_baseline: int | None = None
    disk: tuple[Path, int] | None = None
    # What was seen, for the close (``disk_evidence``) and the episode.
    seen: list[SandboxFault] = field(default_factory=list)
    # Where the process table comes from without a memory cgroup (e.g. the sandbox's PID namespace).
    list_pids: Callable[[], list[int]] | None = None
    _table: dict[int, _Proc] = field(default_factory=dict)
    # Processes named by the provider as it started them (``remember``), merged at the next poll: a
    # command killed within one poll of its start is still named by its pid in the sandbox.
    _started: list[_Proc] = field(default_factory=list)
    _oom_count: int | None = None
    _records: list[OomKillRecord] = field(default_factory=list)
    _named: set[int] = field(default_factory=set)
    _disk_full: bool = False
    _log: KernelLog | None = None

    # ---- the process table -------------------------------------------------------------------

    def _procs(self) -> list[int]:
        if self.list_pids is not None:
            return self.list_pids()
        return cgroup.procs(self.memory[0]) if self.memory is not None else []

    def remember(self, host_pid: int, command: str) -> None:
        """A process the provider just started (still held before its command runs): its pid in the
        sandbox is read now, while it exists. Called from the event loop; the poll thread merges it."""
        proc = _describe(host_pid) if len(self._started) < STARTED_CAP else None
        if proc is not None:
            proc.command = command[:COMMAND_CAP]
            self._started.append(proc)  # list.append is atomic: no lock shared with the poll thread

    def _refresh_table(self) -> set[int]:
        """Update the table; returns the pids that left it since the last poll."""
        now = time.monotonic()
        while self._started:
            started = self._started.pop(0)
            self._table.setdefault(started.host_pid, started)
        live = set(self._procs())
        for host_pid in live:
            known = self._table.get(host_pid)
            # A young process is read again: its command line changes when it execs (runc init → sh →
            # the command); later ones keep theirs (fewer reads on a busy machine).
            if known is not None and now - known.first_seen > REDESCRIBE_S:
                continue
            if known is not None:
                # Only the command line changes (its pid in the sandbox does not): one read, not two.
                command = _command_line(host_pid)
                if command:  # a dying process's empty command line keeps the one known
                    known.command = command
                continue
            proc = _describe(host_pid)
            if proc is not None:
                self._table[host_pid] = proc
        vanished = set()
        for host_pid, proc in list(self._table.items()):
            if host_pid in live:
                continue
            if proc.gone_at is None:
                proc.gone_at = now
                vanished.add(host_pid)
            elif now - proc.gone_at > GONE_KEEP_S:
                del self._table[host_pid]
        return vanished

    def processes(self) -> list[dict[str, Any]]:
        """The sandbox's processes now and those that just ended (a writer that hit ENOSPC exits at
        once), newest first (capped)."""
        now = time.monotonic()
        recent = [p for p in self._table.values() if p.gone_at is None or now - p.gone_at < RECENT_S]
        recent.sort(key=lambda p: p.host_pid, reverse=True)
        return [
            {"pid": p.pid, "host_pid": p.host_pid, "command": p.command, "ended": p.gone_at is not None}
            for p in recent[:PROCESSES_SHOWN]
        ]

    # ---- one poll ----------------------------------------------------------------------------

    def start(self) -> None:
        """Open the kernel log and take the first table (blocking: call it in a thread)."""
        if self.memory is not None:
            self._log = KernelLog()
            self._oom_count = self._read_oom_count()
            if self.oom_baseline is None:
                self.oom_baseline = self._oom_count
        self._refresh_table()

    def stop(self) -> None:
        if self._log is not None:
            self._log.close()

    def poll(self) -> list[SandboxFault]:
        """What happened since the last poll (blocking: call it in a thread)."""
        vanished = self._refresh_table()
        faults = self._oom_kills(vanished)
        disk = self._disk_check()
        if disk is not None:
            faults.append(disk)
        self.seen.extend(faults)
        return faults

    def _read_oom_count(self) -> int | None:
        return cgroup.oom_kill_count(*self.memory) if self.memory is not None else None

    def _kernel_records(self) -> list[OomKillRecord]:
        if self._log is not None and self.memcg is not None:
            self._records += [r for r in self._log.oom_kills() if r.in_cgroup(self.memcg)]
        return self._records

    def _oom_kills(self, vanished: set[int]) -> list[SandboxFault]:
        count = self._read_oom_count()
        rose = 0
        if count is not None and self._oom_count is not None and count > self._oom_count:
            rose = count - self._oom_count
        if count is not None:
            self._oom_count = count
        records = [r for r in self._kernel_records() if r.pid not in self._named]
        if rose > len(records) and self._log is not None and self._log.fd is not None:
            end = time.monotonic() + KERNEL_RECORD_WAIT_S
            while time.monotonic() < end and rose > len(records):
                time.sleep(0.05)
                records = [r for r in self._kernel_records() if r.pid not in self._named]
            vanished |= self._refresh_table()
        # The kernel logs a kill just before it counts it: a record ahead of the counter waits for it.
        if count is not None:
            records = records[:rose]
        faults = [self._kill_from_record(r, count) for r in records]
        self._named |= {r.pid for r in records}
        for _ in range(rose - len(records)):
            faults.append(self._kill_from_table(vanished, count))
        return faults

    def _kill_from_record(self, record: OomKillRecord, count: int | None) -> SandboxFault:
        proc = self._table.get(record.pid)
        command = proc.command if proc is not None else record.task
        pid = proc.pid if proc is not None and proc.pid is not None else None
        shown = f"pid {pid}" if pid is not None else f"host pid {record.pid}"  # pid first: lines get cut
        evidence = [
            Evidence(
                source=SOURCE_KERNEL_LOG,
                scope=self.scope,
                observed_at=record.at,
                data={
                    "pid": pid,
                    "host_pid": record.pid,
                    "task": record.task,
                    "command": command,
                    "task_memcg": record.task_memcg,
                    "oom_memcg": record.oom_memcg,
                    "uid": record.uid,
                },
            ),
            self._counter_evidence(count),
        ]
        return SandboxFault(
            ts=record.at,
            kind=FaultKind.OOM_KILL,
            source=SOURCE_KERNEL_LOG,
            message=f"the kernel OOM-killed {shown}: {_short(command)}",
            pid=pid,
            host_pid=record.pid,
            command=command,
            evidence=evidence,
        )

    def _kill_from_table(self, vanished: set[int], count: int | None) -> SandboxFault:
        gone = [self._table[p] for p in vanished if p in self._table]
        proc = gone[0] if len(gone) == 1 else None
        if proc is not None:
            what = f"pid {proc.pid} (the one process gone at the kill): {_short(proc.command)}"
        else:
            what = "a process of the sandbox (which one: no kernel record, and " + (
                f"{len(gone)} processes ended at the kill)" if gone else "none was seen ending)"
            )
        evidence = [self._counter_evidence(count)]
        if gone:
            evidence.append(
                Evidence(
                    source="process.table",
                    scope=self.scope,
                    data={
                        "gone": [{"pid": p.pid, "host_pid": p.host_pid, "command": p.command} for p in gone]
                    },
                )
            )
        return SandboxFault(
            kind=FaultKind.OOM_KILL,
            source=SOURCE_CGROUP,
            message=f"the kernel OOM-killed {what}",
            pid=proc.pid if proc else None,
            host_pid=proc.host_pid if proc else None,
            command=proc.command if proc else None,
            evidence=evidence,
        )

    def _counter_evidence(self, count: int | None) -> Evidence:
        path = str(self.memory[0]) if self.memory else None
        return Evidence(
            source=SOURCE_CGROUP,
            scope=self.scope,
            data={"oom_kill": count, "oom_kill_baseline": self.oom_baseline, "path": path},
        )

    # ---- the disk ----------------------------------------------------------------------------

    def free_bytes(self) -> int | None:
        if self.disk is None:
            return None
        try:
            st = os.statvfs(self.disk[0])
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def _disk_check(self) -> SandboxFault | None:
        free = self.free_bytes()
        if free is None or self.disk is None:
            return None
        size = self.disk[1]
        if self._disk_full:
            if free > size * DISK_REARM_SHARE:
                self._disk_full = False
            return None
        if free >= DISK_FULL_FREE_BYTES:
            return None
        self._disk_full = True
        processes = self.processes()
        evidence = Evidence(
            source=SOURCE_DISK,
            scope=self.scope,
            data={"limit_bytes": size, "free_bytes": free, "full": True, "processes": processes},
        )
        return SandboxFault(
            kind=FaultKind.DISK_FULL,
            source=SOURCE_DISK,
            message=f"the sandbox's writable space is full ({_size(size)} limit, {_size(free)} free): "
            "writes fail with ENOSPC",
            evidence=[evidence],
        )

    def disk_evidence(self) -> Evidence | None:
        """The writable space now, and whether it was seen full while the agent ran (for the close)."""
        if self.disk is None:
            return None
        free = self.free_bytes()
        full = [f for f in self.seen if f.kind is FaultKind.DISK_FULL]
        data: dict[str, Any] = {
            "limit_bytes": self.disk[1],
            "free_bytes": free,
            "full": free is not None and free < DISK_FULL_FREE_BYTES,
            "full_seen_at": full[0].ts.isoformat() if full else None,
        }
        if full:
            data["processes"] = full[0].evidence[0].data.get("processes", [])
        return Evidence(source=SOURCE_DISK, scope=self.scope, data=data)

    # ---- the loop ----------------------------------------------------------------------------

    async def watch(self, stop: asyncio.Event) -> AsyncIterator[SandboxFault]:
        """Poll until ``stop`` is set, then once more (a kill at the very end is still seen)."""
        await asyncio.to_thread(self.start)
        try:
            while True:
                stopping = stop.is_set()
                for fault in await asyncio.to_thread(self.poll):
                    yield fault
                if stopping:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_S)
        finally:
            self.stop()


def kernel_log_note() -> str | None:
    """Why a killed process may go unnamed here (the kernel log is not readable), for status notes."""
    log = KernelLog()
    log.close()
    return (
        f"{log.error}: a process the kernel kills is named from the process table only" if log.error else None
    )


def disk_full_seen(evidence: list[Evidence]) -> list[Evidence]:
    """The ``sandbox.disk`` pieces saying the writable space was full (while the agent ran, or now)."""
    return [
        ev
        for ev in evidence
        if ev.source == SOURCE_DISK and ev.scope and (ev.data.get("full_seen_at") or ev.data.get("full"))
    ]


def _command_line(host_pid: int) -> str | None:
    """The process's command line (capped), "" for a kernel thread or a zombie, None: gone."""
    try:
        with open(f"/proc/{host_pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    argv = raw.rstrip(b"\0").decode("utf-8", "replace").split("\0") if raw.strip(b"\0") else []
    # Quoted only up to the cap: a bwrap command line has hundreds of arguments.
    words: list[str] = []
    length = 0
    for arg in argv:
        if length > COMMAND_CAP:
            break
        words.append(shlex.quote(arg))
        length += len(words[-1]) + 1
    return " ".join(words)[:COMMAND_CAP]


def _describe(host_pid: int) -> _Proc | None:
    command = _command_line(host_pid)
    try:
        with open(f"/proc/{host_pid}/status", encoding="utf-8", errors="replace") as f:
            status = f.read()
    except OSError:
        return None
    if command is None:
        return None
    pid = None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            ids = line.split()[1:]
            pid = int(ids[-1]) if ids and ids[-1].isdigit() else None
        elif line.startswith("Name:") and not command:
            command = f"[{line.split(None, 1)[-1].strip()}]"  # a kernel thread or a zombie: its name
    return _Proc(host_pid=host_pid, pid=pid, command=command)


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
