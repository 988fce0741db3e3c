#!/usr/bin/env python3
"""Process supervisor uploaded into the sandbox; runs one harness and proves its cleanup.

Usage::

    python3 -I supervisor.py --timeout T --cleanup-timeout C --stop-file PATH --receipt PATH \
        [--log-file PATH] [--clock-file PATH --clock-wait W] [--preserve-descendants-on-success] \
        -- <harness argv...>

With ``--clock-file``, the run deadline starts only when that path exists (a harness started ahead of
its task, issue 31, waits for it); if it does not appear within ``--clock-wait`` seconds the harness is
stopped as by a stop request. It starts the harness in its own session, enforces the deadline (TERM, grace, KILL), then kills and
reaps every descendant (it is a child subreaper, so double-forked and detached processes come back to
it) and atomically writes a cleanup receipt::

    {"cleanup_confirmed": bool, "return_code": int|null, "timed_out": bool, "error": str|null,
     "descendants_killed": int, "signal": int|null}

Exit status: 0 when cleanup was confirmed without error, else 1.

Constraints: standard library only, Linux only, runs on Python 3.8 and newer (the sandbox image
decides the interpreter, not us). The harness's stdin and stdout are inherited untouched: the engine
reads the harness's stdout live. With ``--log-file``, the harness's stderr goes through a pipe that the
supervisor copies both to that file and to its own stderr (the exec's stream, so the engine gets it
live and keeps it even if the sandbox is destroyed later); the copy is a thread of the supervisor, so
it is never drained with the harness, and the receipt is written only after the copy reached EOF (or
a short bound passed). A stream that stops being read never blocks the harness: the file gets every
byte, the stream skips what it cannot take. The supervisor's own diagnostics go to the same places
with a "supervisor:" prefix.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
POLL_INTERVAL = 0.05
DRAIN_INTERVAL = 0.01
DEFAULT_CLEANUP_TIMEOUT = 10.0

# Signals that mean "stop now". Only TERM is sent by the stop protocol; INT and HUP are treated the
# same so that an unexpected signal still ends in a cleanup and a receipt rather than a silent death.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# How long the stderr copy may take to reach EOF once the harness tree is gone, and how long one
# write to the (streamed) stderr may wait before that chunk is skipped for the stream.
PUMP_JOIN_SECONDS = 2.0
STREAM_WRITE_WAIT_SECONDS = 0.5

_stopping = False


class _Tee:
    """Copies bytes to the log file (always, blocking) and to stderr (best effort, never stuck)."""

    def __init__(self, log_fd: int | None) -> None:
        self.log_fd = log_fd
        self.lock = threading.Lock()
        self.stream_ok = True
        self.skipped = 0
        if log_fd is not None:
            try:  # the stream must never block the harness: skip what it cannot take
                os.set_blocking(2, False)
            except OSError:
                pass

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.log_fd is not None:
                _write_all(self.log_fd, data)
            if self.stream_ok:
                self._to_stream(data)

    def _to_stream(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + STREAM_WRITE_WAIT_SECONDS
        while view:
            try:
                view = view[os.write(2, view) :]
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.skipped += len(view)
                    return
                time.sleep(0.01)
            except OSError:
                self.stream_ok = False  # the exec's stream is gone; the file keeps everything
                return


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass


_TEE = _Tee(None)
_PUMP: threading.Thread | None = None


def _log(message: str) -> None:
    try:
        _TEE.write(("supervisor: " + message + "\n").encode("utf-8", "replace"))
    except Exception:
        pass


def _pump(read_fd: int) -> None:
    """Copy the harness's stderr pipe through the tee until every writer has closed it."""
    try:
        while True:
            try:
                data = os.read(read_fd, 65536)
            except OSError:
                return
            if not data:
                return
            _TEE.write(data)
    finally:
        os.close(read_fd)


def _join_pump() -> None:
    if _PUMP is not None:
        _PUMP.join(PUMP_JOIN_SECONDS)
        if _TEE.skipped:
            skipped, _TEE.stream_ok = _TEE.skipped, False
            _log(f"{skipped} bytes of stderr were kept in the log file only (the stream did not take them)")


def _on_stop_signal(signum, frame) -> None:
    global _stopping
    _stopping = True


