"""The warm pool on every way out of ``run --batch`` (issue 31): a signal releases the prepared,
unused sandboxes and confirms it; after a SIGKILL ``sweep`` removes them. Real docker and local
(bubblewrap) sandboxes, the real OpenCode binary, the embedded scripted model."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.sandbox.base import LABEL_POOL
from opencode_tui_core.sandbox.providers import get_provider

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
CLI = [sys.executable, "-m", "opencode_tui.cli"]
BUSY = {
    "steps": [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60", "description": "wait"}}]},
        {"text": "done"},
    ]
}


def _pooled(provider: str, owner: str) -> list[str]:
    config = AgentConfig.model_validate({"sandbox": {"provider": provider}})
    records = asyncio.run(get_provider(provider, config).listed(owner=owner))
    return [r.sandbox_id for r in records if LABEL_POOL in r.labels]


def _start(provider: str, tmp_path: Path) -> subprocess.Popen[str]:
    """Four busy tasks, one at a time, two prepared ahead."""
    tasks = []
    for i in range(4):
        d = tmp_path / "tasks" / f"busy-{i}"
        shutil.copytree(SAMPLES / "hello-file", d)
        text = (d / "task.yaml").read_text().replace("id: hello-file", f"id: busy-{i}")
        (d / "task.yaml").write_text(text.replace("problem_statement: |", "problem_statement: |\n  Wait.", 1))
        (d / "trajectory.yaml").write_text(yaml.safe_dump(BUSY))
        tasks.append(str(d))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"batch": {"warm": 2}, "policy": {"max_attempts": 1}}))
    args = ["--batch", "--provider", provider, "--runs-dir", str(tmp_path / "runs"), "--config", str(config)]
    return subprocess.Popen(
        [*CLI, "run", *tasks, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_pool(proc: subprocess.Popen[str], provider: str, owner: str, n: int) -> None:
    deadline = time.monotonic() + 180
    while len(_pooled(provider, owner)) < n:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, f"{n} prepared sandboxes never appeared"
        time.sleep(0.2)
    time.sleep(3)  # their OpenCode installs (one at a time; the first task's agent sleeps 60 s)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_releases_the_prepared_sandboxes_confirmed(sig, code, provider, tmp_path, test_owner):
    proc = _start(provider, tmp_path)
    try:
        _wait_for_pool(proc, provider, test_owner, 2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert _pooled(provider, test_owner) == []
    summary = err.strip().splitlines()[-1]
    assert re.search(r"warm sandboxes: [12] prepared, 0 used, 2 discarded$", summary), summary


@pytest.mark.slow
def test_sweep_removes_the_prepared_sandboxes_a_sigkill_left(provider, tmp_path, test_owner):
    proc = _start(provider, tmp_path)
    try:
        _wait_for_pool(proc, provider, test_owner, 2)
    finally:
        proc.kill()
        proc.wait(30)
    assert len(_pooled(provider, test_owner)) == 2, "kill -9 should have left the prepared sandboxes"
    r = subprocess.run(
        [*CLI, "sweep", "--provider", provider], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert r.returncode == 0, r.stderr
    assert _pooled(provider, test_owner) == []


def test_the_event_log_names_a_warm_sandbox():
    from datetime import UTC, datetime

    from opencode_tui.format import summarize
    from opencode_tui_core.events import WarmSandbox

    ev = WarmSandbox(
        sandbox_id="sb1",
        provider="local",
        prepared_at=datetime.now(UTC),
        prepare_s=1.25,
        waited_s=0,
        age_s=3,
        pool_run="pool-b1-1",
    )
    assert summarize(ev) == "sandbox sb1 prepared ahead (1.25s, waited 0.00s)"


@pytest.mark.slow
@pytest.mark.bwrap
@pytest.mark.parametrize(
    ("how", "code"),
    [("c", 130), ("q", 130), ("ctrl-c", 130), ("SIGTERM", 143), ("SIGHUP", 129)],
)
def test_every_way_off_the_batch_screen_releases_the_prepared_sandboxes(how, code, tmp_path, test_owner):
    """The batch screen (the same tasks without --batch, in a pseudo-terminal) with two sandboxes
    prepared ahead: `c` (confirmed with `y`; the cancelled batch stays on screen, then `q`), `q`
    (confirmed), Ctrl-C, SIGTERM and SIGHUP all end with the prepared sandboxes released. The exit
    code says how it ended."""
    from tests.opencode_tui.test_tui_pty import Tui

    proc = _start("local", tmp_path)  # the tasks and the config, as --batch would run them
    proc.kill()
    proc.wait(30)
    tasks = sorted(str(p) for p in (tmp_path / "tasks").iterdir())
    args = ["run", *tasks, "--jobs", "1", "--provider", "local", "--runs-dir", str(tmp_path / "screen")]
    t = Tui([*args, "--config", str(tmp_path / "config.yaml")], tmp_path)
    try:
        t.wait_for(lambda s: "running 1" in s and "queued 3" in s, 90, "one running, three queued")
        deadline = time.monotonic() + 180
        while len(_pooled("local", test_owner)) < 2:
            assert time.monotonic() < deadline, "two prepared sandboxes never appeared"
            t.pump(0.5)
        t.pump(3)  # their OpenCode installs
        if how in ("SIGTERM", "SIGHUP"):
            t.child.kill(signal.Signals[how])
        elif how == "ctrl-c":
            t.child.sendcontrol("c")
        else:
            t.child.send(how)
            t.wait_for(lambda s: "(y)" in s, 15, "the question")
            t.child.send("y")
        if how == "c":  # the batch is cancelled and its end stays on screen until `q`
            t.wait_for(lambda s: "failures in 4 of 4" in s, 150, "the cancelled batch's end")
            # The batch has returned once its summary (which counts the released ones) is said.
            t.wait_for(lambda s: "discarded" in s, 60, "the batch's summary with the warm counts")
            assert _pooled("local", test_owner) == []
            t.child.send("q")
        exited = t.exit_code(timeout=150)
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    assert exited == code, t.text()
    assert _pooled("local", test_owner) == []
