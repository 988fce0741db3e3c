"""The in-sandbox relay on its own (no sandbox): loopback TCP forwarded to a host Unix socket."""

from __future__ import annotations

import subprocess
import sys

from opencode_tui_core.inside.relay import RELAY_SCRIPT_PATH
from opencode_tui_core.sandbox.contract import suite

model_socket = suite.model_socket  # a fixture: a real HTTP server on a host Unix socket


def test_relay_forwards_tcp_to_a_unix_socket_on_the_host(model_socket: str) -> None:
    """The relay itself (no sandbox): port 0 prints the chosen port; concurrent requests are relayed."""
    import concurrent.futures
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, str(RELAY_SCRIPT_PATH), "0", model_socket],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip())

        def fetch(path: str) -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
                return response.read().decode()

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            bodies = list(pool.map(fetch, [f"/r{i}" for i in range(8)]))
        assert bodies == [f"hello from the host model socket: /r{i}" for i in range(8)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_relay_rejects_bad_arguments() -> None:

    bad = subprocess.run([sys.executable, str(RELAY_SCRIPT_PATH), "notaport"], capture_output=True, text=True)
    assert bad.returncode == 2 and "PORT" in bad.stderr
