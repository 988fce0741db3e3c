"""Reading a memory cgroup (v1 or v2), for every provider and the live fault watch: one reader.

The OOM counter (``oom_kill``, from v1 ``memory.oom_control`` or v2 ``memory.events``) is the
``cgroup.memory`` evidence (``opencode_tui_core.sandbox.oom``); the other numbers give it context. Finding a
sandbox's cgroup, setting limits and killing its processes stay with the provider that owns it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_kv(path: Path) -> dict[str, int]:
    """A cgroup file of ``key value`` lines as integers (lines that are not such a pair are skipped).
    Raises ``OSError`` when the file cannot be read."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_int(path: Path) -> int | None:
    """A one-number cgroup file; ``None`` when unreadable or ``max`` (no limit)."""
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


def counters_file(version: int) -> str:
    """The file holding the OOM counters of a v1 or v2 memory cgroup."""
    return "memory.oom_control" if version == 1 else "memory.events"


def oom_counters(path: Path, version: int) -> dict[str, int]:
    """The OOM counters (``oom_kill``, and ``under_oom`` on v1, ``oom`` on v2); empty if unreadable."""
    try:
        return read_kv(path / counters_file(version))
    except OSError:
        return {}


def oom_kill_count(path: Path, version: int) -> int | None:
    """The cgroup's ``oom_kill`` counter, or ``None`` when it cannot be read."""
    return oom_counters(path, version).get("oom_kill")


def procs(path: Path) -> list[int]:
    """The pids in the cgroup (``cgroup.procs``); empty when it cannot be read."""
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def read_memory(path: Path, version: int) -> dict[str, Any]:
    """The OOM counter and memory numbers of one memory cgroup. Raises ``OSError`` when its counters
    file cannot be read (the cgroup is gone)."""
    counters = read_kv(path / counters_file(version))
    if version == 1:
        return {
            "cgroup_version": 1,
            "path": str(path),
            "oom_kill": counters.get("oom_kill"),
            "under_oom": counters.get("under_oom"),
            "max_usage_in_bytes": read_int(path / "memory.max_usage_in_bytes"),
            "usage_in_bytes": read_int(path / "memory.usage_in_bytes"),
            "limit_in_bytes": read_int(path / "memory.limit_in_bytes"),
            "failcnt": read_int(path / "memory.failcnt"),
        }
    return {
        "cgroup_version": 2,
        "path": str(path),
        "oom_kill": counters.get("oom_kill"),
        "oom": counters.get("oom"),
        "max_usage_in_bytes": read_int(path / "memory.peak"),
        "usage_in_bytes": read_int(path / "memory.current"),
        "limit_in_bytes": read_int(path / "memory.max"),
    }
