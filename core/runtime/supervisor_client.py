"""Controller side of the process supervisor: shell scripts for a sandbox's exec, receipts, budgets.

Every script is returned as an argv list ``["/bin/sh", "-c", script]`` and only needs a POSIX shell
plus ``ln``, ``mv``, ``cat``, ``readlink``, ``rm`` and ``sleep`` inside the sandbox. All paths live in
one per-activation session directory (see :class:`SessionPaths`).

The launch and stop scripts race on one symlink, ``launch.claim``: ``ln -s`` is atomic and fails when
the name exists, so exactly one of "launch" and "stop" wins. A stop that wins fences every later
launch; a launch that wins is stopped through ``stop.request`` plus SIGTERM and confirmed by the
supervisor's receipt.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.inside import INSIDE_DIR

log = logging.getLogger(__name__)

SUPERVISOR_FILE = "supervisor.py"
CLAIM_FILE = "launch.claim"
PID_FILE = "supervisor.pid"
STOP_FILE = "stop.request"
RECEIPT_FILE = "cleanup.json"
OUTPUT_LOG = "output.log"
CLOSED_SUFFIX = ".closed"

CLAIM_LAUNCH = "launch"
CLAIM_STOP = "stop"

# TERM grace, reaping the harness, draining descendants.
CLEANUP_PHASE_COUNT = 3
# Covers supervisor start-up, polling and receipt I/O on top of the run and cleanup budgets.
EXEC_SLACK_SECONDS = 30.0
# The stop exec's deadline exceeds the time the stop script waits for the receipt by this much (at
# most), so the script reports "unconfirmed" itself before the exec is cut; small budgets use a share.
STOP_EXEC_SLACK_SECONDS = 5.0
STOP_EXEC_SLACK_SHARE = 0.1
# The close budget bounds the whole close; this share of it is kept for the release (destroying an
# owned sandbox is the authority when cleanup is unconfirmed, so a stalled stop must not spend it).
RELEASE_RESERVE_SHARE = 0.25

BOOTSTRAP_EXIT_CODE = 127
STOP_UNCONFIRMED_EXIT_CODE = 3

_STOP_POLL_SECONDS = 0.2

SUPERVISOR_SOURCE_PATH = INSIDE_DIR / SUPERVISOR_FILE
# The stop program (a POSIX shell script); it runs as ``/bin/sh -c`` with its parameters as argv.
STOP_SOURCE_PATH = INSIDE_DIR / "stop.sh"


def supervisor_source() -> bytes:
    """The supervisor script, as uploaded into the sandbox at ``SessionPaths.supervisor``."""
    return SUPERVISOR_SOURCE_PATH.read_bytes()


# Read at import: a stop, late in a close, never depends on reading the installed package.
_STOP_SOURCE = STOP_SOURCE_PATH.read_text()


def stop_source() -> str:
    """The stop program's text, as ``/bin/sh -c`` runs it in the sandbox."""
    return _STOP_SOURCE


@dataclass(frozen=True)
class SessionPaths:
    """The control files of one session directory inside the sandbox."""

    session_dir: str

    @classmethod
    def of(cls, session_dir: str) -> SessionPaths:
        return cls(_session_dir(session_dir))

    def _file(self, name: str) -> str:
        return posixpath.join(self.session_dir, name)

    @property
    def supervisor(self) -> str:
        return self._file(SUPERVISOR_FILE)

    @property
    def claim(self) -> str:
        return self._file(CLAIM_FILE)

    @property
    def pid(self) -> str:
        return self._file(PID_FILE)

    @property
    def stop_request(self) -> str:
        return self._file(STOP_FILE)

    @property
    def receipt(self) -> str:
        return self._file(RECEIPT_FILE)

    @property
    def output_log(self) -> str:
        return self._file(OUTPUT_LOG)

    @property
    def closed(self) -> str:
        return self.session_dir + CLOSED_SUFFIX


