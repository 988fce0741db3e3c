"""The debugger with the real `opencode-tui run --break` in a pseudo-terminal (pexpect, the screen read
back through pyte): `ctl` from a second process acts on the live TUI run and the TUI shows it; `q` while
a call is held releases it and still confirms cleanup. Real OpenCode, the scripted model, bubblewrap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.opencode_tui.test_tui_pty import Tui

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_tasks"
SAID = "A note from a second terminal: ORCA-42."


def _ctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", "ctl", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _start(tmp_path: Path) -> tuple[Tui, Path]:
    task = tmp_path / "fix-bug"
    shutil.copytree(SAMPLES / "fix-bug", task)
    runs = tmp_path / "runs"
    t = Tui(["run", str(task), "--provider", "local", "--runs-dir", str(runs), "--break", "call:2"], tmp_path)
    t.wait_for(lambda s: "HELD before call 2" in s, 120, "the break before call 2 in the header")
    return t, runs


def _run_json(runs: Path) -> dict:
    [info] = [json.loads(p.read_text()) for p in runs.glob("*/run.json")]
    return info


def test_ctl_from_a_second_process_acts_on_the_live_tui(tmp_path):
    t, runs = _start(tmp_path)
    try:
        [run_dir] = list(runs.iterdir())
        status = _ctl(str(run_dir), "status", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert "HELD before call 2" in status.stdout and "tools offered:" in status.stdout
        said = _ctl(str(run_dir), "say", SAID, cwd=tmp_path)
        assert said.returncode == 0 and "say: done (call 2 still held)" in said.stdout, said.stderr
        # the TUI shows the act: the run is marked in its header, still held
        t.wait_for(lambda s: "human intervened" in s and "HELD before call 2" in s, 30, "the say shown")
        went = _ctl(run_dir.name, "continue", "--runs-dir", str(runs), cwd=tmp_path)
        assert went.returncode == 0 and "continue: call 2" in went.stdout, went.stderr
        t.wait_for(lambda s: "HELD" not in s.splitlines()[0], 30, "the hold gone from the header")
        t.wait_for(lambda s: "✓ Sandbox released" in s, 180, "the run's end")
        late = _ctl(str(run_dir), "say", "too late", cwd=tmp_path)
        assert late.returncode == 2 and "not a live run" in late.stderr
        t.child.send("q")
        t.exit_code()
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    info = _run_json(runs)
    assert [(i["what"], i["who"]) for i in info["interventions"]] == [
        ("break", "engine"),
        ("say", "ctl"),
        ("continue", "ctl"),
    ]
    assert info["human_intervened"] is True and info["counts"]["cleanup_confirmed"] is True


@pytest.mark.parametrize("key", ["q", "c", "ctrl-c"])
def test_leaving_while_held_releases_the_call_and_confirms_cleanup(tmp_path, key):
    """q, c (each confirmed) and Ctrl-C while a call is held: the hold is released, cleanup confirmed."""
    t, runs = _start(tmp_path)
    try:
        if key == "ctrl-c":
            t.child.sendcontrol("c")
        else:
            t.child.send(key)
            t.wait_for(lambda s: "(y)" in s, 15, "the question")
            t.child.send("y")
        if key == "c":
            t.wait_for(lambda s: "✓ Sandbox released" in s, 90, "the cleanup confirmed")
            t.wait_for(lambda s: "HELD" not in s.splitlines()[0], 10, "the hold gone from the header")
            t.child.send("q")  # the episode has ended: q quits at once
        code = t.exit_code()
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    assert code == 130
    info = _run_json(runs)
    by = "Ctrl-C" if key == "ctrl-c" else "user"
    assert info["counts"]["cleanup_confirmed"] is True and info["counts"]["cancelled_by"] == by
    whats = [i["what"] for i in info["interventions"]]
    assert whats[0] == "break" and "release" in whats
    release = next(i for i in info["interventions"] if i["what"] == "release")
    assert release["call_number"] == 2 and "cancelled" in (release["text"] or "")
    assert not list(runs.glob("*/control.sock"))
