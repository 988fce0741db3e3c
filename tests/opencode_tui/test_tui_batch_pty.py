"""Ctrl-C (and SIGTERM) on the batch screen of the real `opencode-tui run TASK TASK TASK --jobs 2` in a
pseudo-terminal (pexpect, the screen read back through pyte): the batch is cancelled the way SIGINT
cancels --batch, every running episode is closed with its cleanup confirmed, the queued one is not
started, exit 130 (143)."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.exit_codes import ExitCode
from tests.opencode_tui.test_tui_pty import Tui

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def _busy(tmp_path: Path, name: str) -> Path:
    task = tmp_path / name
    shutil.copytree(SAMPLES / "hello-file", task)
    steps = [
        {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "echo started; sleep 120", "description": "Wait"}}
            ]
        },
        {"text": "done"},
    ]
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    spec = yaml.safe_load((task / "task.yaml").read_text())
    (task / "task.yaml").write_text(yaml.safe_dump({**spec, "id": name}))
    return task


@pytest.mark.parametrize(
    ("how", "by", "code"),
    [
        ("ctrl-c", "Ctrl-C", ExitCode.INTERRUPTED),
        ("SIGTERM", "SIGTERM", ExitCode.TERMINATED),
        ("SIGHUP", "SIGHUP", ExitCode.HANGUP),
    ],
)
def test_ctrl_c_on_the_batch_screen_closes_every_running_episode_exit_130(
    tmp_path: Path, how: str, by: str, code: int
) -> None:
    """Ctrl-C (the key) → 130; SIGTERM from outside → 143; SIGHUP (the terminal closed) → 129: the
    same close every way."""
    runs = tmp_path / "runs"
    tasks = [_busy(tmp_path, n) for n in ("busy-a", "busy-b", "busy-c")]
    t = Tui(
        ["run", *map(str, tasks), "--jobs", "2", "--provider", "local", "--runs-dir", str(runs)], tmp_path
    )
    try:
        t.wait_for(lambda s: "running 2" in s and "queued 1" in s, 90, "two running, one queued")
        t.wait_for(lambda s: s.count(" agent ") >= 2, 90, "both running attempts in their agent phase")
        if how == "ctrl-c":
            t.child.sendcontrol("c")
        else:
            t.child.kill(signal.Signals[how])
        exited = t.exit_code(timeout=120)
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    assert exited == code and ExitCode.INTERRUPTED == 130, t.text()
    infos = [json.loads(p.read_text()) for p in runs.glob("*/run.json")]
    assert len(infos) == 2  # the queued task never started: no run directory
    for info in infos:
        assert info["outcome"]["failure_kind"] == "run_cancelled", info["outcome"]
        assert info["counts"]["cleanup_confirmed"] is True
    results = [json.loads(line) for line in (runs / "results.jsonl").read_text().splitlines()]
    assert sorted((r["task_id"], r["started"]) for r in results) == [
        ("busy-a", True),
        ("busy-b", True),
        ("busy-c", False),
    ]
    assert all(r["cleanup_confirmed"] for r in results if r["started"])
    assert {r["cancelled_by"] for r in results} == {by}
