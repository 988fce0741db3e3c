"""SandboxSession against real providers: confirmed cleanup, idempotent close, staging fences.

Every harness is a real process tree inside a real sandbox (Docker container or bubblewrap); leftover
processes are looked for on the host by a unique marker argument, which sees inside both kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid

import pytest

from opencode_tui_core.sandbox.base import Sandbox, SandboxClosedError
from opencode_tui_core.session import (
    CleanupUnconfirmed,
    ClosedBeforeLaunch,
    SandboxSession,
    SessionRefused,
    SessionState,
)


def _marker() -> str:
    # A unique duration doubles as a marker: `sleep 1000.<n>` is findable from the host.
    return f"1000.{uuid.uuid4().int % 10**9}"


def _host_pids(marker: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _session(sandbox: Sandbox, run: float = 30, close: float = 9) -> SandboxSession:
    return SandboxSession(
        sandbox, f"/tmp/.opencode-tui/s-{uuid.uuid4().hex[:8]}", run_timeout_s=run, close_timeout_s=close
    )


async def test_double_forked_descendant_is_drained(sandbox: Sandbox):
    marker = _marker()
    s = _session(sandbox)
    # The harness waits until the child is in its own session: exiting earlier would let the harness's
    # process-group SIGKILL take the child before setsid ran, leaving nothing for the drain to find.
    flag = f"/tmp/detached-{marker}"
    script = (
        f"setsid sh -c 'touch {flag}; exec sleep {marker}' </dev/null >/dev/null 2>&1 & "
        f"while [ ! -e {flag} ]; do sleep 0.05; done; echo started"
    )
    result = await s.execute(["/bin/sh", "-c", script])
    assert result.exit_code == 0 and b"started" in result.stdout
    receipt = await s.close()
    assert receipt.cleanup_confirmed and receipt.return_code == 0
    assert receipt.descendants_killed >= 1
    assert _host_pids(marker) == []


async def test_double_forked_descendant_gone_inside_sandbox(sandbox: Sandbox):
    marker = _marker()
    s = _session(sandbox)
    await s.execute(["/bin/sh", "-c", f"setsid sh -c 'sleep {marker}' </dev/null >/dev/null 2>&1 &"])
    await s.finalize()
    ps = await sandbox.exec(["ps", "-eo", "args"], timeout=20)
    assert f"sleep {marker}" not in ps.text()
    await s.release()


async def test_term_ignoring_harness_is_killed_and_deadline_sets_timed_out(sandbox: Sandbox):
    marker = _marker()
    s = _session(sandbox, run=2, close=6)
    result = await s.execute(["/bin/sh", "-c", f"trap '' TERM; sleep {marker}"])
    assert result.observed
    receipt = await s.close()
    assert receipt.cleanup_confirmed
    assert receipt.timed_out is True
    assert receipt.return_code is None and receipt.signal == 9
    assert _host_pids(marker) == []


async def test_close_is_idempotent_and_collects_once(sandbox: Sandbox):
    calls = []

    async def collect(sb, receipt):
        calls.append(receipt)
        await asyncio.sleep(0.2)

    s = _session(sandbox)
    await s.execute(["/bin/sh", "-c", "echo hi"], collect=collect)
    r1, r2 = await asyncio.gather(s.finalize(), s.finalize())
    r3 = await s.close()
    r4 = await s.close()
    assert r1 == r2 == r3 == r4
    assert len(calls) == 1
    assert s.state is SessionState.CLOSED


async def test_close_during_staging_prevents_launch(sandbox: Sandbox):
    s = _session(sandbox)
    gate = asyncio.Event()
    staged = asyncio.Event()

    async def slow_stage(sb):
        staged.set()
        await gate.wait()

    ran_marker = f"{s.paths.session_dir}/harness-ran"
    execute = asyncio.ensure_future(s.execute(["/bin/sh", "-c", f"touch {ran_marker}"], stage=slow_stage))
    await staged.wait()
    closing = asyncio.ensure_future(s.finalize())
    await asyncio.sleep(0.1)
    gate.set()
    with pytest.raises(ClosedBeforeLaunch):
        await execute
    receipt = await closing
    assert receipt.cleanup_confirmed and receipt.return_code is None
    probe = await sandbox.exec(["/bin/sh", "-c", f"test -e {ran_marker}"], timeout=10)
    assert probe.exit_code == 1, "the harness must never have run"
    await s.release()


async def test_cancelled_close_stays_closing_and_can_retry(sandbox: Sandbox):
    marker = _marker()
    s = _session(sandbox, run=60, close=6)
    task = asyncio.ensure_future(s.execute(["/bin/sh", "-c", f"trap '' TERM; sleep {marker}"]))
    await asyncio.sleep(1.5)
    closer = asyncio.ensure_future(s.close())
    await asyncio.sleep(0.3)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert s.state is not SessionState.CLOSED
    receipt = await s.close()
    assert receipt.cleanup_confirmed
    await task
    assert _host_pids(marker) == []


async def test_closed_session_refuses_and_never_falls_back_to_host(sandbox: Sandbox, tmp_path):
    s = _session(sandbox)
    await s.execute(["/bin/sh", "-c", "true"])
    await s.close()
    host_marker = tmp_path / "ran-on-host"
    with pytest.raises(SessionRefused):
        await s.execute(["/bin/sh", "-c", f"touch {host_marker}"])
    with pytest.raises(SandboxClosedError):
        await sandbox.exec(["/bin/sh", "-c", f"touch {host_marker}"], timeout=5)
    assert not host_marker.exists()


def _supervisor_pid(session: SandboxSession) -> int | None:
    """The host pid of the session's supervisor (python running supervisor.py, not the launch shell)."""
    out = subprocess.run(["pgrep", "-f", session.paths.supervisor], capture_output=True, text=True)
    for pid in (int(p) for p in out.stdout.split()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--receipt" in argv and b"-c" not in argv[:2]:
            return pid
    return None


async def _until(predicate, what: str, within: float = 30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


# One close budget for the whole close, plus what the host needs to start execs and remove a sandbox.
CLOSE_SLACK_S = 2.0


async def test_one_close_budget_bounds_stop_retry_and_release_when_the_receipt_never_comes(
    sandbox: Sandbox,
):
    """A real stall: the supervisor is SIGSTOPped, so no receipt ever comes. The first finalize waits
    what the budget allows, a retried finalize starts no request (nothing is left), and the owned
    sandbox is still destroyed: all inside one close budget (before, each step had its own)."""
    close = 4.0
    marker = _marker()
    s = _session(sandbox, run=120, close=close)
    task = asyncio.ensure_future(s.execute(["/bin/sh", "-c", f"sleep {marker}"]))
    try:
        pid = await _until(lambda: _supervisor_pid(s), "the supervisor")
        await _until(lambda: _host_pids(marker), "the harness")
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(CleanupUnconfirmed):
            await s.finalize()
        with pytest.raises(CleanupUnconfirmed, match="close budget"):
            await s.finalize()
        await s.release()
        elapsed = time.monotonic() - started
        assert elapsed <= close + CLOSE_SLACK_S, f"the close took {elapsed:.2f}s"
        assert s.released and s.close_deadline is not None
        assert s.close_deadline.spent_s <= close + CLOSE_SLACK_S
        await _until(lambda: not _host_pids(marker), "the destroyed sandbox's processes to end", 15)
    finally:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 30)
