"""The OpenSandbox server goes away mid-episode (issue 19): the real ``opensandbox-server`` (a process
of this test's own, so the session's server is never touched) is stopped a few seconds into the agent
of ``sample_tasks/timeout`` and started again once the episode is releasing. The sandbox's daemon is
our execd stand-in (the real execd is not obtainable here).

The agent talks to execd, not to the server, so the run itself is unaffected: its receipt comes and
its grade stands. The release (a DELETE through the server) finds no server: the close waits for it
within the close budget, deletes the sandbox once it answers, and says so; nothing is left behind.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from opencode_tui_core.episode import Episode
from opencode_tui_core.events import Event, EventBus, PhaseChanged, Warning_
from opencode_tui_core.sandbox.base import LABEL_OWNER, LABEL_RUN
from opencode_tui_core.tasks import load_task
from tests.core.sandbox.conftest import OPENSANDBOX_KEY_ENV, opensandbox_agent_config

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.opensandbox, pytest.mark.timeout(600)]
SAMPLES = Path(__file__).resolve().parents[3] / "sample_tasks"
BASE_IMAGE = "opencode-tui/base:bookworm"


def _stop_process(server: Any) -> None:
    """Stop the server process only (its sandboxes stay, as after a crash or a redeploy)."""
    proc = server.proc
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    server.proc = None


def test_server_gone_mid_agent_the_release_waits_for_it(
    docker_client: Any,
    standin_harness: Any,
    test_run_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = standin_harness
    if harness.server_executable() is None:
        pytest.skip("opensandbox-server is not installed (pip install -e '.[test]')")
    from opencode_tui_core.runtime.installer import default_cache_dir

    image = harness.ensure_standin_image(docker_client, BASE_IMAGE)
    server = harness.OpenSandboxServer(
        tmp_path / "server",
        image,
        run_label=(LABEL_RUN, test_run_id),
        allowed_host_paths=[str(default_cache_dir())],
    )
    (tmp_path / "server").mkdir()
    server.start()
    owner = f"os-lost-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(OPENSANDBOX_KEY_ENV, server.api_key)
    monkeypatch.setenv("OPENCODE_TUI_OWNER", owner)
    config = opensandbox_agent_config(server, budgets={"close_s": 60})
    bus = EventBus()
    events: list[Event] = []
    bus.subscribe(events.append)
    timeline: dict[str, float] = {}

    async def main() -> Any:
        episode = Episode(load_task(SAMPLES / "timeout"), config, runs_dir=tmp_path / "runs", bus=bus)
        run = asyncio.ensure_future(episode.run())

        async def phase(name: str) -> None:
            while not any(isinstance(e, PhaseChanged) and e.phase.value == name for e in events):
                assert not run.done(), "the episode ended early"
                await asyncio.sleep(0.1)

        await phase("agent")
        await asyncio.sleep(3)
        await asyncio.to_thread(_stop_process, server)
        timeline["down"] = time.monotonic()
        await phase("release")
        await asyncio.sleep(2)  # the release has found no server by now
        await asyncio.to_thread(server.start)
        timeline["up"] = time.monotonic()
        return await asyncio.wait_for(run, 120)

    try:
        result = asyncio.run(main())
    finally:
        server.stop()
    leftovers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL_OWNER}={owner}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.split()
    if leftovers:
        subprocess.run(["docker", "rm", "-f", *leftovers], capture_output=True, timeout=60, check=False)
    assert leftovers == [], "the sandbox was left behind"
    # The run itself was unaffected by the server's absence: its own outcome, cleanup by receipt.
    assert (result.failure_kind, result.action, result.exit_code) == ("agent_timeout", "count_as_zero", 1)
    assert (result.cleanup_confirmed, result.cleanup_proof) == (True, "receipt")
    said = [e for e in events if isinstance(e, Warning_) and e.code == "engine_lost_at_release"]
    assert len(said) == 1 and "opensandbox engine was away at release" in said[0].message, [
        (e.code, e.message) for e in events if isinstance(e, Warning_)
    ]
    released = [
        e for e in events if getattr(e, "type", "") == "cleanup" and e.step.value == "sandbox_released"
    ]
    assert released and released[-1].state.value == "ok"
