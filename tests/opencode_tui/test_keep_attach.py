"""Keep and come back: `attach` to a kept sandbox after its run exited; `sweep` by id, by run, and
never another live job's sandbox. Real `opencode-tui` processes, real Docker, real bwrap, a real
pseudo-terminal (pexpect) for the shell.

Every test gets its own ``XDG_STATE_HOME`` (local state dirs and the kept list), so nothing here
sees another test's sandboxes; the session's owner label is shared (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest
import yaml

from opencode_tui_core.artifacts import RunFiles

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
CLI = [sys.executable, "-m", "opencode_tui.cli"]


@pytest.fixture
def env(tmp_path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    yield env
    # Whatever a failed test kept or left behind (its own state dir only).
    subprocess.run(
        [*CLI, "sweep", "--kept", "--provider", "local"], env=env, capture_output=True, timeout=120
    )


def cli(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def run_kept(env, tmp_path, provider: str, *extra: str) -> dict:
    runs = tmp_path / "runs"
    r = cli(
        env,
        "run",
        str(SAMPLES / "hello-file"),
        "--batch",
        "--provider",
        provider,
        "--runs-dir",
        str(runs),
        *extra,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def shell_roundtrip(env, target: str) -> str:
    """`opencode-tui attach TARGET` in a pty: type a command, read its output back, exit."""
    child = pexpect.spawn(CLI[0], [*CLI[1:], "attach", target], env=env, timeout=60, encoding="utf-8")
    try:
        child.expect("attached to")
        child.sendline("id -u; cat hello.txt; echo MA''RK")
        child.expect("MARK")
        seen = child.before
        child.sendline("exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, seen
    return seen


def _containers(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True, timeout=30
    )
    return out.stdout.split()


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_attach_to_a_kept_local_sandbox_after_the_run_exited(env, tmp_path):
    line = run_kept(env, tmp_path, "local", "--keep-sandbox")
    sid, run_dir = line["sandbox_id"], line["run_dir"]
    assert line["sandbox_kept"] is True
    info = json.loads((Path(run_dir) / RunFiles.RUN_INFO).read_text())
    assert (info["provider"], info["sandbox_id"], info["sandbox_kept"]) == ("local", sid, True)
    state_dir = tmp_path / "state" / "opencode-tui" / "local" / sid
    keeper = json.loads((state_dir / "sandbox.json").read_text())["keeper"]
    # The run's process has exited, and the sandbox's pid 1 still lives (the holder was told to keep).
    assert _pid_alive(keeper["pid"])

    seen = shell_roundtrip(env, run_dir)
    assert f"\r{os.getuid()}\r\n" in seen and "Hello from OpenCode" in seen
    seen = shell_roundtrip(env, sid)  # by id as well
    assert "Hello from OpenCode" in seen
    # Input from a pipe, without an `exit`: when it ends, the shell ends after running it.
    piped = subprocess.run(
        [*CLI, "attach", sid], input="echo PIPED''-OK", capture_output=True, text=True, env=env, timeout=60
    )
    assert piped.returncode == 0 and "PIPED-OK" in piped.stdout, (piped.stdout, piped.stderr)
    # Both shells are recorded in the run directory, post-mortem: they mark nothing.
    events = [json.loads(x) for x in (Path(run_dir) / RunFiles.EVENTS).read_text().splitlines()]
    opened = [e for e in events if e["type"] == "shell_opened"]
    assert [(e["shell"], e["phase"], e["marks_sample"]) for e in opened] == [
        (1, "done", False),
        (2, "done", False),
        (3, "done", False),
    ]
    assert len([e for e in events if e["type"] == "shell_closed"]) == 3
    assert "MARK" in (Path(run_dir) / opened[0]["cast"]).read_text()
    assert json.loads((Path(run_dir) / RunFiles.RUN_INFO).read_text())["human_intervened"] is False

    # A bare sweep leaves a kept sandbox alone; naming it removes exactly it.
    r = cli(env, "sweep", "--provider", "local")
    assert r.returncode == 0 and r.stdout == "" and "1 kept" in r.stderr, r.stderr
    assert state_dir.exists()
    r = cli(env, "sweep", "--provider", "local", "--dry-run", "--kept")
    assert json.loads(r.stdout)["sandbox_id"] == sid
    r = cli(env, "sweep", sid, "--provider", "local")
    assert r.returncode == 0, r.stderr
    # Every line names the sandbox's batch (the one on the run's result line).
    assert line["batch_id"].startswith("b")
    assert json.loads(r.stdout) == {
        "provider": "local",
        "sandbox_id": sid,
        "action": "removed",
        "batch_id": line["batch_id"],
    }
    assert not state_dir.exists()
    deadline = time.monotonic() + 10
    while _pid_alive(keeper["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pid_alive(keeper["pid"])

    # Now released: attach says so in one line and touches nothing.
    one_line_error(cli(env, "attach", run_dir), sid, "no longer exists")
    one_line_error(cli(env, "attach", sid), sid, "neither a run directory nor a kept sandbox")
    one_line_error(cli(env, "sweep", sid, "--provider", "local"), sid, "not a sandbox of ours")


@pytest.mark.slow
@pytest.mark.docker
def test_attach_to_a_kept_docker_sandbox_and_sweep_its_run(env, tmp_path, test_owner):
    line = run_kept(env, tmp_path, "docker", "--keep-sandbox")
    sid, run_id = line["sandbox_id"], line["run_id"]
    try:
        assert _containers(f"opencode-tui.run={run_id}") == [sid[:12]]
        seen = shell_roundtrip(env, sid[:12])
        assert "\r0\r\n" in seen and "Hello from OpenCode" in seen
        r = cli(env, "sweep", "--provider", "docker")
        assert sid not in r.stdout and "1 kept" in r.stderr, r.stderr
        r = cli(env, "sweep", "--provider", "docker", "--run", run_id)
        assert r.returncode == 0, r.stderr
        assert [json.loads(x)["sandbox_id"] for x in r.stdout.splitlines()] == [sid]
        assert _containers(f"opencode-tui.run={run_id}") == []
        one_line_error(cli(env, "attach", line["run_dir"]), sid, "no longer exists")
    finally:
        subprocess.run(["docker", "rm", "-f", sid], capture_output=True, timeout=60)


@pytest.mark.slow
@pytest.mark.docker
def test_attach_to_a_released_sandbox_and_garbage(env, tmp_path):
    line = run_kept(env, tmp_path, "docker")
    assert line["sandbox_kept"] is False
    one_line_error(cli(env, "attach", line["run_dir"]), "did not keep its sandbox", "--keep-sandbox")
    one_line_error(cli(env, "attach", line["sandbox_id"]), "neither a run directory nor a kept sandbox")
    one_line_error(cli(env, "attach", str(tmp_path)), "is not a run directory")
    one_line_error(cli(env, "sweep", line["sandbox_id"], "--provider", "docker"), "not a sandbox of ours")
    one_line_error(cli(env, "sweep", "--run", "no-such-run", "--provider", "docker"), "no-such-run")


@pytest.mark.slow
def test_sweep_never_removes_a_live_jobs_sandbox(env, tmp_path):
    """Two real `run --batch` invocations share one owner label; `sweep` from a third process removes
    neither while they run, and after one is SIGKILLed removes exactly what it left."""
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "timeout", task)
    data = yaml.safe_load((task / "task.yaml").read_text())
    data["limits"]["run_s"] = 90
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    base = tmp_path / "state" / "opencode-tui" / "local"
    procs, runs = [], []
    for n in range(2):
        runs.append(tmp_path / f"runs{n}")
        procs.append(
            subprocess.Popen(
                [*CLI, "run", str(task), "--batch", "--provider", "local", "--runs-dir", str(runs[n])],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        )
    try:
        sids = [_sandbox_in_agent_phase(r, p) for r, p in zip(runs, procs, strict=True)]
        r = cli(env, "sweep", "--provider", "local")
        assert r.returncode == 0 and r.stdout == "", r.stdout
        assert "left 2 of live jobs" in r.stderr, r.stderr
        assert all((base / sid).exists() for sid in sids)

        procs[0].kill()
        procs[0].wait(30)
        keeper = json.loads((base / sids[0] / "sandbox.json").read_text())["keeper"]
        deadline = time.monotonic() + 10  # the holder ends the sandbox once the engine's pipe closes
        while _pid_alive(keeper["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pid_alive(keeper["pid"]), "a sandbox that was not kept must die with its engine"

        r = cli(env, "sweep", "--provider", "local", "--dry-run")
        assert [json.loads(x)["sandbox_id"] for x in r.stdout.splitlines()] == [sids[0]]
        r = cli(env, "sweep", "--provider", "local")
        assert [json.loads(x)["sandbox_id"] for x in r.stdout.splitlines()] == [sids[0]], r.stderr
        assert not (base / sids[0]).exists() and (base / sids[1]).exists()
        assert procs[1].poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(120)
    assert procs[1].returncode == 143
    assert not (base / sids[1]).exists()


def _sandbox_in_agent_phase(runs: Path, proc: subprocess.Popen, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        for events in runs.glob("*/events.jsonl"):
            lines = [json.loads(x) for x in events.read_text().splitlines() if x.strip()]
            if any(e["type"] == "phase" and e["phase"] == "agent" for e in lines):
                return json.loads((events.parent / RunFiles.RUN_INFO).read_text())["sandbox_id"]
        time.sleep(0.05)
    raise AssertionError("the agent phase was never reached")
