"""The serve runner waits for the model relay itself (it starts next to ``opencode serve`` instead of
before it): with no relay listening, the run ends with exit 3 and says why, before any session.

Real parts: the uploaded runner program, run on the host with the real pinned OpenCode binary from the
installer cache (skipped when it is not cached yet); the relay's port is a real closed port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_tui_core.inside.serve_runner import RELAY_PORT_ENV, RELAY_TIMEOUT_S
from opencode_tui_core.runtime.installer import Installer, InstallerConfig
from opencode_tui_core.runtime.opencode import OPENCODE_ENV, RUNNER_SOURCE
from opencode_tui_core.runtime.targets import parse_probe, probe_script, select_target


def _cached_binary() -> Path:
    facts = parse_probe(
        subprocess.run(["/bin/sh", "-c", probe_script()], capture_output=True, text=True).stdout
    )
    hit = Installer(InstallerConfig()).cached(select_target(facts))
    if hit is None:
        pytest.skip("the pinned OpenCode is not in the installer cache yet (any episode fills it)")
    return Path(hit.path)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


@pytest.mark.slow
def test_no_relay_means_exit_3_before_any_session(tmp_path: Path) -> None:
    binary = _cached_binary()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        **{f"XDG_{k.upper()}_HOME": str(tmp_path / k) for k in ("config", "data", "cache", "state")},
        **OPENCODE_ENV,
        RELAY_PORT_ENV: str(_closed_port()),
    }
    r = subprocess.run(
        [sys.executable, "-I", str(RUNNER_SOURCE), str(binary)],
        input=b"hello",
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=120 + RELAY_TIMEOUT_S,
    )
    assert r.returncode == 3, r.stderr[-2000:]
    assert b"the model relay did not start" in r.stderr
    types = [
        line.split(b'"type":"')[1].split(b'"')[0] for line in r.stdout.splitlines() if b'"type":"' in line
    ]
    assert b"runner.listening" in types and b"runner.session" not in types
