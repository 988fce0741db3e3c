"""The real `opencode-tui run` in a pseudo-terminal, driven by keystrokes as a person would (pexpect),
its screen read back through a terminal emulator (pyte). Real OpenCode, the scripted model, the local
bubblewrap sandbox: `c` `y`, `q` `y` and Ctrl-C each end with the four cleanup steps confirmed, a record
that names who cancelled, and exit code 130.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pexpect
import pyte
import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
COLS, ROWS = 160, 48
STEPS = ("Cleanup receipt", "Descendants drained", "Transcript snapshot", "Sandbox released")


class Tui:
    """A running `opencode-tui` process and the screen it draws."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "opencode_tui.cli", *args],
            cwd=str(cwd),
            dimensions=(ROWS, COLS),
            env={"TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS), **_env()},
        )

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def pump(self, seconds: float = 0.2) -> None:
        try:
            self.stream.feed(self.child.read_nonblocking(1 << 16, timeout=seconds))
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            raise AssertionError("the app exited early:\n" + self.text()) from None

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if predicate(self.text()):
                return
        raise AssertionError(f"never saw {what}; the screen:\n{self.text()}")

    def exit_code(self, timeout: float = 90) -> int:
        deadline = time.monotonic() + timeout
        while self.child.isalive() and time.monotonic() < deadline:
            try:
                self.stream.feed(self.child.read_nonblocking(1 << 16, timeout=0.2))
            except (pexpect.TIMEOUT, pexpect.EOF):
                pass
        self.child.close()
        return self.child.exitstatus


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def _busy_task(tmp_path: Path) -> Path:
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task)
    steps = [
        {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "echo started; sleep 60", "description": "Wait"}}
            ]
        },
        {"text": "done"},
    ]
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    return task


def _steps_confirmed(text: str) -> bool:
    return all(f"✓ {step}" in text for step in STEPS)


def _run_json(runs: Path) -> dict:
    [info] = [json.loads(p.read_text()) for p in runs.glob("*/run.json")]
    return info


@pytest.fixture
def tui(tmp_path):
    started: list[Tui] = []

    def start() -> tuple[Tui, Path]:
        runs = tmp_path / "runs"
        t = Tui(["run", str(_busy_task(tmp_path)), "--provider", "local", "--runs-dir", str(runs)], tmp_path)
        started.append(t)
        # The agent is mid-command: its output is on screen while the model calls are listed.
        t.wait_for(lambda s: "started" in s and "sleep 60" in s, 120, "the agent's running command")
        return t, runs

    yield start
    for t in started:
        if t.child.isalive():
            t.child.terminate(force=True)


@pytest.mark.parametrize("key", ["c", "q"])
def test_cancel_key_then_yes_confirms_the_four_cleanup_steps(tui, key):
    t, runs = tui()
    t.child.send(key)
    t.wait_for(lambda s: "(y)" in s, 15, "the confirmation dialog")
    t.child.send("y")
    if key == "c":
        t.wait_for(_steps_confirmed, 90, "the four cleanup steps confirmed")
        t.child.send("q")  # the episode has ended: q quits at once
    code = t.exit_code()
    assert code == 130
    info = _run_json(runs)
    assert info["outcome"]["failure_kind"] == "run_cancelled"
    assert info["counts"]["cleanup_confirmed"] is True and info["counts"]["cleanup_proof"] == "receipt"
    assert info["counts"]["cancelled_by"] == "user"


def test_ctrl_c_keystroke_is_a_graceful_close(tui):
    t, runs = tui()
    t.child.sendcontrol("c")
    code = t.exit_code()
    assert code == 130
    info = _run_json(runs)
    assert info["outcome"]["failure_kind"] == "run_cancelled"
    assert info["counts"]["cleanup_confirmed"] is True
    assert info["counts"]["cancelled_by"] == "Ctrl-C"
    events = [json.loads(line) for line in next(runs.glob("*/events.jsonl")).read_text().splitlines()]
    steps = {e["step"]: e["state"] for e in events if e["type"] == "cleanup"}
    assert steps == {
        "receipt": "ok",
        "descendants": "ok",
        "transcript_snapshot": "ok",
        "sandbox_released": "ok",
    }
