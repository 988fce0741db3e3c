"""`opencode-tui run` as a user runs it: a real subprocess, real sandboxes, real signals.

Bad input gets a one-line error and exit code 2; SIGINT at any phase still closes and releases the
sandbox and leaves a run directory that names the phase; `sweep` removes what a `kill -9` left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.events import Intervention, PhaseChanged

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
CLI = [sys.executable, "-m", "opencode_tui.cli"]


def run_cli(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def _containers(owner: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=opencode-tui.owner={owner}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.split()


@pytest.fixture
def task_copy(tmp_path):
    def make(name: str = "hello-file", **changes) -> Path:
        import shutil

        dest = tmp_path / f"task-{name}"
        shutil.copytree(SAMPLES / name, dest)
        data = yaml.safe_load((dest / "task.yaml").read_text())
        for key, value in changes.items():
            data[key] = value
        (dest / "task.yaml").write_text(yaml.safe_dump(data))
        return dest

    return make


# ---- bad input: one line, exit 2, nothing half-written ------------------------------------------


def _one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert r.stdout == ""


def test_missing_task_file(tmp_path):
    r = run_cli("run", str(tmp_path / "nope"), "--batch", "--runs-dir", str(tmp_path / "runs"))
    _one_line_error(r, "does not exist")
    assert not (tmp_path / "runs").exists()


def test_malformed_yaml(tmp_path):
    (tmp_path / "task.yaml").write_text("id: [unclosed\n")
    r = run_cli("run", str(tmp_path), "--batch", "--runs-dir", str(tmp_path / "runs"))
    _one_line_error(r, "not valid YAML")


def test_unknown_field_named(task_copy, tmp_path):
    task = task_copy(colour="red")
    r = run_cli("run", str(task), "--batch", "--runs-dir", str(tmp_path / "runs"))
    _one_line_error(r, "colour", "unknown field")


@pytest.mark.docker
def test_image_that_does_not_exist(task_copy, tmp_path):
    task = task_copy(image="opencode-tui/no-such-image:latest")
    r = run_cli("run", str(task), "--batch", "--provider", "docker", "--runs-dir", str(tmp_path / "runs"))
    _one_line_error(r, "opencode-tui/no-such-image:latest", "scripts/build-images")


def test_unreachable_model_url(task_copy, tmp_path):
    task = task_copy()
    r = run_cli(
        "run",
        str(task),
        "--batch",
        "--model-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        "--runs-dir",
        str(tmp_path / "runs"),
    )
    _one_line_error(r, "cannot reach --model-url", "127.0.0.1:9")


def test_several_tasks_without_a_terminal_need_batch(tmp_path):
    """(On a terminal, several tasks open the batch screen: tests/opencode_tui/test_tui_batch.py.)"""
    r = run_cli("run", str(SAMPLES / "hello-file"), str(SAMPLES / "fix-bug"))
    _one_line_error(r, "--batch")


def test_attempts_without_batch_refused(tmp_path):
    """The TUI runs one attempt: ``--attempts`` there is refused, not silently ignored."""
    r = run_cli("run", str(SAMPLES / "hello-file"), "--attempts", "2", "--runs-dir", str(tmp_path / "runs"))
    _one_line_error(r, "--attempts", "--batch")
    assert not (tmp_path / "runs").exists()


# ---- SIGINT at each phase -----------------------------------------------------------------------


def _wait_for_phase(runs: Path, phase: str, proc: subprocess.Popen, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        for events in runs.glob("*/events.jsonl"):
            # The run is live: its last line may be half written, which the tolerant reader passes over.
            for e in RunDirReader(events.parent, check=False).events(strict=False):
                if isinstance(e, PhaseChanged) and e.phase == phase:
                    return events.parent
        time.sleep(0.05)
    raise AssertionError(f"phase {phase} never reached")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize(
    ("phase", "sig", "code"),
    [
        ("install", signal.SIGINT, 130),
        ("agent", signal.SIGINT, 130),
        ("agent", signal.SIGTERM, 143),
        ("agent", signal.SIGHUP, 129),
        ("verification", signal.SIGTERM, 143),
    ],
)
def test_signal_closes_and_releases_at_any_phase(phase, sig, code, task_copy, tmp_path, test_owner):
    changes: dict = {}
    if phase == "agent":
        changes["problem_statement"] = "Wait."  # the trajectory below keeps the agent busy
    if phase == "verification":
        changes["verify"] = {"command": "sleep 60", "timeout": 120}
    task = task_copy(**changes)
    if phase == "agent":
        (task / "trajectory.yaml").write_text(
            yaml.safe_dump(
                {
                    "steps": [
                        {
                            "tool_calls": [
                                {"name": "bash", "arguments": {"command": "sleep 60", "description": "wait"}}
                            ]
                        },
                        {"text": "done"},
                    ]
                }
            )
        )
    config = tmp_path / "config.yaml"
    # A cold, private OpenCode cache makes the install phase long enough to interrupt.
    cache = tmp_path / "cache" if phase == "install" else None
    config.write_text(yaml.safe_dump({"runtime": {"cache_dir": str(cache)}} if cache else {}))
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [
            *CLI,
            "run",
            str(task),
            "--batch",
            "--provider",
            "docker",
            "--runs-dir",
            str(runs),
            "--config",
            str(config),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_dir = _wait_for_phase(runs, phase, proc)
        time.sleep(0.3)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert _containers(test_owner) == []
    info = json.loads((run_dir / RunFiles.RUN_INFO).read_text())
    assert info["outcome"]["failure_kind"] == "run_cancelled"
    events = [json.loads(line) for line in (run_dir / RunFiles.EVENTS).read_text().splitlines()]
    cancelled = [e for e in events if e["type"] == "failure" and e["failure"]["kind"] == "run_cancelled"][0]
    assert cancelled["failure"]["operation"] == f"{phase} phase"
    released = [e for e in events if e["type"] == "cleanup" and e["step"] == "sandbox_released"]
    assert released and released[-1]["state"] == "ok"
    line = json.loads(out.splitlines()[-1])
    assert (line["failure_kind"], line["cancelled_by"], line["exit_code"]) == (
        "run_cancelled",
        sig.name,
        code,
    )
    assert line["cleanup_confirmed"] is True
    assert sig.name in cancelled["failure"]["message"]


@pytest.mark.slow
@pytest.mark.docker
def test_sweep_removes_what_kill_9_left(task_copy, tmp_path, test_owner):
    task = task_copy()
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        [*CLI, "run", str(task), "--batch", "--provider", "docker", "--runs-dir", str(runs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for_phase(runs, "agent", proc)
    finally:
        proc.kill()
        proc.wait(30)
    assert _containers(test_owner), "kill -9 should have left the sandbox behind"
    dry = run_cli("sweep", "--provider", "docker", "--dry-run")
    assert dry.returncode == 0 and "would remove" in dry.stdout
    assert _containers(test_owner)
    r = run_cli("sweep", "--provider", "docker")
    assert r.returncode == 0, r.stderr
    assert _containers(test_owner) == []


# ---- the runs directory fails: one line, exit 3, the sandbox still closed ---------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real, tiny filesystem (tmpfs) to fill: needs root to mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounts: list[Path] = []

    def make(size: str, read_only: bool = False) -> Path:
        target = tmp_path / f"disk-{len(mounts)}"
        target.mkdir()
        opts = f"size={size}" + (",ro" if read_only else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(target)], check=True)
        mounts.append(target)
        return target

    yield make
    for m in mounts:
        subprocess.run(["umount", "-l", str(m)], check=False)


@pytest.mark.slow
@pytest.mark.bwrap
def test_runs_directory_full_is_one_line_exit_3_and_keeps_what_was_written(small_disk):
    runs = small_disk("600k")
    r = run_cli(
        "run",
        str(SAMPLES / "fix-bug"),
        "--batch",
        "--provider",
        "local",
        "--runs-dir",
        str(runs),
        timeout=300,
    )
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if "No space left on device" in line]
    assert len(said) == 1 and str(runs) in said[0], r.stderr
    line = json.loads(r.stdout.splitlines()[-1])
    assert line["failure_kind"] == "artifacts_write_failed" and line["artifacts_error"]
    assert line["cleanup_confirmed"] is True
    run_dir = Path(line["run_dir"])
    assert (run_dir / RunFiles.EVENTS).stat().st_size > 0, "what was written before the fault is kept"
    assert json.loads((run_dir / RunFiles.RUN_INFO).read_text())["run_id"] == line["run_id"]
    left = subprocess.run(["pgrep", "-af", line["run_id"]], capture_output=True, text=True).stdout
    assert [x for x in left.splitlines() if "pgrep" not in x] == []


@pytest.mark.slow
@pytest.mark.bwrap
def test_runs_directory_full_mid_batch_starts_nothing_more(small_disk):
    """Issue 19: once an episode's run directory stops taking writes, the batch starts no further
    episode (they are recorded as not started, for a resume) and still closes the running one."""
    runs = small_disk("600k")
    tasks = [str(SAMPLES / name) for name in ("fix-bug", "hello-file", "model-flaky-429")]
    r = run_cli(
        "run", *tasks, "--batch", "--jobs", "1", "--provider", "local", "--runs-dir", str(runs), timeout=300
    )
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["task_id"] for x in lines] == ["fix-bug", "hello-file", "model-flaky-429"]
    first, *rest = lines
    assert first["started"] and first["failure_kind"] == "artifacts_write_failed"
    assert first["cleanup_confirmed"] is True
    assert [(x["started"], x["failure_kind"], x["exit_code"]) for x in rest] == [
        (False, "artifacts_write_failed", 3)
    ] * 2


def test_read_only_runs_directory_starts_nothing(small_disk):
    runs = small_disk("1m", read_only=True)
    r = run_cli("run", str(SAMPLES / "hello-file"), "--batch", "--runs-dir", str(runs / "sub"))
    assert r.returncode == 3, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Read-only file system" in lines[0] and str(runs / "sub") in lines[0], r.stderr
    assert r.stdout == ""


def _wait_for_hold(runs: Path, proc: subprocess.Popen, timeout: float = 120) -> Path:
    """The run directory once the debugger holds a model call (its ``break`` intervention)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        for events in runs.glob("*/events.jsonl"):
            for e in RunDirReader(events.parent, check=False).events(strict=False):
                if isinstance(e, Intervention) and e.what == "break":
                    return events.parent
        time.sleep(0.05)
    raise AssertionError("no call was ever held")


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("held", [False, True], ids=["running", "held"])
def test_next_run_reports_what_a_kill_9_interrupted(task_copy, tmp_path, test_owner, held):
    """``held``: the controller dies while the debugger holds a model call (issue 27): handled like
    any killed controller (the next run says what was interrupted, sweep finds the sandbox), and the
    held run is not waited on (`ctl` says it is not live)."""
    task = task_copy()
    runs = tmp_path / "runs"
    breaks = ["--break", "call:2"] if held else []
    proc = subprocess.Popen(
        [*CLI, "run", str(task), "--batch", "--provider", "docker", "--runs-dir", str(runs), *breaks],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        run_dir = _wait_for_hold(runs, proc) if held else _wait_for_phase(runs, "agent", proc)
    finally:
        proc.kill()
        proc.wait(30)
    if held:
        # Nothing waits on the dead run: `ctl` says it is not live (one line, exit 2) at once.
        r = run_cli("ctl", str(run_dir), "status", timeout=30)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert json.loads((run_dir / RunFiles.RUN_INFO).read_text())["outcome"] is None
    r = run_cli(
        "run", str(SAMPLES / "hello-file"), "--batch", "--provider", "docker", "--runs-dir", str(runs)
    )
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if run_dir.name in line]
    assert len(said) == 1 and "interrupted during agent" in said[0] and "sweep --run" in said[0], r.stderr
    outcome = json.loads((run_dir / RunFiles.RUN_INFO).read_text())["outcome"]
    assert (outcome["action"], outcome["failure_kind"]) == ("keep_unknown", "run_interrupted")
    # Only SIGKILL leaves a sandbox behind, and sweep finds it.
    assert _containers(test_owner)
    assert run_cli("sweep", "--provider", "docker").returncode == 0
    assert _containers(test_owner) == []
