"""The commands as a script meets them: no full-screen app without a terminal, a closed pipe ends
quietly, a usage error is one line. Real processes on the recorded fixture runs; the terminal cases run
in a pseudo-terminal (pexpect), the screen read back through a terminal emulator (pyte)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pyte
import pytest

from opencode_tui_core.exit_codes import ExitCode

COLS, ROWS = 160, 45


def cli(
    *args: str, stdin=subprocess.DEVNULL, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``opencode-tui ARGS`` with stdin and stdout not a terminal; a hang fails on the timeout."""
    return subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", *args],
        stdin=stdin if input is None else None,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**env, "TERM": "xterm-256color"}


def test_runs_without_a_terminal_prints_the_table(fixture_runs: Path) -> None:
    r = cli("runs", "--runs-dir", str(fixture_runs))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["run", "task", "outcome"]
    assert "\x1b" not in r.stdout  # plain text, no escape codes
    body = "\n".join(lines[1:])
    assert "hello-file" in body and "scored" in body
    assert "oom" in body and "count_as_zero" in body and "provider_oom_killed" in body


def test_diff_without_a_terminal_prints_a_readable_diff(fixture_runs: Path) -> None:
    a, b = fixture_runs / "hello-file", fixture_runs / "oom"
    r = cli("diff", str(a), str(b))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    assert f"A: {a}" in r.stdout and f"B: {b}" in r.stdout
    assert "first divergence at step" in r.stdout
    assert "reward: 1 → 0" in r.stdout


@pytest.mark.parametrize(
    ("args", "hint"), [(["open", "{run}"], "export"), (["run", "hello-file"], "--batch")]
)
def test_app_commands_without_a_terminal_exit_2_with_one_line(fixture_runs: Path, args, hint) -> None:
    r = cli(*[a.format(run=fixture_runs / "oom") for a in args])
    assert r.returncode == ExitCode.USAGE, r.stderr
    assert r.stdout == ""
    last = r.stderr.splitlines()[-1]  # (run says first which bundled sample the name is)
    assert "needs a terminal" in last and hint in last
    assert sum("needs a terminal" in line for line in r.stderr.splitlines()) == 1


def test_bad_input_is_said_before_the_missing_terminal(fixture_runs: Path, tmp_path: Path) -> None:
    attempts = cli("run", "hello-file", "--attempts", "2", "--runs-dir", str(tmp_path / "runs"))
    assert attempts.returncode == ExitCode.USAGE and "--attempts applies to batches only" in attempts.stderr
    released = cli("attach", str(fixture_runs / "oom"))
    assert released.returncode == ExitCode.USAGE and "did not keep its sandbox" in released.stderr


@pytest.mark.slow
@pytest.mark.bwrap
def test_attach_without_a_terminal_takes_piped_commands_or_says_what_to_do(tmp_path: Path) -> None:
    """A kept local sandbox (a real run): commands piped in are run and their output printed; stdin
    from /dev/null (nothing to relay) is exit 2 with a one-line hint (it was exit 3, "Operation not
    permitted")."""
    runs = tmp_path / "runs"
    kept = cli(
        "run", "hello-file", "--batch", "--provider", "local", "--keep-sandbox", "--runs-dir", str(runs)
    )
    assert kept.returncode == 0, kept.stderr
    line = json.loads(kept.stdout.splitlines()[-1])
    try:
        nothing = cli("attach", line["run_dir"])
        assert nothing.returncode == ExitCode.USAGE, nothing.stderr
        assert len(nothing.stderr.splitlines()) == 1 and "pipe commands in" in nothing.stderr
        piped = cli("attach", line["run_dir"], stdin=None, timeout=120, input="echo piped-$((6*7)); exit\n")
        assert piped.returncode == 0, piped.stderr
        assert "piped-42" in piped.stdout
    finally:
        cli("sweep", line["sandbox_id"], "--provider", "local", "--kept")


def test_diff_in_a_terminal_redirected_to_a_file_writes_the_diff(fixture_runs: Path, tmp_path: Path) -> None:
    """stdin is a terminal, stdout a file: the diff goes to the file (the app did, and left it empty)."""
    out = tmp_path / "out.txt"
    a, b = fixture_runs / "hello-file", fixture_runs / "oom"
    cmd = f"{sys.executable} -m opencode_tui.cli diff {a} {b} > {out}"
    child = pexpect.spawn("/bin/sh", ["-c", cmd], dimensions=(ROWS, COLS), env=_env())
    child.expect(pexpect.EOF, timeout=60)
    child.close()
    assert child.exitstatus == 0
    assert "first divergence at step" in out.read_text()


def test_runs_on_a_terminal_still_opens_the_browser(fixture_runs: Path) -> None:
    screen = pyte.Screen(COLS, ROWS)
    stream = pyte.ByteStream(screen)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "opencode_tui.cli", "runs", "--runs-dir", str(fixture_runs)],
        dimensions=(ROWS, COLS),
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while "started (UTC)" not in "\n".join(screen.display):
            assert time.monotonic() < deadline, "\n".join(screen.display)
            try:
                stream.feed(child.read_nonblocking(1 << 16, timeout=0.2))
            except pexpect.TIMEOUT:
                pass
        child.send("q")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.parametrize(
    "args",
    [["runs", "--json", "--runs-dir", "{runs}"], ["runs", "--runs-dir", "{runs}"], ["--help"]],
)
def test_a_closed_pipe_ends_quietly(fixture_runs: Path, args) -> None:
    """The reader goes after one line (``| head -1``): no traceback, exit 141 (README's table)."""
    argv = [sys.executable, "-m", "opencode_tui.cli", *[a.format(runs=fixture_runs) for a in args]]
    # A pipe whose reader has closed before the writer starts: the first write fails at once.
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=write, stderr=subprocess.PIPE, timeout=60)
    os.close(write)
    assert proc.returncode == ExitCode.PIPE_CLOSED, proc.stderr.decode()
    assert proc.stderr == b""


def test_runs_json_piped_into_head(fixture_runs: Path) -> None:
    r = subprocess.run(
        f"{sys.executable} -m opencode_tui.cli runs --json --runs-dir {fixture_runs} | head -1; "
        'echo "exit=${PIPESTATUS[0]}" >&2',
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(r.stdout.splitlines()[0])["run_id"]
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] in ("exit=0", "exit=141")


def test_an_unknown_provider_is_one_line_naming_the_registered_ones() -> None:
    r = cli("run", "hello-file", "--batch", "--provider", "nosuch")
    assert r.returncode == ExitCode.USAGE
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert "'nosuch'" in r.stderr and all(name in r.stderr for name in ("docker", "local", "opensandbox"))


def test_help_does_not_load_the_provider_registry_or_pydantic() -> None:
    """What keeps start-up cheap (benchmarks/startup.py times it): the modules ``--help`` imports."""
    code = (
        "import sys, contextlib, io\n"
        "from opencode_tui import cli\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['--help'])\n"
        "print(' '.join(m for m in ('pydantic', 'opencode_tui_core.provider_registry', 'opencode_tui_core.config', 'yaml')"
        " if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""
