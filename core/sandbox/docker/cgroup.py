"""A container's memory cgroup (v1 or v2), found from its id: the OOM counter evidence."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

CGROUP_V1_ROOT = Path("/sys/fs/cgroup/memory")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _parse_kv(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _read_int(path: Path) -> int | None:
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


def find_memory_cgroup(container_id: str, pid: int | None) -> tuple[Path, int] | None:
    """The memory cgroup directory of a container and its cgroup version, or ``None``.

    Discovered from the main process's ``/proc/<pid>/cgroup`` when that is visible, else from the
    usual cgroupfs/systemd locations. A candidate must contain the full container id, so a PID that
    means something else in our PID namespace can never point at another container's cgroup.
    """
    candidates: list[Path] = []
    if pid:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
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


def read_memory_cgroup(path: Path, version: int) -> dict[str, Any]:
    """Read the OOM counter and memory numbers of one memory cgroup (v1 or v2)."""
    if version == 1:
        oom = _parse_kv((path / "memory.oom_control").read_text())
        return {
            "cgroup_version": 1,
            "path": str(path),
            "oom_kill": oom.get("oom_kill"),
            "under_oom": oom.get("under_oom"),
            "max_usage_in_bytes": _read_int(path / "memory.max_usage_in_bytes"),
            "usage_in_bytes": _read_int(path / "memory.usage_in_bytes"),
            "limit_in_bytes": _read_int(path / "memory.limit_in_bytes"),
            "failcnt": _read_int(path / "memory.failcnt"),
        }
    events = _parse_kv((path / "memory.events").read_text())
    return {
        "cgroup_version": 2,
        "path": str(path),
        "oom_kill": events.get("oom_kill"),
        "oom": events.get("oom"),
        "max_usage_in_bytes": _read_int(path / "memory.peak"),
        "usage_in_bytes": _read_int(path / "memory.current"),
        "limit_in_bytes": _read_int(path / "memory.max"),
    }


def _cgroup_present(found: tuple[Path, int]) -> bool:
    path, version = found
    return (path / ("memory.oom_control" if version == 1 else "memory.events")).is_file()


def find_pids_cgroup(container_id: str, pid: int | None) -> Path | None:
    """The pids cgroup directory of a container (v1 ``pids`` hierarchy or v2), or ``None``; found as
    ``find_memory_cgroup`` finds the memory one, and it must contain the full container id too."""
    candidates: list[Path] = []
    if pid:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
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
