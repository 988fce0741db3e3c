"""Containment: the process limit (docker and local), the disk limit (local), as the kernel enforces them.

Real sandboxes; the processes and the writes are real, and the evidence is the cgroup's own counters.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from opencode_tui_core.sandbox.base import SandboxSpec
from opencode_tui_core.sandbox.pids import SOURCE_PIDS, pids_limit_hit
from tests.core.conftest import require_docker_image

pytestmark = pytest.mark.timeout(180)

LIMIT = 1024
BASE = "opencode-tui/base:bookworm"

# Forks children that exec ``sleep`` until a fork is refused; prints how many it started and the
# errno of the refusal, then stays, so that nothing of the sandbox has exited when the cgroup is read.
# The sandbox's release kills all of it.
FORKER = r"""
import errno, os, sys, time
started = 0
try:
    while started < 5000:
        pid = os.fork()
        if pid == 0:
            try:
                os.execv("/bin/sleep", ["sleep", "300"])
            finally:
                os._exit(127)
        started += 1
except OSError as exc:
    print(started, errno.errorcode.get(exc.errno, exc.errno), flush=True)
    time.sleep(300)
print(started, "none", flush=True)
"""


def _provider(name: str):
    if name == "docker":
        require_docker_image()
        from opencode_tui_core.sandbox.docker.provider import DockerProvider

        return DockerProvider()
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    return LocalProvider()


@pytest.mark.parametrize(
    "name", [pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)]
)
async def test_a_pids_limited_sandbox_refuses_the_1025th_process(name: str) -> None:
    provider = _provider(name)
    sb = await provider.create(
        SandboxSpec(
            run_id="test-limits-pids",
            image="opencode-tui/base:bookworm",
            memory_bytes=768 << 20,
            pids_limit=LIMIT,
        )
    )
    try:
        status = await sb.status()
        assert status.pids_limit_enforced is True, status.notes
        before = pids_limit_hit(await sb.inspect())
        assert before == []
        out: list[bytes] = []
        forker = asyncio.create_task(
            sb.exec(["python3", "-c", FORKER], timeout=120, on_output=lambda c: out.append(c.data))
        )
        loop = asyncio.get_running_loop()
        end = loop.time() + 90
        while b"\n" not in b"".join(out):
            assert not forker.done(), (await forker).stderr
            assert loop.time() < end, "the forker never reported"
            await asyncio.sleep(0.1)
        started, err = b"".join(out).decode().split()
        assert err == "EAGAIN", out
        evidence = [e for e in await sb.inspect() if e.source == SOURCE_PIDS]
        assert len(evidence) == 1
        data = evidence[0].data
        # Every process and thread of the sandbox counts, and all of them are still there: the
        # cgroup holds exactly the limit, so the refused process was the 1,025th.
        assert data["pids_max"] == LIMIT
        assert data["pids_current"] == LIMIT
        assert 0 < int(started) < LIMIT
        assert pids_limit_hit(evidence) == evidence, data
    finally:
        await sb.release()
        if "forker" in locals():
            forker.cancel()
            with contextlib.suppress(BaseException):
                await forker


async def test_no_limit_asked_means_none_enforced_or_reported() -> None:
    """Without ``pids_limit`` a local sandbox gets no pids cgroup and says nothing is enforced."""
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    sb = await LocalProvider().create(SandboxSpec(run_id="test-limits-none"))
    try:
        status = await sb.status()
        assert status.pids_limit_enforced is None
        assert not [e for e in await sb.inspect() if e.source == SOURCE_PIDS]
    finally:
        await sb.release()


DISK = 64 << 20

# Writes 1 MiB blocks into the workdir until the filesystem refuses; prints bytes written and errno.
FILLER = r"""
import errno, os
block = b"x" * (1 << 20)
written = 0
try:
    with open("fill.bin", "wb", buffering=0) as f:
        while written < (1 << 30):
            written += f.write(block)
            os.fsync(f.fileno())
except OSError as exc:
    print(written, errno.errorcode.get(exc.errno, exc.errno))
else:
    print(written, "none")
"""


@pytest.mark.bwrap
async def test_a_disk_limited_local_sandbox_gives_enospc_at_the_limit(tmp_path) -> None:
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    provider = LocalProvider(base_dir=tmp_path / "state")
    sb = await provider.create(SandboxSpec(run_id="test-limits-disk", disk_bytes=DISK))
    state_dir = tmp_path / "state" / sb.sandbox_id
    try:
        status = await sb.status()
        assert status.disk_limit_enforced is True, status.notes
        r = await sb.exec(["python3", "-c", FILLER], timeout=120)
        assert r.ok, r.stderr
        written, err = r.stdout.decode().split()
        assert err == "ENOSPC", r.stdout
        # The limit is the whole filesystem; ext4's own metadata takes a few percent of it.
        assert 0.85 * DISK <= int(written) <= DISK
        # /tmp shares it: nothing more fits there either.
        r = await sb.exec(["/bin/sh", "-c", "head -c 2097152 /dev/zero > /tmp/more"], timeout=60)
        assert not r.ok and b"No space left" in r.stderr
    finally:
        await sb.release()
    assert not state_dir.exists()
    assert state_dir.as_posix() not in open("/proc/self/mounts").read()


@pytest.mark.docker
async def test_a_disk_limit_the_provider_cannot_enforce_is_said() -> None:
    """Docker on this engine's storage driver (overlay2 on ext4 here) cannot size a container: the
    status says so and why, rather than pretending."""
    require_docker_image()
    import docker

    from opencode_tui_core.sandbox.docker.provider import DockerProvider, disk_limit_support

    can, why = disk_limit_support(docker.from_env(timeout=30).info())
    provider = DockerProvider()
    sb = await provider.create(SandboxSpec(run_id="test-limits-disk", disk_bytes=DISK, image=BASE))
    try:
        status = await sb.status()
        if can:
            assert status.disk_limit_enforced is True
        else:
            assert status.disk_limit_enforced is False
            assert any(why in n for n in status.notes), status.notes
    finally:
        await sb.release()
