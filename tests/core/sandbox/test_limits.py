"""Containment: the process limit (docker and local), the disk limit (local), as the kernel enforces them.

Real sandboxes; the processes and the writes are real, and the evidence is the cgroup's own counters.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from core.sandbox.base import SandboxSpec
from core.sandbox.pids import SOURCE_PIDS, pids_limit_hit
from tests.core.conftest import require_docker_image

pytestmark = pytest.mark.timeout(180)

LIMIT = 1024

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
        from core.sandbox.docker.provider import DockerProvider

        return DockerProvider()
    from core.sandbox.local.provider import LocalProvider

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
    from core.sandbox.local.provider import LocalProvider

    sb = await LocalProvider().create(SandboxSpec(run_id="test-limits-none"))
    try:
        status = await sb.status()
        assert status.pids_limit_enforced is None
        assert not [e for e in await sb.inspect() if e.source == SOURCE_PIDS]
    finally:
        await sb.release()