def _stop_requested(stop_file: str) -> bool:
    return _stopping or os.path.lexists(stop_file)


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _ArgumentError(message)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="supervisor.py",
        description="Run a harness under a deadline, then kill and reap every descendant and write "
        "a cleanup receipt. The harness argv follows '--'.",
    )
    parser.add_argument("--timeout", type=float, required=True, help="run deadline in seconds")
    parser.add_argument(
        "--cleanup-timeout",
        type=float,
        default=DEFAULT_CLEANUP_TIMEOUT,
        help="budget of each cleanup phase (TERM grace, reaping, draining) in seconds",
    )
    parser.add_argument("--stop-file", required=True, help="a stop is requested when this path exists")
    parser.add_argument("--receipt", required=True, help="where the cleanup receipt JSON is written")
    parser.add_argument(
        "--log-file",
        help="append the harness's stderr and the supervisor's messages here as well as to stderr",
    )
    parser.add_argument(
        "--clock-file", help="the run deadline starts when this path exists (not at the launch)"
    )
    parser.add_argument(
        "--clock-wait",
        type=float,
        default=0.0,
        help="with --clock-file: how long to wait for it before stopping the harness",
    )
    parser.add_argument(
        "--preserve-descendants-on-success",
        action="store_true",
        help="leave descendants running after a clean zero exit (no timeout, no stop)",
    )
    return parser


def _split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, []


def _receipt(
    confirmed: bool,
    return_code: int | None = None,
    timed_out: bool = False,
    error: str | None = None,
    descendants_killed: int = 0,
    signum: int | None = None,
) -> dict:
    # cleanup_confirmed comes first and uses json's default separators: the stop shell script
    # recognises a confirmed receipt by the literal text '"cleanup_confirmed": true'.
    return {
        "cleanup_confirmed": bool(confirmed),
        "return_code": return_code,
        "timed_out": bool(timed_out),
        "error": error,
        "descendants_killed": int(descendants_killed),
        "signal": signum,
    }


