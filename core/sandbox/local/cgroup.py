"""One local sandbox's cgroup v1 memory controller: limit, OOM counter evidence (read by
``opencode_tui_core.sandbox.cgroup``), kill-all, removal."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
from pathlib import Path
from typing import Any

from opencode_tui_core.failures import (
    Evidence,
)
from opencode_tui_core.sandbox import cgroup
from opencode_tui_core.sandbox.oom import SOURCE_CGROUP

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# cgroup v1 memory controller


def _memory_cgroup_mount() -> Path | None:
    return _cgroup_v1_mount("memory")


def _cgroup_v1_mount(controller: str) -> Path | None:
    """Where the cgroup v1 hierarchy with ``controller`` is mounted (the pids one serves limits.pids,
    with the same ``_Cgroup`` helpers: its cgroup.procs, kill-all and removal work alike)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and controller in parts[3].split(","):
            return Path(parts[1])
    return None


class _Cgroup:
    """One sandbox's memory cgroup (v1)."""

    def __init__(self, path: Path):
        self.path = path

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def exists(self) -> bool:
        return self.procs_file.exists()

    def set_limit(self, limit: int) -> None:
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # no swapping around the limit where swap accounting is on
            memsw.write_text(str(limit))

    def oom_control(self) -> dict[str, int]:
        return cgroup.oom_counters(self.path, 1)

    def pids(self) -> list[int]:
        return cgroup.procs(self.path)

    def evidence(self, baseline: int | None) -> Evidence:
        oc = self.oom_control()
        data: dict[str, Any] = {
            "oom_kill": oc.get("oom_kill"),
            "oom_kill_baseline": baseline,
            "under_oom": oc.get("under_oom"),
            "limit_in_bytes": cgroup.read_int(self.path / "memory.limit_in_bytes"),
            "usage_in_bytes": cgroup.read_int(self.path / "memory.usage_in_bytes"),
            "max_usage_in_bytes": cgroup.read_int(self.path / "memory.max_usage_in_bytes"),
        }
        return Evidence(source=SOURCE_CGROUP, scope=str(self.path), data=data)

    async def kill_all(self, budget: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty (bounded). True when empty."""
        loop = asyncio.get_running_loop()
        end = loop.time() + budget
        while True:
            pids = self.pids()
            if not pids:
                return True
            if loop.time() > end:
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.02)

    async def remove(self, budget: float = 3.0) -> bool:
        loop = asyncio.get_running_loop()
        end = loop.time() + budget
        while True:
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or loop.time() > end:
                    log.warning("cannot remove cgroup %s: %s", self.path, exc)
                    return False
            await asyncio.sleep(0.05)
        # The per-base-dir parent too, once it is empty (it fails harmlessly while it is not).
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()
        return True