@dataclass(frozen=True)
class Budgets:
    """Deadlines derived from the run and close budgets (seconds).

    The close budget is one deadline for the whole close (see ``opencode_tui_core.session.CloseDeadline``): the
    stop request may use all of it but the release reserve, and the supervisor's three cleanup phases
    together fit inside the time the stop script waits, so a receipt can arrive within the budget.
    """

    run_timeout: float
    close_timeout: float
    release_reserve: float  # kept for the release: no step before it may use this part
    cleanup_timeout: float  # each of the supervisor's three cleanup phases
    exec_timeout: float  # the provider exec that runs the launch script
    stop_timeout: float  # how long the stop script waits for the receipt (full budget left)
    stop_exec_timeout: float  # the provider exec that runs the stop script (full budget left)


def stop_window(available: float) -> tuple[float, float]:
    """(how long the stop script waits for the receipt, the stop exec's deadline) for ``available``
    seconds of close budget: the exec may use all of it, the script returns a little earlier."""
    slack = min(STOP_EXEC_SLACK_SECONDS, available * STOP_EXEC_SLACK_SHARE)
    return available - slack, available


def budgets(run_timeout: float, close_timeout: float) -> Budgets:
    """Split the close budget over the stop, the cleanup phases and the release reserve."""
    _positive("run_timeout", run_timeout)
    _positive("close_timeout", close_timeout)
    reserve = close_timeout * RELEASE_RESERVE_SHARE
    stop_timeout, stop_exec_timeout = stop_window(close_timeout - reserve)
    cleanup_timeout = stop_timeout / CLEANUP_PHASE_COUNT
    return Budgets(
        run_timeout=float(run_timeout),
        close_timeout=float(close_timeout),
        release_reserve=reserve,
        cleanup_timeout=cleanup_timeout,
        exec_timeout=run_timeout + CLEANUP_PHASE_COUNT * cleanup_timeout + EXEC_SLACK_SECONDS,
        stop_timeout=stop_timeout,
        stop_exec_timeout=stop_exec_timeout,
    )


def launch_script(
    session_dir: str,
    python: str,
    harness_argv: Sequence[str],
    timeout: float,
    cleanup_timeout: float,
    preserve: bool = False,
    stdin_file: str | None = None,
    clock: tuple[str, float] | None = None,
) -> list[str]:
    """The exec argv that claims the launch and execs the supervisor around ``harness_argv``.

    Exit codes: 0 with no output when the session dir is gone or the claim was already taken (a stop
    fenced us); 127 when ``python`` cannot load the supervisor and 2 when ``stdin_file`` is unreadable
    (both before the claim: nothing claimed, no receipt, a later stop fences the launch); otherwise the
    supervisor's own status (0 = cleanup confirmed without error, 1 = see the receipt). A non-zero
    harness exit is reported in the receipt, not in this status.

    The harness's stdout is the exec's stdout, streamed as it is produced. The harness's stderr is
    the exec's stderr too, streamed, and the supervisor also appends it to ``output.log`` (its own
    ``--log-file`` copy, a thread of the supervisor: a ``tee`` process would itself be drained), so it
    survives in the sandbox when the stream breaks. ``clock`` (a file relative to the session dir, a wait
    cap in seconds): the run deadline starts when that file appears, not at the launch (a harness
    started ahead of its task, issue 31). Stdin is
    ``stdin_file`` (relative paths are inside the session dir) or ``/dev/null``, so a harness never
    blocks on an exec channel that stays open.
    """
    paths = SessionPaths.of(session_dir)
    if not python:
        raise ValueError("python must name an interpreter")
    argv = list(harness_argv)
    if not argv or not argv[0]:
        raise ValueError("harness_argv must name a command")
    _positive("timeout", timeout)
    _positive("cleanup_timeout", cleanup_timeout)
    if stdin_file is None:
        stdin_path = "/dev/null"
    else:
        stdin_path = posixpath.join(paths.session_dir, stdin_file)

    q = shlex.quote
    supervisor_cmd = [
        python,
        "-I",
        paths.supervisor,
        "--timeout",
        repr(float(timeout)),
        "--cleanup-timeout",
        repr(float(cleanup_timeout)),
        "--stop-file",
        paths.stop_request,
        "--receipt",
        paths.receipt,
        "--log-file",
        paths.output_log,
    ]
    if clock is not None:
        _positive("clock wait", clock[1])
        supervisor_cmd += [
            "--clock-file",
            posixpath.join(paths.session_dir, clock[0]),
            "--clock-wait",
            repr(float(clock[1])),
        ]
    if preserve:
        supervisor_cmd.append("--preserve-descendants-on-success")
    supervisor_cmd += ["--", *argv]
    bootstrap_hint = (
        f"opencode-tui: the sandbox cannot run the process supervisor with {python!r}. "
        "Preinstall python3 (3.8 or newer) in the sandbox image or configure the interpreter path."
    )
    pid_tmp = paths.pid + ".tmp"
    script = f"""\
[ -d {q(paths.session_dir)} ] || exit 0
if [ -e {q(paths.claim)} ] || [ -L {q(paths.claim)} ]; then exit 0; fi
bootstrap_err=$({q(python)} -I {q(paths.supervisor)} --help 2>&1 >/dev/null)
bootstrap_rc=$?
if [ "$bootstrap_rc" -ne 0 ]; then
  printf '%s (exit %s): %s\\n' {q(bootstrap_hint)} "$bootstrap_rc" "$bootstrap_err" >&2
  exit {BOOTSTRAP_EXIT_CODE}
fi
if [ ! -r {q(stdin_path)} ]; then
  echo {q(f"opencode-tui: the harness input {stdin_path} is missing or unreadable")} >&2
  exit 2
fi
exec 3< {q(stdin_path)}
trap '' TERM
ln -s {CLAIM_LAUNCH} {q(paths.claim)} 2>/dev/null || exit 0
# The pid is only meaningful in this pid namespace; some providers (local bubblewrap) run every
# exec in a fresh one, so the stop script compares namespaces before signalling.
pidns=$(readlink /proc/self/ns/pid 2>/dev/null || echo unknown)
if ! {{ printf '%s %s\\n' "$$" "$pidns" > {q(pid_tmp)} && mv -f {q(pid_tmp)} {q(paths.pid)}; }}; then
  echo 'opencode-tui: cannot record the supervisor pid; a stop will rely on the stop file' >&2
fi
exec {shlex.join(supervisor_cmd)} <&3 3<&-
"""
    return ["/bin/sh", "-c", script]


