"""The live fault watch (``Sandbox.watch_faults``) against real kernel faults: a real OOM kill in a
memory-limited local sandbox and docker container, and a real disk fill of a size-limited local
sandbox. Timing is checked relatively, from the timestamps (the benchmarks time it absolutely)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from opencode_tui_core.events import FaultKind, SandboxFault
from opencode_tui_core.sandbox.base import Sandbox, SandboxError, SandboxSpec
from opencode_tui_core.sandbox.faults import SOURCE_DISK, SOURCE_KERNEL_LOG, disk_full_seen

pytestmark = pytest.mark.timeout(120)

# Prints its own pid (exec keeps it), then allocates far past the limit: the kernel kills it.
HOG = "echo $$; exec python3 -c 'b = [bytearray(32 << 20) for _ in range(64)]'"


class Seen:
    """Faults as they arrive, each with the wall time it reached us."""

    def __init__(self) -> None:
        self.faults: list[tuple[SandboxFault, datetime]] = []

    async def collect(self, sandbox: Sandbox, stop: asyncio.Event) -> None:
        async for fault in sandbox.watch_faults(stop):
            self.faults.append((fault, datetime.now(UTC)))


async def _oom_seen_live(sandbox: Sandbox) -> None:
    seen, stop = Seen(), asyncio.Event()
    watch = asyncio.create_task(seen.collect(sandbox, stop))
    await asyncio.sleep(0.5)  # the watch has taken its first look
    r = await sandbox.exec(["/bin/sh", "-c", HOG], timeout=60)
    killed_at = r.ended_at
    # The live event arrives while the sandbox still runs: wait for it (bounded), not for a close.
    for _ in range(50):
        if seen.faults:
            break
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(watch, 10)
    assert r.observed and (r.signal == 9 or r.exit_code == 137), r
    pid = int(r.stdout.split()[0])
    kills = [(f, at) for f, at in seen.faults if f.kind is FaultKind.OOM_KILL]
    assert kills, f"no live OOM event; saw {seen.faults}"
    fault, arrived = kills[0]
    assert fault.pid == pid, (fault, pid)
    assert fault.command and "bytearray" in fault.command, fault.command
    assert fault.source == SOURCE_KERNEL_LOG and "OOM-killed" in fault.message
    # It happened when the command died, and was reported within 2 s of that.
    assert abs((fault.ts - killed_at).total_seconds()) < 2.0, (fault.ts, killed_at)
    assert (arrived - killed_at).total_seconds() < 2.0, (arrived, killed_at)


@pytest.mark.bwrap
async def test_a_real_oom_kill_in_a_local_sandbox_is_seen_live_with_its_pid(tmp_path: Path) -> None:
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    provider = LocalProvider(base_dir=tmp_path / "state")
    try:
        await provider.check()
    except SandboxError as exc:
        pytest.skip(f"bubblewrap cannot run here: {exc}")
    sb = await provider.create(SandboxSpec(run_id="test-faults-oom", memory_bytes=128 << 20))
    try:
        if not (await sb.status()).memory_limit_enforced:
            pytest.skip("no memory cgroup here")
        await _oom_seen_live(sb)
    finally:
        await sb.release()


@pytest.mark.docker
async def test_a_real_oom_kill_in_a_docker_container_is_seen_live_with_its_pid(
    docker_client, spec_factory
) -> None:
    from opencode_tui_core.sandbox.docker.provider import DockerProvider

    sb = await DockerProvider().create(spec_factory(memory_bytes=128 << 20))
    try:
        await _oom_seen_live(sb)
    finally:
        await sb.release()


@pytest.mark.bwrap
async def test_a_command_killed_between_two_polls_is_still_named_by_its_pid(tmp_path: Path) -> None:
    """The worst case of the poll's timing, made certain: the watch takes no look between the command's
    start and its kill (no poll runs), so only what exec handed the watch can name the process."""
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    provider = LocalProvider(base_dir=tmp_path / "state")
    sb = await provider.create(SandboxSpec(run_id="test-faults-fast", memory_bytes=128 << 20))
    try:
        if not (await sb.status()).memory_limit_enforced:
            pytest.skip("no memory cgroup here")
        watcher = sb._fault_watcher()  # type: ignore[attr-defined]  # the local provider's own watch
        await asyncio.to_thread(watcher.start)
        try:
            if watcher._log is None or watcher._log.fd is None:
                pytest.skip("the kernel log is not readable here: the pid comes from the table only")
            r = await sb.exec(["/bin/sh", "-c", HOG], timeout=60)
            faults = await asyncio.to_thread(watcher.poll)
        finally:
            watcher.stop()
        pid = int(r.stdout.split()[0])
        kills = [f for f in faults if f.kind is FaultKind.OOM_KILL]
        assert len(kills) == 1 and kills[0].pid == pid, (kills, pid)
        assert kills[0].host_pid != pid and "bytearray" in (kills[0].command or "")
    finally:
        await sb.release()


@pytest.mark.bwrap
async def test_a_real_disk_fill_of_a_local_sandbox_is_seen_live_and_at_the_close(tmp_path: Path) -> None:
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    provider = LocalProvider(base_dir=tmp_path / "state")
    sb = await provider.create(SandboxSpec(run_id="test-faults-disk", disk_bytes=64 << 20))
    try:
        if not (await sb.status()).disk_limit_enforced:
            pytest.skip("the disk limit is not enforced here (needs root and mkfs.ext4)")
        seen, stop = Seen(), asyncio.Event()
        watch = asyncio.create_task(seen.collect(sb, stop))
        await asyncio.sleep(0.5)
        start = time.monotonic()
        r = await sb.exec(["/bin/sh", "-c", "dd if=/dev/zero of=$HOME/fill bs=1M count=256"], timeout=60)
        for _ in range(30):
            if seen.faults:
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(watch, 10)
        assert not r.ok and b"No space left" in r.stderr, r
        full = [f for f, _ in seen.faults if f.kind is FaultKind.DISK_FULL]
        assert len(full) == 1, seen.faults  # seen once, not at every poll
        assert full[0].source == SOURCE_DISK and "ENOSPC" in full[0].message
        assert full[0].ts <= r.ended_at or time.monotonic() - start < 60
        # The close-time check carries it as evidence.
        evidence = disk_full_seen(await sb.inspect())
        assert evidence and evidence[0].data["full_seen_at"] and evidence[0].data["limit_bytes"] == 64 << 20
    finally:
        await sb.release()


@pytest.mark.docker
async def test_without_the_host_cgroup_docker_s_own_oom_event_is_seen_live(
    docker_client, spec_factory
) -> None:
    """A remote engine's container cgroup is not on this host: the watch falls back to the engine's
    ``oom`` events (which name no process). Here the cgroup is visible, so it is hidden from the sandbox."""
    from opencode_tui_core.sandbox.docker.provider import DockerProvider

    sb = await DockerProvider().create(spec_factory(memory_bytes=128 << 20))
    try:
        sb._cgroup = None  # as for an engine on another host
        seen, stop = Seen(), asyncio.Event()
        watch = asyncio.create_task(seen.collect(sb, stop))
        r = await sb.exec(["/bin/sh", "-c", HOG], timeout=60)
        for _ in range(50):
            if seen.faults:
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(watch, 10)
        assert r.signal == 9 or r.exit_code == 137, r
        kills = [(f, at) for f, at in seen.faults if f.kind is FaultKind.OOM_KILL]
        assert kills and kills[0][0].source == "docker.events" and kills[0][0].pid is None, seen.faults
        fault, arrived = kills[0]
        assert abs((fault.ts - r.ended_at).total_seconds()) < 2.0
        assert (arrived - r.ended_at).total_seconds() < 3.0  # one poll a second, plus the query
    finally:
        await sb.release()
