"""Real Ray processes for the tests: a head on 127.0.0.1 and worker nodes, each in its own process
group (stopped by signalling that group: only the processes a test started). Bound to loopback
explicitly: left to itself, Ray picks the machine's other address."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayHead:
    """A real Ray head on 127.0.0.1 in its own process group (stopped by signalling that group)."""

    def __init__(
        self,
        cpus: int = 2,
        wrap: list[str] | None = None,
        env: dict[str, str] | None = None,
        ray: str = "ray",
    ) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Short: Ray's Unix sockets live under it (108-byte limit).
        self.temp = Path(tempfile.mkdtemp(prefix="rayt-", dir="/tmp"))
        self.log = self.temp / "head.log"
        # Token authentication with a token of this head's own, passed to its drivers: nothing is read
        # from or written to ~/.ray (Ray 2.60 would otherwise follow whatever token file is there).
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex,
            "RAY_USAGE_STATS_ENABLED": "0",
            **(env or {}),
        }
        env = {
            **self.env,
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        cmd = [
            *(wrap or []),
            ray,  # the driver's own Ray (its Python and Ray versions must be the cluster's)
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={self.port}",
        ]
        cmd += [f"--num-cpus={cpus}", "--include-dashboard=false", "--disable-usage-stats"]
        cmd += [f"--temp-dir={self.temp}", f"--dashboard-port={free_port()}"]
        cmd += [f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}"]
        try:
            self.proc = _start_ray(cmd, env, self.log, "head")
        except AssertionError:
            shutil.rmtree(self.temp, ignore_errors=True)
            raise

    def stop(self) -> None:
        """SIGTERM the group (`ray start --block` drains and stops its processes), then SIGKILL what is
        left of it: only this head's processes, found by their process group."""
        with_group = self.proc.pid
        try:
            os.killpg(with_group, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        kill_group(with_group)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.temp, ignore_errors=True)


def _start_ray(cmd: list[str], env: dict[str, str], log_path: Path, what: str) -> subprocess.Popen:
    """``ray start --block`` in its own process group, waited for until it says it runs."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 180
    while "Ray runtime started" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc.pid)
            proc.wait(timeout=30)
            raise AssertionError(f"the Ray {what} did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    return proc


def kill_group(group: int) -> None:
    """SIGKILL every process of one process group (only the Ray processes this test started)."""
    pids = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True, timeout=10).stdout
    for pid in pids.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


class RayNode:
    """A real worker node joined to ``head`` (same machine, address 127.0.0.1), in its own process
    group: ``kill`` SIGKILLs the whole group (raylet, its workers), as when a machine is lost."""

    def __init__(self, head: RayHead, cpus: int) -> None:
        self.log = head.temp / f"node-{uuid.uuid4().hex[:6]}.log"
        cmd = ["ray", "start", "--block", f"--address={head.address}", "--node-ip-address=127.0.0.1"]
        cmd += [f"--num-cpus={cpus}", f"--temp-dir={head.temp}", "--disable-usage-stats"]
        cmd += [f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"]
        env = {
            **head.env,
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        self.proc = _start_ray(cmd, env, self.log, "node")

    def kill(self) -> None:
        kill_group(self.proc.pid)
        self.proc.wait(timeout=30)