def stop_script(session_dir: str, timeout: float) -> list[str]:
    """The exec argv that requests a stop and prints a confirmed receipt on stdout (core/inside/stop.sh,
    its parameters as arguments).

    A receipt that already confirms cleanup is printed as is. Otherwise the script touches
    ``stop.request`` and tries to claim the launch with "stop"; if it wins, no harness ever ran and it
    writes a synthetic confirmed receipt. If the launch won, it sends SIGTERM to the supervisor and
    polls for the receipt for up to ``timeout`` seconds. Exit 0 with the receipt on stdout, or exit 3
    when cleanup could not be confirmed (an unconfirmed receipt, if any, is still printed).
    Run it with the exec deadline :func:`stop_window` pairs with ``timeout``.
    """
    paths = SessionPaths.of(session_dir)
    _positive("timeout", timeout)
    synthetic = json.dumps(
        {
            "cleanup_confirmed": True,
            "return_code": None,
            "timed_out": False,
            "error": None,
            "descendants_killed": 0,
            "signal": None,
        }
    )
    polls = max(1, math.ceil(timeout / _STOP_POLL_SECONDS))
    return [
        "/bin/sh",
        "-c",
        stop_source(),
        "opencode-tui-stop",  # $0
        paths.session_dir,
        paths.receipt,
        paths.stop_request,
        paths.claim,
        paths.pid,
        str(polls),
        f"{_STOP_POLL_SECONDS:g}",
        str(round(1 / _STOP_POLL_SECONDS)),
        f"{float(timeout):g}",
        synthetic,
        CLAIM_STOP,
        str(STOP_UNCONFIRMED_EXIT_CODE),
    ]


