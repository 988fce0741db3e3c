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

    def __init__(self, args: list[str], cwd: Path, resizable: bool = False) -> None:
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        # COLUMNS/LINES pin Textual's size; without them it follows the terminal's (SIGWINCH).
        size = {} if resizable else {"COLUMNS": str(COLS), "LINES": str(ROWS)}
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "opencode_tui.cli", *args],
            cwd=str(cwd),
            dimensions=(ROWS, COLS),
            env={"TERM": "xterm-256color", **size, **_env()},
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


def test_a_shell_is_recorded_at_its_size_and_says_the_deadline_ended_it(tmp_path):
    """`s` at 160×48: shells/shell-1.cast opens at the shell pane's real size (it said 20×5), a resize
    of the terminal is an asciinema "r" event, and when the run's deadline kills the shell its title
    says so (it said "the shell exited")."""
    task = _busy_task(tmp_path)
    spec = yaml.safe_load((task / "task.yaml").read_text())
    (task / "task.yaml").write_text(yaml.safe_dump({**spec, "limits": {"run_s": 45}}))
    runs = tmp_path / "runs"
    t = Tui(["run", str(task), "--provider", "local", "--runs-dir", str(runs)], tmp_path, resizable=True)
    try:
        t.wait_for(lambda s: "sleep 60" in s, 120, "the agent's running command")
        t.child.send("s")
        t.wait_for(lambda s: "Shell in sandbox" in s and ":/app" in s, 60, "the shell's prompt")
        t.pump(1.0)
        t.child.setwinsize(30, 100)
        t.screen.resize(30, 100)
        t.pump(2.0)
        t.child.send("echo resized-$((6*7))\r")
        t.wait_for(lambda s: "resized-42" in s, 30, "the shell's output after the resize")
        t.wait_for(lambda s: "Shell closed" in s and "agent_timeout" in s, 90, "the deadline named")
        assert "Shell closed: the shell exited" not in t.text()
        deadline = time.monotonic() + 120
        while not any(json.loads(p.read_text()).get("outcome") for p in runs.glob("*/run.json")):
            assert time.monotonic() < deadline, "the run never ended"
            t.pump(0.5)
        t.child.send("\x1d")  # ctrl+]: back to the run, which has ended: q quits at once
        t.pump(1.0)
        t.child.send("q")
        t.exit_code()
    finally:
        if t.child.isalive():
            t.child.terminate(force=True)
    [cast] = list(runs.glob("*/shells/*.cast"))
    lines = [json.loads(line) for line in cast.read_text().splitlines()]
    header, frames = lines[0], lines[1:]
    # the pane is the screen less its title and the app's header/footer rows, never the 20×5 placeholder
    assert COLS - 4 <= header["width"] <= COLS and ROWS - 8 <= header["height"] < ROWS, header
    resizes = [f[2] for f in frames if f[1] == "r"]
    assert resizes and resizes[-1].split("x")[0] in {str(c) for c in range(96, 101)}, resizes
