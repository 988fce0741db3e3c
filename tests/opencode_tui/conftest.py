"""Shared fixtures for the TUI tests: the fixture run directories and waiting helpers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_RUNS = FIXTURES / "runs"


@pytest.fixture(scope="session")
def fixture_runs() -> Path:
    """``tests/fixtures/runs`` (written by ``tests/fixtures/make_fixture_runs.py`` if missing)."""
    if not (FIXTURE_RUNS / "oom" / "events.jsonl").exists() or not (FIXTURE_RUNS / "hello-file").exists():
        subprocess.run([sys.executable, str(FIXTURES / "make_fixture_runs.py")], check=True)
    return FIXTURE_RUNS


async def wait_for(
    pilot, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Let the app run until ``predicate()`` holds (fails the test after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.02)


@pytest.fixture
def wait():
    return wait_for


async def loaded(pilot) -> None:
    """Wait until the replay has read the whole events.jsonl and the screen has settled."""
    from opencode_tui.screens.run import RunScreen

    await wait_for(
        pilot,
        lambda: isinstance(pilot.app.screen, RunScreen) and not pilot.app.screen.replay_loading,
        what="the replay to load",
    )
    await pilot.pause()
    await asyncio.sleep(0)


@pytest.fixture
def replay_loaded():
    return loaded