def _write_receipt(path: str, receipt: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".cleanup.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(receipt) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    # Persist the rename itself; best effort, some filesystems refuse fsync on directories.
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def _finish(receipt_path: str, receipt: dict) -> int:
    _join_pump()  # every stderr byte is in the log (and the stream) before the receipt says "done"
    try:
        _write_receipt(receipt_path, receipt)
    except OSError as exc:
        _log(f"cannot write the cleanup receipt {receipt_path}: {exc}")
        return 1
    if receipt["error"]:
        _log(receipt["error"])
    return 0 if receipt["cleanup_confirmed"] and not receipt["error"] else 1


def _become_subreaper() -> str | None:
    """Returns None on success, else the reason."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError) as exc:
        return f"prctl is unavailable: {exc}"
    prctl.restype = ctypes.c_int
    args = (ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if prctl(ctypes.c_int(PR_SET_CHILD_SUBREAPER), *args) != 0:
        err = ctypes.get_errno()
        return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}"
    return None


def _leave_process_group() -> None:
    # Leaving the provider's session/process group means a provider that kills its exec group on a
    # transport timeout does not take us down before the receipt is written.
    if os.getsid(0) == os.getpid():
        return
    try:
        os.setsid()
    except OSError as exc:
        _log(f"setsid failed ({exc}); continuing in the inherited session")


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except OSError as exc:
        _log(f"cannot send signal {signum} to process group {pgid}: {exc}")


def _exited(pid: int) -> bool:
    """True when the harness has exited, without reaping it.

    Leaving it a zombie keeps its PID (and so its process group id) reserved, so a later killpg can
    never hit an unrelated group that reused the number.
    """
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _wait_exit(pid: int, budget: float) -> bool:
    deadline = time.monotonic() + budget
    while True:
        if _exited(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL)


def _reap(pid: int, budget: float) -> tuple[bool, int | None, int | None]:
    """Reap the harness within budget. Returns (reaped, return_code, signal)."""
    deadline = time.monotonic() + budget
    while True:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            # Someone else reaped it (should not happen); its status is lost.
            return True, None, None
        if got == pid:
            if os.WIFSIGNALED(status):
                return True, None, os.WTERMSIG(status)
            if os.WIFEXITED(status):
                return True, os.WEXITSTATUS(status), None
            return True, None, None
        if time.monotonic() >= deadline:
            return False, None, None
        time.sleep(POLL_INTERVAL)


def _reap_zombies() -> bool:
    """Reap every exited child. Returns True when no child at all remains."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            return False


def _children_from_tasks() -> set[int]:
    pids: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return pids
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as handle:
                data = handle.read()
        except OSError:
            continue
        for token in data.split():
            if token.isdigit():
                pids.add(int(token))
    return pids


def _children_from_scan() -> set[int]:
    # Fallback for kernels without /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN).
    me = os.getpid()
    pids: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses; the fields after the last ')' are fixed.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(me):
            pids.add(int(entry))
    return pids


def _drain(budget: float) -> tuple[int, str | None]:
    """SIGKILL and reap every remaining child until none is left. Returns (killed, error)."""
    me = os.getpid()
    killed: set[int] = set()
    deadline = time.monotonic() + budget
    remaining = set()
    while True:
        if _reap_zombies():
            return len(killed), None
        remaining = _children_from_tasks() or _children_from_scan()
        remaining.discard(me)
        for pid in remaining:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            except OSError as exc:
                _log(f"cannot kill descendant {pid}: {exc}")
                continue
            killed.add(pid)
        if time.monotonic() >= deadline:
            break
        time.sleep(DRAIN_INTERVAL)
    if _reap_zombies():
        return len(killed), None
    listed = sorted(remaining)
    shown = ", ".join(str(pid) for pid in listed[:20]) or "unlisted"
    return len(killed), (f"cleanup: descendants still present after {budget:g}s of draining (pids: {shown})")


def _check_budgets(timeout: float, cleanup_timeout: float) -> str | None:
    for name, value in (("--timeout", timeout), ("--cleanup-timeout", cleanup_timeout)):
        if not (math.isfinite(value) and value > 0):
            return f"{name} must be a finite number > 0, got {value!r}"
    return None


def run(argv: list[str]) -> int:
    own_args, harness = _split_argv(argv)
    parser = _build_parser()
    try:
        opts = parser.parse_args(own_args)
    except _ArgumentError as exc:
        _log(f"invalid arguments: {exc}")
        receipt_path = _receipt_path_from(own_args)
        if receipt_path is None:
            return 2
        # Nothing was started, so cleanup is trivially confirmed; the error explains the launch.
        return _finish(receipt_path, _receipt(True, error=f"launch: invalid supervisor arguments: {exc}"))

    receipt_path = opts.receipt
    global _TEE
    if opts.log_file:
        try:
            _TEE = _Tee(os.open(opts.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
        except OSError as exc:
            _log(f"cannot open the log file {opts.log_file}: {exc}; stderr is only streamed")
    problem = _check_budgets(opts.timeout, opts.cleanup_timeout)
    if problem is None and not harness:
        problem = "no harness command after '--'"
    if problem is None and not sys.platform.startswith("linux"):
        problem = f"the supervisor needs Linux, this is {sys.platform}"
    if problem is not None:
        return _finish(receipt_path, _receipt(True, error=f"launch: {problem}"))

    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_stop_signal)
    # An inherited SIG_IGN for SIGCHLD would make the kernel auto-reap children and hide exit
    # statuses; an inherited blocked mask would delay stop signals and leak into the harness.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])

    _leave_process_group()
    problem = _become_subreaper()
    if problem is not None:
        # Without subreaping we could not prove that detached descendants are gone: refuse to run.
        return _finish(receipt_path, _receipt(True, error=f"launch: {problem}"))

    if _stop_requested(opts.stop_file):
        _log("stop requested before launch; the harness is not started")
        return _finish(receipt_path, _receipt(True))

    global _PUMP
    stderr_w = None
    try:
        if _TEE.log_fd is not None and not opts.preserve_descendants_on_success:
            stderr_r, stderr_w = os.pipe()
            _PUMP = threading.Thread(target=_pump, args=(stderr_r,), name="stderr-tee", daemon=True)
        elif _TEE.log_fd is not None:
            # Preserved descendants may outlive us: they write to the file itself, never to a pipe
            # whose reader is gone.
            stderr_w = os.dup(_TEE.log_fd)
        proc = subprocess.Popen(harness, start_new_session=True, stderr=stderr_w)
    except OSError as exc:
        if stderr_w is not None:
            os.close(stderr_w)
        if _PUMP is not None:
            _PUMP.start()  # reads EOF at once and closes its end
        # The exec failed inside the child, which subprocess has already reaped.
        killed, drain_error = _drain(opts.cleanup_timeout)
        return _finish(
            receipt_path,
            _receipt(
                drain_error is None,
                error=drain_error or f"launch: cannot start {harness[0]!r}: {exc}",
                descendants_killed=killed,
            ),
        )

    if stderr_w is not None:
        os.close(stderr_w)  # only the harness tree holds the write end now: EOF when it is gone
    if _PUMP is not None:
        _PUMP.start()
    return _supervise(proc, opts, receipt_path)


def _supervise(proc: subprocess.Popen, opts: argparse.Namespace, receipt_path: str) -> int:
    pid = proc.pid
    pgid = pid  # start_new_session makes the harness its own process group leader
    cleanup = opts.cleanup_timeout
    # A clock file defers the run deadline to its appearance; until then the wait has its own cap.
    waiting = bool(opts.clock_file)
    wait_until = time.monotonic() + max(opts.clock_wait, 0.0)
    deadline = math.inf if waiting else time.monotonic() + opts.timeout
    timed_out = False
    stopped = False
    error = None
    return_code = None
    signum = None
    killed = 0

    try:
        while not _exited(pid):
            if _stop_requested(opts.stop_file):
                stopped = True
                _log("stop requested; terminating the harness")
                break
            if waiting:
                if os.path.lexists(opts.clock_file):
                    waiting = False
                    deadline = time.monotonic() + opts.timeout
                elif time.monotonic() >= wait_until:
                    stopped = True
                    _log(f"not started within {opts.clock_wait:g}s of waiting; terminating the harness")
                    break
            if time.monotonic() >= deadline:
                timed_out = True
                _log(f"deadline of {opts.timeout:g}s passed; terminating the harness")
                break
            time.sleep(POLL_INTERVAL)

        if (stopped or timed_out) and not _exited(pid):
            _signal_group(pgid, signal.SIGTERM)
            # A stopped (SIGSTOP'd) process cannot act on TERM until it is continued.
            _signal_group(pgid, signal.SIGCONT)
            if not _wait_exit(pid, cleanup):
                _log(f"harness ignored SIGTERM for {cleanup:g}s; killing its process group")

        preserve = opts.preserve_descendants_on_success and not (stopped or timed_out)
        clean_exit = False
        if preserve:
            # Peek at the status without reaping: preservation only applies to a clean zero exit.
            info = None
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                pass
            clean_exit = info is not None and info.si_code == os.CLD_EXITED and info.si_status == 0
        preserve = preserve and clean_exit

        if not preserve:
            _signal_group(pgid, signal.SIGKILL)
        reaped, return_code, signum = _reap(pid, cleanup)
        proc.returncode = return_code if return_code is not None else -(signum or 0)
        if not reaped:
            error = f"cleanup: harness pid {pid} did not exit within {cleanup:g}s after SIGKILL"
        elif preserve:
            _reap_zombies()
            _log("harness exited cleanly; descendants are preserved as requested")
        else:
            killed, error = _drain(cleanup)
    except Exception as exc:
        # Unexpected internal failure: still try to leave nothing behind, and say so honestly.
        _log(f"internal error: {exc!r}")
        _signal_group(pgid, signal.SIGKILL)
        killed, drain_error = _drain(cleanup)
        error = drain_error or f"supervisor: internal error: {exc!r}"
        confirmed = drain_error is None and _reap_zombies()
        return _finish(receipt_path, _receipt(confirmed, None, timed_out, error, killed, None))

    confirmed = error is None
    return _finish(receipt_path, _receipt(confirmed, return_code, timed_out, error, killed, signum))


def _receipt_path_from(args: list[str]) -> str | None:
    for index, arg in enumerate(args):
        if arg == "--receipt" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--receipt="):
            return arg[len("--receipt=") :]
    return None


def main() -> int:
    return run(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
