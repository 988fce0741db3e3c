"""Session-wide settings: every sandbox a test creates carries one owner label, and none may leak."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

TEST_OWNER = f"pytest-{uuid.uuid4().hex[:10]}"
# Set before any provider is created, so every owned sandbox of this session carries it.
os.environ.setdefault("OPENCODE_TUI_OWNER", TEST_OWNER)


@pytest.fixture(scope="session")
def test_owner() -> str:
    return os.environ["OPENCODE_TUI_OWNER"]


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_owned_containers():
    yield
    owner = os.environ["OPENCODE_TUI_OWNER"]
    try:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=opencode-tui.owner={owner}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return
    leaked = out.stdout.split()
    if leaked:
        subprocess.run(["docker", "rm", "-f", *leaked], capture_output=True, timeout=60)
    assert not leaked, f"tests leaked containers owned by {owner}: {leaked}"
