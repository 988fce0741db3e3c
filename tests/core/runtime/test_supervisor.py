"""The process supervisor and its launch/stop scripts, run for real on this host (Linux only)."""

from __future__ import annotations

import ast
import json
import logging
import os
import py_compile
import selectors
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from opencode_tui_core.runtime import supervisor_client as sc
from opencode_tui_core.runtime.supervisor_client import (
    CleanupReceipt,
    ReceiptError,
    budgets,
    confirmed,
    launch_script,
    parse_receipt,
    remove_session_dir_script,
    stop_script,
)

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the supervisor is Linux only"),
    pytest.mark.timeout(60),
]

SUPERVISOR = sc.SUPERVISOR_SOURCE_PATH
PY = sys.executable


def _pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.02)
    return False


def _wait_for(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear within {timeout}s")


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run_supervisor(
    tmp_path: Path,
    harness: list[str],
    *,
    timeout: float = 10.0,
    cleanup_timeout: float = 2.0,
    preserve: bool = False,
    python: str = PY,
    clock: tuple[Path, float] | None = None,
) -> tuple[subprocess.CompletedProcess[str], dict]:
    receipt = tmp_path / "cleanup.json"
    argv = [
        python,
        "-I",
        str(SUPERVISOR),
        "--timeout",
        str(timeout),
        "--cleanup-timeout",
        str(cleanup_timeout),
        "--stop-file",
        str(tmp_path / "stop.request"),
        "--receipt",
        str(receipt),
    ]
    if preserve:
        argv.append("--preserve-descendants-on-success")
    if clock is not None:
        argv += ["--clock-file", str(clock[0]), "--clock-wait", str(clock[1])]
    proc = subprocess.run([*argv, "--", *harness], capture_output=True, text=True, timeout=30)
    return proc, json.loads(receipt.read_text())


def _python_harness(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "harness.py"
    script.write_text(textwrap.dedent(body))
    return [PY, str(script)]


def _double_fork_harness(tmp_path: Path, pid_file: Path, exit_code: int = 0) -> list[str]:
    return _python_harness(
        tmp_path,
        f"""
        import os, sys
        child = os.fork()
        if child == 0:
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                fd = os.open(os.devnull, os.O_RDWR)
                for n in (0, 1, 2):
                    os.dup2(fd, n)
                os.execvp("sleep", ["sleep", "1000"])
            with open({str(pid_file)!r}, "w") as f:
                f.write(str(grandchild))
            os._exit(0)
        os.waitpid(child, 0)
        sys.exit({exit_code})
        """,
    )


# --- the supervisor itself -------------------------------------------------------------------------


def test_double_forked_detached_descendant_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "sleep.pid"
    proc, receipt = _run_supervisor(tmp_path, _double_fork_harness(tmp_path, pid_file))
    sleep_pid = int(pid_file.read_text())
    try:
        assert proc.returncode == 0, proc.stderr
        assert receipt == {
            "cleanup_confirmed": True,
            "return_code": 0,
            "timed_out": False,
            "error": None,
            "descendants_killed": 1,
            "signal": None,
        }
        assert not Path(f"/proc/{sleep_pid}").exists()
    finally:
        _kill_quietly(sleep_pid)


def test_harness_ignoring_term_is_killed_after_grace(tmp_path: Path) -> None:
    start = time.monotonic()
    proc, receipt = _run_supervisor(
        tmp_path, ["/bin/sh", "-c", "trap '' TERM; sleep 1000"], timeout=0.3, cleanup_timeout=0.5
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    assert receipt["cleanup_confirmed"] is True
    assert receipt["timed_out"] is True
    assert receipt["return_code"] is None
    assert receipt["signal"] == signal.SIGKILL
    assert elapsed < 5
    assert "supervisor: " in proc.stderr


def test_deadline_overrun_terminates_with_signal(tmp_path: Path) -> None:
    proc, receipt = _run_supervisor(tmp_path, ["sleep", "1000"], timeout=0.3, cleanup_timeout=2)
    assert proc.returncode == 0, proc.stderr
    assert receipt["timed_out"] is True
    assert receipt["return_code"] is None
    assert receipt["signal"] == signal.SIGTERM
    assert receipt["cleanup_confirmed"] is True


def test_a_clock_file_starts_the_run_deadline_when_it_appears(tmp_path: Path) -> None:
    """A harness started ahead of its task (issue 31): the 1 s run deadline does not run while it
    waits, only from the clock file's appearance (here after 1.5 s, by the harness itself)."""
    go = tmp_path / "go"
    harness = ["/bin/sh", "-c", f"sleep 1.5; : > {go}; sleep 0.6; echo finished"]
    proc, receipt = _run_supervisor(tmp_path, harness, timeout=1.0, clock=(go, 30.0))
    assert receipt["timed_out"] is False and receipt["return_code"] == 0, (receipt, proc.stderr)
    assert "finished" in proc.stdout
    # ... and from then on it runs as usual: 1 s after the file, a harness still running is stopped.
    go.unlink()
    start = time.monotonic()
    harness = ["/bin/sh", "-c", f"sleep 0.5; : > {go}; sleep 1000"]
    proc, receipt = _run_supervisor(tmp_path, harness, timeout=1.0, clock=(go, 30.0))
    assert receipt["timed_out"] is True and receipt["signal"] == signal.SIGTERM, receipt
    assert 1.4 <= time.monotonic() - start < 10


def test_a_clock_file_that_never_appears_stops_the_harness_at_the_wait_cap(tmp_path: Path) -> None:
    start = time.monotonic()
    proc, receipt = _run_supervisor(tmp_path, ["sleep", "1000"], timeout=100.0, clock=(tmp_path / "go", 0.5))
    assert receipt["cleanup_confirmed"] is True and receipt["timed_out"] is False, receipt
    assert receipt["signal"] == signal.SIGTERM
    assert "not started within 0.5s of waiting" in proc.stderr
    assert time.monotonic() - start < 10


def test_harness_exit_status_is_reported(tmp_path: Path) -> None:
    proc, receipt = _run_supervisor(tmp_path, ["/bin/sh", "-c", "echo out; echo err >&2; exit 7"])
    assert proc.returncode == 0  # the harness's failure is the receipt's business, not the supervisor's
    assert proc.stdout == "out\n"
    assert "err" in proc.stderr
    assert receipt["return_code"] == 7
    assert receipt["signal"] is None
    assert receipt["timed_out"] is False


def test_stop_file_before_launch_never_starts_harness(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "stop.request").touch()
    proc, receipt = _run_supervisor(tmp_path, ["/bin/sh", "-c", f"touch {marker}"])
    assert proc.returncode == 0, proc.stderr
    assert receipt["cleanup_confirmed"] is True
    assert receipt["return_code"] is None
    assert receipt["error"] is None
    assert not marker.exists()


def test_term_to_supervisor_stops_harness_without_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "harness.pid"
    receipt_path = tmp_path / "cleanup.json"
    sup = subprocess.Popen(
        [
            PY,
            "-I",
            str(SUPERVISOR),
            "--timeout",
            "30",
            "--cleanup-timeout",
            "2",
            "--stop-file",
            str(tmp_path / "stop.request"),
            "--receipt",
            str(receipt_path),
            "--",
            "/bin/sh",
            "-c",
            f"echo $$ > {pid_file}; exec sleep 1000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    harness_pid = int(_wait_for(pid_file))
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=10) == 0
    receipt = json.loads(receipt_path.read_text())
    assert receipt["cleanup_confirmed"] is True
    assert receipt["timed_out"] is False
    assert receipt["signal"] == signal.SIGTERM
    assert _wait_gone(harness_pid)


def test_launch_failure_is_confirmed_with_error(tmp_path: Path) -> None:
    proc, receipt = _run_supervisor(tmp_path, [str(tmp_path / "does-not-exist")])
    assert proc.returncode == 1
    assert receipt["cleanup_confirmed"] is True
    assert receipt["return_code"] is None
    assert receipt["error"].startswith("launch: ")
    assert "supervisor: launch: " in proc.stderr


def test_preserve_descendants_only_on_clean_success(tmp_path: Path) -> None:
    kept = tmp_path / "kept.pid"
    proc, receipt = _run_supervisor(tmp_path, _double_fork_harness(tmp_path, kept), preserve=True)
    kept_pid = int(kept.read_text())
    try:
        assert proc.returncode == 0, proc.stderr
        assert receipt["cleanup_confirmed"] is True
        assert receipt["descendants_killed"] == 0
        assert _pid_alive(kept_pid)
    finally:
        _kill_quietly(kept_pid)

    drained = tmp_path / "drained.pid"
    proc, receipt = _run_supervisor(
        tmp_path, _double_fork_harness(tmp_path, drained, exit_code=1), preserve=True
    )
    drained_pid = int(drained.read_text())
    try:
        assert receipt["return_code"] == 1
        assert receipt["descendants_killed"] == 1
        assert not Path(f"/proc/{drained_pid}").exists()
    finally:
        _kill_quietly(drained_pid)


def test_receipt_is_written_atomically_without_leftovers(tmp_path: Path) -> None:
    _run_supervisor(tmp_path, ["true"])
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


# --- compatibility: the sandbox may only have an old python3 --------------------------------------


def test_supervisor_is_stdlib_only_and_python38_syntax(tmp_path: Path) -> None:
    source = SUPERVISOR.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    py_compile.compile(str(SUPERVISOR), cfile=str(tmp_path / "supervisor.pyc"), doraise=True)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)
    for banned in ("removeprefix", "removesuffix", "waitstatus_to_exitcode", "pidfd_open"):
        assert banned not in source


def _old_python() -> str | None:
    """A real Python 3.8 interpreter, if this host has one (pyenv shims may exist without one)."""
    for candidate in ("/root/.pyenv/versions/3.8.18/bin/python3.8", "python3.8"):
        found = shutil.which(candidate)
        if not found:
            continue
        probe = subprocess.run(
            [found, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 8)":
            return found
    return None


_PYTHON38 = _old_python()


@pytest.mark.skipif(_PYTHON38 is None, reason="no python3.8 on this host")
def test_supervisor_runs_on_python38(tmp_path: Path) -> None:
    python = _PYTHON38
    assert python is not None
    check = subprocess.run([python, "-I", str(SUPERVISOR), "--help"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    pid_file = tmp_path / "sleep.pid"
    proc, receipt = _run_supervisor(tmp_path, _double_fork_harness(tmp_path, pid_file), python=python)
    sleep_pid = int(pid_file.read_text())
    try:
        assert proc.returncode == 0, proc.stderr
        assert receipt["cleanup_confirmed"] is True
        assert receipt["descendants_killed"] == 1
        assert not Path(f"/proc/{sleep_pid}").exists()
    finally:
        _kill_quietly(sleep_pid)


# --- launch / stop scripts -------------------------------------------------------------------------


@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "session"
    directory.mkdir()
    shutil.copyfile(SUPERVISOR, directory / sc.SUPERVISOR_FILE)  # what staging uploads
    return directory


def _launch(
    session: Path, harness: list[str], timeout: float = 20, cleanup: float = 1, python: str = PY, **kw
) -> subprocess.Popen:
    argv = launch_script(str(session), python, harness, timeout, cleanup, **kw)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stop(session: Path, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        stop_script(str(session), timeout), capture_output=True, text=True, timeout=timeout + 5
    )


def _read_line(stream, timeout: float) -> bytes:
    """Read one line from a pipe without blocking past timeout."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                raise AssertionError(f"no complete line within {timeout}s (got {data!r})")
            chunk = os.read(stream.fileno(), 1)
            if not chunk:
                raise AssertionError(f"EOF before a complete line (got {data!r})")
            data += chunk
    finally:
        sel.close()
    return data


def test_stop_first_fences_a_later_launch(session_dir: Path) -> None:
    marker = session_dir / "ran"
    stop = _stop(session_dir)
    assert stop.returncode == 0, stop.stderr
    receipt = parse_receipt(stop.stdout)
    assert confirmed(receipt)
    assert receipt.return_code is None and receipt.error is None and receipt.timed_out is False
    assert os.readlink(session_dir / sc.CLAIM_FILE) == sc.CLAIM_STOP

    launch = _launch(session_dir, ["/bin/sh", "-c", f"touch {marker}"])
    out, err = launch.communicate(timeout=10)
    assert launch.returncode == 0, err
    assert out == b""
    assert not marker.exists()
    assert not (session_dir / sc.PID_FILE).exists()

    again = _stop(session_dir)  # idempotent: the confirmed receipt is reused
    assert again.returncode == 0
    assert parse_receipt(again.stdout) == receipt


def test_stop_during_running_launch_confirms_and_kills(session_dir: Path) -> None:
    pid_file = session_dir / "harness.pid"
    launch = _launch(
        session_dir,
        ["/bin/sh", "-c", f"echo $$ > {pid_file}; echo ready; trap '' TERM; sleep 1000"],
        cleanup=0.5,
    )
    try:
        assert _read_line(launch.stdout, 10) == b"ready\n"
        harness_pid = int(pid_file.read_text())
        assert os.readlink(session_dir / sc.CLAIM_FILE) == sc.CLAIM_LAUNCH
        assert (
            int((session_dir / sc.PID_FILE).read_text().split()[0]) == launch.pid
        )  # exec kept the shell pid

        stop = _stop(session_dir, timeout=10)
        assert stop.returncode == 0, stop.stderr
        receipt = parse_receipt(stop.stdout)
        assert receipt.cleanup_confirmed is True
        assert receipt.timed_out is False
        assert receipt.signal == signal.SIGKILL  # it ignored TERM
        assert launch.wait(timeout=10) == 0
        assert not _pid_alive(harness_pid)
        assert (session_dir / sc.STOP_FILE).exists()
        assert "stop requested" in (session_dir / sc.OUTPUT_LOG).read_text()
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()


def test_harness_stdout_streams_before_exit(session_dir: Path) -> None:
    (session_dir / "prompt.txt").write_text("the prompt\n")
    launch = _launch(
        session_dir,
        ["/bin/sh", "-c", 'read line; echo "got $line"; sleep 3; echo done'],
        stdin_file="prompt.txt",
    )
    try:
        assert _read_line(launch.stdout, 10) == b"got the prompt\n"
        got_at = time.monotonic()
        assert launch.poll() is None  # the harness is still running
        assert _read_line(launch.stdout, 10) == b"done\n"
        # Streamed, not handed over at exit: the first line came out a whole `sleep 3` before the last.
        assert time.monotonic() - got_at >= 2.0
        assert launch.wait(timeout=10) == 0
        receipt = parse_receipt((session_dir / sc.RECEIPT_FILE).read_text())
        assert receipt.return_code == 0
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()


def test_launch_timeout_through_script(session_dir: Path) -> None:
    launch = _launch(session_dir, ["sleep", "1000"], timeout=0.3, cleanup=1)
    _out, err = launch.communicate(timeout=10)
    assert launch.returncode == 0, err
    receipt = parse_receipt((session_dir / sc.RECEIPT_FILE).read_text())
    assert receipt.timed_out is True and receipt.signal == signal.SIGTERM
    # A stop after completion just reports the existing receipt.
    stop = _stop(session_dir)
    assert stop.returncode == 0 and parse_receipt(stop.stdout) == receipt


def test_bootstrap_failure_exits_127_without_claim(session_dir: Path) -> None:
    launch = _launch(session_dir, ["true"], python="/nonexistent/bin/python3")
    _out, err = launch.communicate(timeout=10)
    assert launch.returncode == sc.BOOTSTRAP_EXIT_CODE
    text = err.decode()
    assert "Preinstall python3" in text and "/nonexistent/bin/python3" in text
    assert not (session_dir / sc.CLAIM_FILE).exists() and not (session_dir / sc.CLAIM_FILE).is_symlink()
    assert not (session_dir / sc.RECEIPT_FILE).exists()
    # With no launch claimed, a stop fences it and confirms at once.
    stop = _stop(session_dir)
    assert stop.returncode == 0 and confirmed(parse_receipt(stop.stdout))


def test_launch_without_session_dir_exits_quietly(tmp_path: Path) -> None:
    proc = subprocess.run(launch_script(str(tmp_path / "missing"), PY, ["true"], 10, 1), capture_output=True)
    assert proc.returncode == 0 and proc.stdout == b"" and proc.stderr == b""


def test_stop_without_receipt_times_out_with_exit_3(session_dir: Path) -> None:
    # A launch claimed but no supervisor ever produced a receipt: cleanup cannot be confirmed.
    os.symlink(sc.CLAIM_LAUNCH, session_dir / sc.CLAIM_FILE)
    start = time.monotonic()
    stop = _stop(session_dir, timeout=0.6)
    assert stop.returncode == sc.STOP_UNCONFIRMED_EXIT_CODE
    assert "launch outcome is unknown" in stop.stderr
    assert time.monotonic() - start < 5
    with pytest.raises(ReceiptError):
        parse_receipt(stop.stdout)


def test_remove_session_dir(tmp_path: Path, session_dir: Path) -> None:
    (session_dir / "sub").mkdir()
    (session_dir / "sub" / "file").write_text("x")
    stale = Path(f"{session_dir}.closed")
    stale.mkdir()  # left by an interrupted earlier removal
    proc = subprocess.run(remove_session_dir_script(str(session_dir)), capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert not session_dir.exists() and not stale.exists()
    again = subprocess.run(remove_session_dir_script(str(session_dir)), capture_output=True)
    assert again.returncode == 0


def test_scripts_quote_hostile_paths(tmp_path: Path) -> None:
    session = tmp_path / "it's a $(dir) `x`"
    session.mkdir()
    shutil.copyfile(SUPERVISOR, session / sc.SUPERVISOR_FILE)
    launch = _launch(session, ["/bin/sh", "-c", "echo ok"])
    out, err = launch.communicate(timeout=10)
    assert launch.returncode == 0, err
    assert out == b"ok\n"
    assert parse_receipt((session / sc.RECEIPT_FILE).read_text()).return_code == 0


def test_script_arguments_are_validated() -> None:
    with pytest.raises(ValueError):
        launch_script("relative/dir", PY, ["true"], 1, 1)
    with pytest.raises(ValueError):
        launch_script("/", PY, ["true"], 1, 1)
    with pytest.raises(ValueError):
        launch_script("/s", PY, [], 1, 1)
    with pytest.raises(ValueError):
        launch_script("/s", PY, ["true"], float("inf"), 1)
    with pytest.raises(ValueError):
        stop_script("/s", 0)


# --- receipts and budgets --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        '{"return_code": 0}',
        '{"cleanup_confirmed": false, "error": "cleanup: pids 12"}',
        '{"cleanup_confirmed": "true"}',
        '{"cleanup_confirmed": 1}',
        '{"cleanup_confirmed": null}',
    ],
)
def test_unconfirmed_or_garbage_receipts_are_rejected(text: str) -> None:
    with pytest.raises(ReceiptError):
        parse_receipt(text)


def test_unconfirmed_receipt_error_mentions_reason() -> None:
    with pytest.raises(ReceiptError, match="cleanup: pids 12"):
        parse_receipt('{"cleanup_confirmed": false, "error": "cleanup: pids 12"}')


def test_malformed_optional_fields_are_coerced(caplog: pytest.LogCaptureFixture) -> None:
    text = json.dumps(
        {
            "cleanup_confirmed": True,
            "return_code": "0",
            "timed_out": "yes",
            "error": 5,
            "descendants_killed": -1,
            "signal": True,
            "extra": 1,
        }
    )
    with caplog.at_level(logging.WARNING, logger=sc.__name__):
        receipt = parse_receipt(text)
    assert receipt == CleanupReceipt(
        cleanup_confirmed=True,
        return_code=None,
        timed_out=False,
        error="5",
        descendants_killed=0,
        signal=None,
    )
    assert "malformed" in caplog.text and "return_code" in caplog.text


def test_well_formed_receipt_round_trips(caplog: pytest.LogCaptureFixture) -> None:
    text = b'noise\n{"cleanup_confirmed": true, "return_code": 2, "timed_out": true, "error": null}\n'
    with caplog.at_level(logging.WARNING, logger=sc.__name__):
        receipt = parse_receipt(text)
    assert receipt.return_code == 2 and receipt.timed_out is True and receipt.descendants_killed == 0
    assert caplog.text == ""
    assert confirmed(receipt) and not confirmed(None)
    assert not confirmed(CleanupReceipt(cleanup_confirmed=False))


def test_budgets_split_close_timeout() -> None:
    b = budgets(100, 60)
    # 60 s close: 15 s kept for the release, the stop exec may use 45 s, its script waits 40.5 s
    # (10 % slack), and the supervisor's three cleanup phases fit inside that wait.
    assert b.release_reserve == 15
    assert b.stop_exec_timeout == 45 and b.stop_timeout == 40.5
    assert b.cleanup_timeout == 13.5
    assert 3 * b.cleanup_timeout <= b.stop_timeout
    assert b.exec_timeout == 100 + 40.5 + 30
    small = budgets(100, 3)  # small budgets keep a proportional slack, never a negative wait
    assert small.stop_exec_timeout == 2.25 and small.stop_timeout == pytest.approx(2.025)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            budgets(bad, 60)
        with pytest.raises(ValueError):
            budgets(100, bad)


def test_harness_stderr_streams_live_and_is_kept_in_the_output_log(session_dir: Path) -> None:
    launch = _launch(session_dir, ["/bin/sh", "-c", "echo early-problem >&2; sleep 3; echo late >&2"])
    try:
        assert _read_line(launch.stderr, 10) == b"early-problem\n"
        early_at = time.monotonic()
        assert launch.poll() is None
        assert _read_line(launch.stderr, 10) == b"late\n"
        assert time.monotonic() - early_at >= 2.0  # streamed while the harness ran, not at its exit
        assert launch.wait(timeout=10) == 0
        log = (session_dir / sc.OUTPUT_LOG).read_text()
        assert "early-problem\n" in log and "late\n" in log
        assert parse_receipt((session_dir / sc.RECEIPT_FILE).read_text()).return_code == 0
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()


def test_a_stderr_stream_nobody_reads_never_blocks_the_harness(session_dir: Path) -> None:
    """The exec's stderr pipe is closed by its reader (a controller that went away): the harness still
    writes 1 MiB to stderr and finishes, and the output log in the session dir has every byte."""
    launch = _launch(
        session_dir,
        ["/bin/sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' x >&2; echo finished"],
    )
    launch.stderr.close()
    try:
        assert _read_line(launch.stdout, 20) == b"finished\n"
        assert launch.wait(timeout=20) == 0
        log = (session_dir / sc.OUTPUT_LOG).read_text()
        assert log.count("x") == 1048576
        assert parse_receipt((session_dir / sc.RECEIPT_FILE).read_text()).return_code == 0
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()


def test_a_stderr_stream_read_too_slowly_never_blocks_the_harness(session_dir: Path) -> None:
    """Nobody reads the exec's stderr pipe (it stays open and fills up): the harness is not held up;
    what the stream could not take is in the output log, and the log says so."""
    launch = _launch(
        session_dir,
        ["/bin/sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' Q >&2; echo finished"],
    )
    try:
        assert _read_line(launch.stdout, 30) == b"finished\n"
        assert launch.wait(timeout=30) == 0
        log = (session_dir / sc.OUTPUT_LOG).read_text()
        assert log.count("Q") == 1048576
        assert "kept in the log file only" in log
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
