"""Where a container's memory and pids cgroups are (v1 or v2), found from its id (read by
``opencode_tui_core.sandbox.cgroup``), and whether the engine can limit its disk."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from opencode_tui_core.sandbox.cgroup import counters_file

CGROUP_V1_ROOT = Path("/sys/fs/cgroup/memory")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def find_memory_cgroup(container_id: str, pid: int | None) -> tuple[Path, int] | None:
    """The memory cgroup directory of a container and its cgroup version, or ``None``.

    Discovered from the main process's ``/proc/<pid>/cgroup`` when that is visible, else from the
    usual cgroupfs/systemd locations. A candidate must contain the full container id, so a PID that
    means something else in our PID namespace can never point at another container's cgroup.
    """
    candidates: list[Path] = []
    if pid:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cgroup") as f:  # (not pathlib: it interns every pid seen)
                lines = f.read().splitlines()
            for line in lines:
                hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
                rel = path.lstrip("/")
                if "memory" in controllers.split(","):
                    candidates.append(CGROUP_V1_ROOT / rel)
                elif hierarchy == "0" and controllers == "":
                    candidates.append(CGROUP_ROOT / rel)
    candidates += [
        CGROUP_V1_ROOT / "docker" / container_id,
        CGROUP_V1_ROOT / "system.slice" / f"docker-{container_id}.scope",
        CGROUP_ROOT / "system.slice" / f"docker-{container_id}.scope",
        CGROUP_ROOT / "docker" / container_id,
    ]
    for cand in candidates:
        if container_id not in str(cand):
            continue
        if (cand / "memory.oom_control").is_file():
            return cand, 1
        if (cand / "memory.events").is_file():
            return cand, 2
    return None


def _cgroup_present(found: tuple[Path, int]) -> bool:
    path, version = found
    return (path / counters_file(version)).is_file()


def find_pids_cgroup(container_id: str, pid: int | None) -> Path | None:
    """The pids cgroup directory of a container (v1 ``pids`` hierarchy or v2), or ``None``; found as
    ``find_memory_cgroup`` finds the memory one, and it must contain the full container id too."""
    candidates: list[Path] = []
    if pid:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cgroup") as f:  # (not pathlib: it interns every pid seen)
                lines = f.read().splitlines()
            for line in lines:
                hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
                if "pids" in controllers.split(","):
                    candidates.append(CGROUP_ROOT / "pids" / path.lstrip("/"))
                elif hierarchy == "0" and controllers == "":
                    candidates.append(CGROUP_ROOT / path.lstrip("/"))
    candidates += [
        CGROUP_ROOT / "pids" / "docker" / container_id,
        CGROUP_ROOT / "pids" / "system.slice" / f"docker-{container_id}.scope",
        CGROUP_ROOT / "system.slice" / f"docker-{container_id}.scope",
        CGROUP_ROOT / "docker" / container_id,
    ]
    for cand in candidates:
        if container_id in str(cand) and (cand / "pids.max").is_file():
            return cand
    return None


# Storage drivers whose ``--storage-opt size=`` limits a container's writable layer (overlay2 only on
# xfs mounted with pquota, which the engine checks itself at create).
_SIZED_DRIVERS = {"btrfs", "zfs", "devicemapper", "windowsfilter"}


def disk_limit_support(info: dict[str, Any]) -> tuple[bool, str]:
    """Can this engine limit a container's writable space (``docker info`` → (yes, why/why not))?"""
    driver = info.get("Driver") or "?"
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "?")
    if driver in _SIZED_DRIVERS or (driver == "overlay2" and backing == "xfs"):
        return True, f"storage driver {driver} (backing {backing}) takes --storage-opt size"
    return False, (
        f"storage driver {driver} on {backing} cannot limit a container's size "
        "(--storage-opt size needs overlay2 on xfs with pquota, btrfs, zfs or devicemapper)"
    )
