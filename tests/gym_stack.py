"""A real NeMo Gym deployment for the tests, from the nemo-gym wheel (scripts/install-gym).

``ng_run`` (Gym's own launcher) starts its head server and two server processes: this project's agent
server (opencode_tui_core/gym/root/..., found through ``NEMO_GYM_EXTRA_ROOTS`` as a user's would be)
and Gym's ``legacy_agent`` environment server fronting it. Rollouts are collected with
``ng_collect_rollouts``, Gym's collector. Everything binds 127.0.0.1: Gym is given a Ray head of ours on
loopback (left to itself it starts one on the machine's other address). Gym's per-server virtual
environments are the one scripts/install-gym made (``skip_venv_if_present``: nothing is installed at
start). Stopped by signalling the process groups started here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from opencode_tui_core.gym import GYM_ROOT
from tests.ray_cluster import RayHead, free_port, kill_group

ROOT = Path(__file__).resolve().parents[1]
AGENT = "opencode_tui_agent"
ENVIRONMENT = "opencode_tui_environment_server"


def gym_venv() -> Path:
    """The environment scripts/install-gym made; in CI a missing one fails (CI installs it), elsewhere
    the tests are skipped with the command that installs it."""
    venv = Path(
        subprocess.run(
            [ROOT / "scripts/install-gym", "--print-venv"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    )
    if not (venv / "bin" / "ng_run").exists():
        message = f"no NeMo Gym environment at {venv}: run scripts/install-gym"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return venv


class GymStack:
    """Gym's head, the opencode-tui agent server and its environment server, all on loopback."""

    def __init__(self, work: Path, agent: dict[str, Any]) -> None:
        self.venv = gym_venv()
        self.work = work
        self.head_port, self.agent_port, self.env_port = free_port(), free_port(), free_port()
        self.ray = RayHead(cpus=2, ray=str(self.venv / "bin" / "ray"))
        self.env = {**self.ray.env, "NEMO_GYM_EXTRA_ROOTS": str(GYM_ROOT), "PYTHONUNBUFFERED": "1"}
        self.config = work / "gym.yaml"
        self.config.write_text(yaml.safe_dump(self._config(agent)))
        venvs = work / "venvs"
        for server in (f"responses_api_agents/{AGENT}", "environment_servers/legacy_agent"):
            (venvs / server).mkdir(parents=True)
            (venvs / server / ".venv").symlink_to(self.venv)
        self.log = work / "ng_run.log"
        cmd = [str(self.venv / "bin" / "ng_run"), f"+config_paths=[{self.config}]", *self._common()]
        cmd += [f"+uv_venv_dir={venvs}", "+skip_venv_if_present=true"]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=work, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _common(self) -> list[str]:
        return [
            f"+head_server={{host:127.0.0.1,port:{self.head_port}}}",
            f"+ray_head_node_address={self.ray.address}",
        ]

    def _config(self, agent: dict[str, Any]) -> dict[str, Any]:
        return {
            AGENT: {
                "responses_api_agents": {
                    AGENT: {"entrypoint": "app.py", "host": "127.0.0.1", "port": self.agent_port, **agent}
                }
            },
            ENVIRONMENT: {
                "environment_servers": {
                    "legacy_agent": {
                        "entrypoint": "app.py",
                        "host": "127.0.0.1",
                        "port": self.env_port,
                        "agent_server": {"type": "responses_api_agents", "name": AGENT},
                    }
                }
            },
        }

    @property
    def agent_url(self) -> str:
        return f"http://127.0.0.1:{self.agent_port}"

    def _wait_ready(self, timeout: float = 300) -> None:
        """Until ng_run says all its servers are up ("All 2 / 2 servers ready!"; it prints "1 / 2 servers
        ready" on the way) and each answers its health check."""
        deadline = time.monotonic() + timeout
        while not re.search(r"All (\d+) / \1 servers ready", self.log.read_text()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Gym did not start (ng_run exited {self.proc.poll()}):\n{self.tail()}")
            time.sleep(0.5)
        for port in (self.agent_port, self.env_port):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                assert r.status == 200

    def tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def collect(
        self, rows: list[dict[str, Any]], name: str, *extra: str
    ) -> tuple[list[dict], list[dict], str]:
        """``ng_collect_rollouts`` over ``rows``: (rollouts, failures sidecar rows, what it printed)."""
        inp, out = self.work / f"{name}.jsonl", self.work / f"{name}-rollouts.jsonl"
        inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        cmd = [str(self.venv / "bin" / "ng_collect_rollouts"), f"+agent_name={AGENT}"]
        cmd += [f"+input_jsonl_fpath={inp}", f"+output_jsonl_fpath={out}", *self._common(), *extra]
        done = subprocess.run(cmd, cwd=self.work, env=self.env, capture_output=True, text=True, timeout=900)
        printed = done.stdout + done.stderr
        assert done.returncode == 0, f"ng_collect_rollouts exited {done.returncode}:\n{printed[-6000:]}"
        failures = out.with_name(f"{out.stem}_failures.jsonl")
        return _jsonl(out), _jsonl(failures), printed

    def stop(self) -> None:
        """SIGINT ng_run (its own shutdown stops the servers it started), then SIGKILL what is left of
        its process group, then the Ray head."""
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        kill_group(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.ray.stop()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
