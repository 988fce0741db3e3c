"""What every part of the OpenSandbox provider shares: constants, failures, one command's run state."""

from __future__ import annotations

import contextlib
import inspect as pyinspect
import re
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from opencode_tui_core.failures import (
    CommandDetails,
    Delivery,
    Evidence,
    FailureEvent,
)
from opencode_tui_core.sandbox.base import (
    ExecResult,
    OutputCallback,
    OutputChunk,
    SandboxState,
)
from opencode_tui_core.sandbox.opensandbox.diagnostics import (
    Diagnosis,
)
from opencode_tui_core.sandbox.opensandbox.http import RequestFailed

LABEL_CREATE = "opencode-tui.create"  # a nonce per create attempt: finds a half-created sandbox
OUTPUT_CAP_BYTES = 4 << 20  # per stream, tail kept
RUN_NOTES_KEPT = 20  # notes on one command (skipped events, recovery steps) kept for its result
INSPECT_DEADLINE_S = 10.0  # the whole of one public inspect()
READY_PING_TIMEOUT_S = 2.0
CONNECT_DEADLINE_S = 30.0
CLEANUP_DEADLINE_S = 30.0  # deleting a half-created sandbox
PTY_OPEN_TIMEOUT_S = 30.0
NOT_FOUND_EXIT = 44  # download_tar's "no such path" exit code
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")

_STATE_MAP = {
    "Pending": SandboxState.CREATING,
    "Running": SandboxState.RUNNING,
    "Terminated": SandboxState.EXITED,
    "Failed": SandboxState.FAILED,
}


def _now() -> datetime:
    return datetime.now(UTC)


def label_value(value: str) -> str:
    """A metadata label value the server accepts (Kubernetes label rules: ≤63 characters,
    ``[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?``): other characters become ``_``."""
    cleaned = _LABEL_VALUE_BAD.sub("_", value)[:63].strip("_.-")
    return cleaned or "none"


def _memory_quantity(memory_bytes: int) -> str:
    return f"{memory_bytes // (1 << 20)}Mi" if memory_bytes % (1 << 20) == 0 else str(memory_bytes)


def _cpu_quantity(cpus: float) -> str:
    millis = max(1, round(cpus * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def _image_missing(exc: RequestFailed) -> bool:
    """The server could not find (or pull) the image: ``*IMAGE_PULL_FAILED`` and the like."""
    if exc.http_status is None or exc.http_status == 429:
        return False
    code = (exc.code or "").upper()
    body = (exc.body_excerpt or "").lower()
    return "IMAGE" in code or ("image" in body and ("not found" in body or "pull" in body))


# Become uid/gid, then exec "$@": setpriv (util-linux) where present, else python3 (the process
# supervisor needs it in every sandbox anyway).
_DROP_TO_USER_SH = (
    "if command -v setpriv >/dev/null 2>&1; then "
    'exec setpriv --reuid={uid} --regid={gid} --clear-groups -- "$@"; fi; '
    "exec python3 -c 'import os, sys; os.setgroups([]); os.setgid({gid}); os.setuid({uid}); "
    'os.execvp(sys.argv[1], sys.argv[1:])\' "$@"'
)


def _shell_command(argv: Sequence[str], stdin_path: str | None) -> str:
    """execd runs a command string with ``bash -c`` (``sh -c`` without bash)."""
    command = shlex.join(argv)
    if stdin_path is None:
        return command
    # Open the uploaded stdin file, unlink it, then run the command with it as stdin.
    q = shlex.quote(stdin_path)
    return f"exec 0<{q} && rm -f -- {q} && exec {command}"


class _Tail:
    """A byte buffer keeping at most ``cap`` bytes: the newest ones."""

    def __init__(self, cap: int = OUTPUT_CAP_BYTES):
        self.cap = cap
        self.buf = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        excess = len(self.buf) - self.cap
        if excess > 0:
            del self.buf[:excess]

    def value(self) -> bytes:
        return bytes(self.buf)


class _Run:
    """The state of one exec call: output so far, ids, submissions, and what went wrong."""

    def __init__(self, execution_id: str, argv: Sequence[str], on_output: OutputCallback | None):
        self.execution_id = execution_id
        self.argv = list(argv)
        self.on_output = on_output
        self.started_at = _now()
        self.remote_id: str | None = None  # execd's execution id, from the stream's init event
        self.submissions = 0
        self.out = _Tail()
        self.err = _Tail()
        self.combined = _Tail()  # both streams in arrival order: aligned against the command's log
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.remote_error: str | None = None
        self.completed = False
        self.delivery = Delivery.NOT_SENT
        self.cause: BaseException | None = None  # the last thing that went wrong
        self.evidence: list[Evidence] = []
        self.diagnosis = Diagnosis()  # filled as diagnosis goes, so a hard cap keeps what was seen
        # Set once the command's status is known lost (before it is diagnosed): a hard cap that
        # cuts the diagnosis still reports the loss, not an unobserved timeout.
        self.lost: FailureEvent | None = None
        self.notes: list[str] = []
        self.notes_omitted = 0

    async def emit(self, stream: str, data: bytes) -> None:
        if not data:
            return
        (self.out if stream == "stdout" else self.err).add(data)
        self.combined.add(data)
        if self.on_output is not None:
            maybe = self.on_output(OutputChunk(execution_id=self.execution_id, stream=stream, data=data))  # type: ignore[arg-type]
            if pyinspect.isawaitable(maybe):
                await maybe

    def set_exit(self, evalue: Any) -> None:
        """execd reports a non-zero exit as ``error.evalue``: the exit code, or ``signal: <name>``."""
        text = str(evalue).strip()
        if re.fullmatch(r"\d+", text):
            self.exit_code = int(text)
            return
        self.remote_error = text[:500]
        m = re.search(r"signal:\s*(\w+)", text)
        if m:
            name = m.group(1).upper()
            name = "KILL" if name == "KILLED" else name
            with contextlib.suppress(AttributeError):
                import signal as _signal

                self.signal = int(getattr(_signal, f"SIG{name}"))

    def note(self, text: str) -> None:
        """A note for the result's error text, capped (a stream of bad events makes one per event)."""
        if len(self.notes) < RUN_NOTES_KEPT:
            self.notes.append(text[:300])
        else:
            self.notes_omitted += 1

    def result(self, **fields: Any) -> ExecResult:
        error = fields.pop("error", None)
        more = [f"{self.notes_omitted} more note(s) omitted"] if self.notes_omitted else []
        notes = [*self.notes, *more, *([error] if error else [])]
        return ExecResult(
            execution_id=self.execution_id,
            stdout=self.out.value(),
            stderr=self.err.value(),
            started_at=self.started_at,
            ended_at=_now(),
            error="; ".join(notes) if notes else None,
            **fields,
        )

    def details(self, delivery: Delivery | None = None) -> CommandDetails:
        return CommandDetails(
            execution_id=self.remote_id,
            delivery=delivery or self.delivery,
            submissions=self.submissions,
            exit_code=self.exit_code,
        )


class _Rejected(Exception):
    """The daemon answered the submission with an error status before any event."""

    def __init__(self, status: int, code: str | None, excerpt: str | None):
        super().__init__(
            f"execd answered {status}" + (f" {code}" if code else "") + (f": {excerpt}" if excerpt else "")
        )
        self.status = status
        self.code = code
        self.excerpt = excerpt


class _StreamBroken(Exception):
    """The event stream ended or broke before ``execution_complete``."""


# ==================================================================================================
