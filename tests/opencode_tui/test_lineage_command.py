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

from opencode_tui_core.artifacts import RunFiles

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


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=timeout,
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


# -- several run directories with --batch: real children on the local provider -----------------------

FAMILY = ROOT / "tests" / "fixtures" / "lineage-runs" / "fix-bug-20261202-095618-65ebfb-a1"


def _fix_bug_parent(tmp_path: Path, name: str, *, fixed: bool = False) -> Path:
    """A recorded fix-bug run (local provider) under ``name``, its task a copy of fix-bug; ``fixed``:
    the bug fixed in the task since it ran (step 1's tests pass now: a rerun diverges at step 2)."""
    run = tmp_path / "runs" / name
    shutil.copytree(FAMILY, run)
    task = tmp_path / f"task-{name}"
    shutil.copytree(ROOT / "sample_tasks" / "fix-bug", task)
    if fixed:
        calc = task / "files" / "calc.py"
        calc.write_text(calc.read_text().replace("return a - b", "return a + b"))
    info = json.loads((run / RunFiles.RUN_INFO).read_text())
    info["task_dir"] = str(task)
    (run / RunFiles.RUN_INFO).write_text(json.dumps(info))
    return run


def _lines(r: subprocess.CompletedProcess[str]) -> list[dict]:
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.slow
def test_batch_rerun_of_several_runs_says_which_reproduced(tmp_path):
    same = _fix_bug_parent(tmp_path, "same")
    changed = _fix_bug_parent(tmp_path, "changed", fixed=True)
    r = _cli("rerun", str(same), str(changed), "--batch", "--allow-changed-task", timeout=240)
    lines = _lines(r)
    assert [line["lineage"] for line in lines] == ["rerun", "rerun"], r.stderr
    assert (lines[0]["reproduced"], lines[0]["divergence_step"], lines[0]["reward"]) == (True, None, 1.0)
    assert (lines[1]["reproduced"], lines[1]["divergence_step"]) == (False, 2)
    assert all(line["cleanup_confirmed"] for line in lines)
    # the batch's exit code is its worst episode's: the diverged rerun's, not 0
    assert r.returncode == lines[1]["exit_code"] != 0 and lines[0]["exit_code"] == 0
    assert all(Path(line["run_dir"]).parent == tmp_path / "runs" for line in lines)


@pytest.mark.slow
def test_batch_fork_of_several_runs(tmp_path):
    a, b = _fix_bug_parent(tmp_path, "a"), _fix_bug_parent(tmp_path, "b")
    r = _cli("fork", str(a), str(b), "--at", "2", "--batch", timeout=240)
    lines = _lines(r)
    assert r.returncode == 0 and len(lines) == 2, r.stderr
    for line in lines:
        assert (line["lineage"], line["fork_step"], line["reproduced"], line["divergence_step"]) == (
            "fork",
            2,
            None,
            None,
        )
        assert line["reward"] == 1.0 and line["cleanup_confirmed"]


def test_batch_with_one_bad_run_dir_starts_none(parent, tmp_path):
    (tmp_path / "runs" / "x").mkdir()
    listing = sorted(p.name for p in parent.parent.iterdir())
    r = _cli("rerun", str(parent), str(tmp_path / "runs" / "x"), "--batch")
    assert r.returncode == 2 and r.stdout == "" and "not a run directory" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in parent.parent.iterdir()) == listing
