"""`opencode-tui rerun` and `fork` refuse bad input before anything starts (issue 28): one line on
stderr, exit 2, nothing on stdout, no new run directory, the parent's files untouched. The real CLI
in a subprocess, on a copy of a recorded run directory."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.artifacts import RunFiles

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "runs" / "hello-file"


def _tree(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def parent(tmp_path) -> Path:
    """A recorded run whose task is a copy of the hello-file sample (its hash as recorded)."""
    runs = tmp_path / "runs"
    run = runs / FIXTURE.name
    shutil.copytree(FIXTURE, run)
    task = tmp_path / "task"
    shutil.copytree(ROOT / "sample_tasks" / "hello-file", task)
    info = json.loads((run / RunFiles.RUN_INFO).read_text())
    info["task_dir"] = str(task)
    (run / RunFiles.RUN_INFO).write_text(json.dumps(info))
    return run


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )


def _refused(parent: Path, *args: str, says: str) -> None:
    before, listing = _tree(parent), sorted(p.name for p in parent.parent.iterdir())
    r = _cli(*args)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert says in r.stderr and r.stderr.startswith(f"opencode-tui {args[0]}: "), r.stderr
    assert _tree(parent) == before and sorted(p.name for p in parent.parent.iterdir()) == listing


@pytest.mark.parametrize("step", ["0", "3", "99"])
def test_fork_at_an_unknown_step_is_refused(parent, step):
    _refused(parent, "fork", str(parent), "--at", step, "--batch", says="fork at a step from 1 to 2")


@pytest.mark.parametrize("command", [["rerun"], ["fork", "--at", "1"]])
def test_a_run_dir_without_its_model_calls_is_refused(parent, command):
    (parent / RunFiles.MODEL_CALLS).unlink()
    _refused(parent, command[0], str(parent), *command[1:], "--batch", says="no model_calls.jsonl")


def test_a_directory_that_is_no_run_is_refused(tmp_path):
    (tmp_path / "runs" / "x").mkdir(parents=True)
    r = _cli("rerun", str(tmp_path / "runs" / "x"), "--batch")
    assert r.returncode == 2 and "not a run directory" in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_changed_task_is_refused(parent):
    info = json.loads((parent / RunFiles.RUN_INFO).read_text())
    info["task_hash"] = "0" * 64  # what the task was when it ran: not what it is now
    (parent / RunFiles.RUN_INFO).write_text(json.dumps(info))
    _refused(parent, "rerun", str(parent), "--batch", says="changed since")
