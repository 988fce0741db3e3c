"""Did the sandbox hit its process limit? Only the pids cgroup's own counter says so.

``cgroup.pids`` evidence (docker: the container's pids cgroup; local: the sandbox's) carries
``max_events``: how many times a fork/clone in the cgroup failed because ``pids.max`` was reached
(``pids.events``' ``max`` line), and ``max_events_baseline``, the same counter when the sandbox was
created (or connected, when borrowed). A rise is the evidence; an ``EAGAIN`` in some output, or
``Resource temporarily unavailable`` in a message, never is (a program can print anything).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opencode_tui_core.failures import Evidence

SOURCE_PIDS = "cgroup.pids"


def read_pids_cgroup(path: Path) -> dict[str, Any]:
    """``pids.max`` (None for "max"), ``pids.current`` and the ``max`` counter of ``pids.events``."""

    def read(name: str) -> str | None:
        try:
            return (path / name).read_text().strip()
        except OSError:
            return None

    limit = read("pids.max")
    current = read("pids.current")
    events = read("pids.events") or ""
    max_events = None
    for line in events.splitlines():
        key, _, value = line.partition(" ")
        if key == "max" and value.strip().isdigit():
            max_events = int(value)
    return {
        "pids_max": int(limit) if limit and limit.isdigit() else None,
        "pids_current": int(current) if current and current.isdigit() else None,
        "max_events": max_events,
    }


def pids_evidence(path: Path, baseline: int | None, scope: str | None = None) -> Evidence:
    """The cgroup's counters; scoped to ``scope`` (a container id) or else to the cgroup's path."""
    data = {**read_pids_cgroup(path), "max_events_baseline": baseline, "path": str(path)}
    return Evidence(source=SOURCE_PIDS, scope=scope or str(path), data=data)


def pids_limit_hit(evidence: Iterable[Evidence]) -> list[Evidence]:
    """The scoped ``cgroup.pids`` pieces whose refused-fork counter rose above its baseline."""
    out = []
    for ev in evidence:
        count, base = ev.data.get("max_events"), ev.data.get("max_events_baseline")
        if ev.source == SOURCE_PIDS and ev.scope and isinstance(count, int) and isinstance(base, int):
            if count > base:
                out.append(ev)
    return out
