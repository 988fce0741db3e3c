"""One close budget for the whole close, and OpenCode's output kept whatever happens to the sandbox.

Real episodes (the real OpenCode binary, the scripted model, real sandboxes). The fault is real: the
process supervisor inside the sandbox is SIGSTOPped from the host while OpenCode runs a command, so
no cleanup receipt can ever come; then the run is cancelled and the episode closes: the stop waits
what the budget allows, the agent's launch exec is abandoned (before, the episode waited for it until
a second cancel: over 120 s here), a retried stop starts nothing, and the sandbox is destroyed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.events import CleanupObserved

pytestmark = pytest.mark.slow

# The release keeps a quarter of the budget: 2 s here. With 4 s (a 1 s reserve), a loaded CI machine
# once ended this close with cleanup_unconfirmed: the release did not finish within its reserve.
CLOSE_S = 8.0
# What the host needs on top of the budget: starting execs, cancelling the agent's exec, closing the
# model endpoint. Before the single deadline, this close took two full stop windows plus the rest.
SLACK_S = 3.0


def _pgrep(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _supervisor_pid(supervisor_path: str) -> int | None:
    for pid in _pgrep(supervisor_path):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--receipt" in argv and b"-c" not in argv[:2]:  # python supervisor.py, not the launch shell
            return pid
    return None


async def _until(predicate, what: str, within: float):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(
    "provider",
    [pytest.param("local", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)],
)
async def test_a_stalled_close_ends_within_one_budget_and_keeps_the_streamed_output(
    provider, task_copy, episode_on
):
    if provider == "docker":
        r = subprocess.run(["docker", "image", "inspect", "opencode-tui/base:bookworm"], capture_output=True)
        if r.returncode != 0:
            pytest.skip("docker or the base image is unavailable")
    marker = f"1000.{uuid.uuid4().int % 10**9}"
    steps = [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {"command": f"echo started; sleep {marker}", "description": "A long wait"},
                }
            ]
        },
        {"text": "unreachable"},
    ]
    ep = episode_on(
        task_copy("hello-file", trajectory=steps),
        sandbox={"provider": provider},
        budgets={"close_s": CLOSE_S},
    )
    run = asyncio.ensure_future(ep.run())
    try:
        await _until(lambda: _pgrep(f"sleep {marker}"), "OpenCode's command", 180)
        assert ep.session is not None
        pid = await _until(lambda: _supervisor_pid(ep.session.paths.supervisor), "the supervisor", 10)
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        await ep.cancel()
        result = await asyncio.wait_for(asyncio.shield(run), 120)
        elapsed = time.monotonic() - started
    finally:
        if not run.done():
            await ep.cancel()
            await asyncio.wait_for(run, 120)

    print(f"close with a {CLOSE_S:g}s budget took {elapsed:.2f}s on {provider}")
    # The close (stop, a retried stop that starts nothing, inspect, release) fits one budget.
    assert elapsed <= CLOSE_S + SLACK_S, f"the close took {elapsed:.1f}s with a {CLOSE_S:g}s budget"
    # No receipt ever came: the owned sandbox was destroyed, and the record says both.
    kinds = [r.failure.kind for r in ep.failures]
    assert "supervisor_lost" in kinds, [(r.failure.kind, r.failure.message) for r in ep.failures]
    assert result.cleanup_proof == "destroyed"
    assert ep.close_deadline is not None and ep.close_deadline.spent_s <= CLOSE_S + 1.0
    run_dir = Path(result.run_dir)
    events = (run_dir / RunFiles.EVENTS).read_text().splitlines()
    receipts = [
        e for e in map(json.loads, events) if e.get("type") == CleanupObserved.model_fields["type"].default
    ]
    assert any(e["step"] == "receipt" and e["state"] == "failed" for e in receipts)
    await _until(lambda: not _pgrep(f"sleep {marker}"), "the destroyed sandbox's processes to end", 15)

    # OpenCode's output reached the run directory while it ran, though nothing was collected.
    lines = (run_dir / RunFiles.OPENCODE_STDOUT).read_text().splitlines()
    assert lines and all(json.loads(line) is not None for line in lines)
    assert any(marker in line for line in lines)  # the running command, as OpenCode streamed it
    assert "listening on" in (run_dir / RunFiles.OPENCODE_STDERR).read_text()
    assert not (run_dir / RunFiles.OPENCODE_OUTPUT_LOG).exists()  # collected after confirmed cleanup only
    assert len((run_dir / RunFiles.DIAGNOSTICS).read_text()) <= 16_000
