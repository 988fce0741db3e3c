"""``limits.disk`` for the local provider: a sized filesystem under the sandbox's writable overlays.

A sparse image of the limit's size in the state dir, formatted ext4 (no journal, no reserved blocks)
and loop-mounted (``nosuid,nodev``) on ``OVERLAYS_DIR``, so the workdir, HOME, /tmp and /dev/shm
together cannot outgrow it: writing past it is ENOSPC inside the sandbox. Needs root (a loop mount),
``mkfs.ext4`` and ``mount``; otherwise the sandbox's notes say why it is not enforced. The host's disk
is used only as the sandbox writes. Unmounted (the loop device goes with it: autoclear) before the
state dir is removed.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import subprocess
from pathlib import Path

from opencode_tui_core.sandbox.local.common import OVERLAYS_DIR

DISK_IMAGE = "disk.img"
DISK_STEP_TIMEOUT_S = 30.0
_MNT_DETACH = 2


def _unmount_disk(state_dir: Path) -> None:
    """Unmount a sandbox's size-limited filesystem if it is mounted. Lazily when busy: the
    processes are gone by now, only an open file of ours could hold it. Raises OSError when it
    stays mounted (removing the state dir would then empty the mounted filesystem, not free it)."""
    target = state_dir / OVERLAYS_DIR
    if not os.path.ismount(target):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for flags in (0, _MNT_DETACH):
        if libc.umount2(os.fsencode(target), flags) == 0:
            return
    err = ctypes.get_errno()
    raise OSError(err, f"cannot unmount the disk-limited filesystem at {target}: {os.strerror(err)}")


def _sparse_file(path: Path, size: int) -> None:
    """A file of ``size`` bytes that takes no space until written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


async def _mount_disk(state_dir: Path, size: int) -> str | None:
    """Put a ``size``-byte ext4 on the sandbox's overlays dir; None when done, else why not."""
    if os.geteuid() != 0:
        return "a size-limited filesystem needs root (a loop mount)"
    mkfs, mount = shutil.which("mkfs.ext4"), shutil.which("mount")
    if not mkfs or not mount:
        return "mkfs.ext4 or mount is not installed (e2fsprogs, util-linux)"
    image, target = state_dir / DISK_IMAGE, state_dir / OVERLAYS_DIR
    target.mkdir(parents=True, exist_ok=True)
    await asyncio.to_thread(_sparse_file, image, size)
    steps = [
        [mkfs, "-q", "-F", "-O", "^has_journal", "-m", "0", "-E", "nodiscard", str(image)],
        [mount, "-o", "loop,nosuid,nodev,noatime", str(image), str(target)],
    ]
    for argv in steps:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), DISK_STEP_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return f"{Path(argv[0]).name} did not finish within {DISK_STEP_TIMEOUT_S:g}s"
        if proc.returncode != 0:
            return f"{Path(argv[0]).name} failed: {err.decode(errors='replace').strip()[:200]}"
    return None
