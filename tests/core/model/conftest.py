"""Fixtures for the model-layer tests: the real OpenCode binary for the end-to-end test.

``opencode_bin`` is installed by the project's own installer (npm registry, integrity-checked, cached
per version and target under the user cache dir), so every test session shares one download.
"""

from __future__ import annotations

import asyncio
import platform
import subprocess
from pathlib import Path

import pytest

from opencode_tui_core.runtime.installer import DEFAULT_OPENCODE_VERSION, Installer
from opencode_tui_core.runtime.targets import Target


@pytest.fixture(scope="session")
def opencode_bin() -> Path:
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"the end-to-end test runs the x64 build (this host is {platform.machine()})")
    installed = asyncio.run(Installer().ensure(Target(arch="x64")))
    binary = Path(installed.path)
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=120, check=False)
    if out.stdout.strip() != DEFAULT_OPENCODE_VERSION:
        pytest.fail(f"{binary} --version said {out.stdout.strip()!r} {out.stderr.strip()[-500:]!r}")
    return binary