def remove_session_dir_script(session_dir: str) -> list[str]:
    """The exec argv that removes the session directory: rename to ``<dir>.closed``, then ``rm -rf``.

    The rename is atomic, so a launch that arrives during deletion finds no session dir and exits
    instead of claiming a half-deleted one. Exits non-zero if anything is left.
    """
    paths = SessionPaths.of(session_dir)
    q = shlex.quote
    script = f"""\
if [ -e {q(paths.session_dir)} ] || [ -L {q(paths.session_dir)} ]; then
  rm -rf {q(paths.closed)} || exit 1
  mv {q(paths.session_dir)} {q(paths.closed)} || exit 1
fi
rm -rf {q(paths.closed)} || exit 1
if [ -e {q(paths.session_dir)} ] || [ -e {q(paths.closed)} ]; then
  echo 'opencode-tui: the session directory could not be removed' >&2
  exit 1
fi
exit 0
"""
    return ["/bin/sh", "-c", script]


class ReceiptError(RuntimeError):
    """The cleanup receipt is missing, unreadable or does not confirm cleanup."""


class CleanupReceipt(BaseModel):
    """The supervisor's cleanup receipt. Only ``cleanup_confirmed=True`` proves cleanup."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    cleanup_confirmed: bool
    return_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    descendants_killed: int = 0
    signal: int | None = None


def confirmed(receipt: CleanupReceipt | None) -> bool:
    """True only for a receipt that positively confirms cleanup."""
    return receipt is not None and receipt.cleanup_confirmed is True


def parse_receipt(text: str | bytes) -> CleanupReceipt:
    """Parse a receipt strictly about confirmation and leniently about the optional fields.

    Raises ReceiptError when the text is not a JSON object or ``cleanup_confirmed`` is not exactly
    ``true``. Malformed optional fields are coerced to safe values and logged as a warning.
    """
    data = _load_object(text)
    if data.get("cleanup_confirmed") is not True:
        detail = data.get("error")
        suffix = f": {detail}" if isinstance(detail, str) and detail else ""
        raise ReceiptError(
            f"cleanup not confirmed (cleanup_confirmed={data.get('cleanup_confirmed')!r}){suffix}"
        )

    problems: list[str] = []

    def field(name: str, ok: Any, default: Any) -> Any:
        if name not in data or data[name] is None:
            return default
        value = data[name]
        if ok(value):
            return value
        problems.append(f"{name}={value!r}")
        return default

    def is_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    error_value = data.get("error")
    if error_value is not None and not isinstance(error_value, str):
        problems.append(f"error={error_value!r}")
        error_value = str(error_value)
    unknown = sorted(set(data) - set(CleanupReceipt.model_fields))
    if unknown:
        problems.append(f"unknown fields {unknown}")
    receipt = CleanupReceipt(
        cleanup_confirmed=True,
        return_code=field("return_code", is_int, None),
        timed_out=field("timed_out", lambda v: isinstance(v, bool), False),
        error=error_value,
        descendants_killed=field("descendants_killed", lambda v: is_int(v) and v >= 0, 0),
        signal=field("signal", lambda v: is_int(v) and v > 0, None),
    )
    if problems:
        log.warning(
            "cleanup receipt confirms cleanup but has malformed fields (coerced): %s", "; ".join(problems)
        )
    return receipt


def _load_object(text: str | bytes) -> dict[str, Any]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    stripped = text.strip()
    if not stripped:
        raise ReceiptError("cleanup receipt is missing (empty output)")
    try:
        data = json.loads(stripped)
    except ValueError:
        # Tolerate noise printed before the receipt: the receipt is always the last line.
        last = stripped.splitlines()[-1].strip()
        try:
            data = json.loads(last)
        except ValueError as exc:
            raise ReceiptError(f"cleanup receipt is not valid JSON: {exc}; got {stripped[:200]!r}") from None
    if not isinstance(data, dict):
        raise ReceiptError(f"cleanup receipt is not a JSON object: {stripped[:200]!r}")
    return data


def _session_dir(session_dir: str) -> str:
    if not session_dir or not posixpath.isabs(session_dir):
        raise ValueError(f"session_dir must be an absolute path, got {session_dir!r}")
    normalized = posixpath.normpath(session_dir)
    if normalized in ("/", "//") or ".." in normalized.split("/"):
        raise ValueError(f"session_dir {session_dir!r} is not a usable session directory")
    return normalized


def _positive(name: str, value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
