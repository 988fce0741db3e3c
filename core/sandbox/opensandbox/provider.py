"""The OpenSandbox provider: sandboxes from an OpenSandbox server, commands through its execd daemon.

Two HTTP APIs (``shared/reference/opensandbox/``), both spoken with httpx (async):

* the **lifecycle API** of the server (``{url}/v1``, header ``OPEN-SANDBOX-API-KEY``): create (image,
  entrypoint, resource limits, timeout, metadata labels ``opencode-tui.run``/``opencode-tui.owner``),
  get, delete, renew-expiration, endpoints, list (for ``sweep``), diagnostics;
* the **execd API** of the daemon inside each sandbox (at the endpoint the server resolves for port
  44772): ping, streamed commands, command status and logs by execution id, interrupt, file
  upload/download, and PTYs over WebSocket. The server's API key is never sent to execd.

Failure handling (docs/opensandbox.md has the full story):

* Every failure is a ``FailureEvent`` (registered kind, operation, HTTP status, original exception as
  cause, evidence, typed details) carried by a ``SandboxError``; failures that were recovered from
  are kept in ``OpenSandboxSandbox.failures`` and reported to ``on_recovered`` (the episode puts
  them in the event stream as ``FailureRecovered``) with how they were recovered.
* **Commands are never replayed** once their submission may have reached execd. A broken output
  stream is followed by the same execution id (status, then logs). Only a submission proven not to
  have started (connection refused, or a 502 before the stream began) is resubmitted, within the
  ``submit`` budget. A command whose exit was not observed keeps ``exit_code=None``.
* **The execution's hard cap is the caller's ``timeout``**: recovery and diagnosis use what is left
  of it and start no request after it. execd is asked to kill the command itself ``headroom``
  seconds after the cap, as a backstop.
* **OOM is confirmed only by structured evidence about this sandbox** (``core.sandbox.oom``): a
  terminal lifecycle state with a recognised reason code; the diagnostics reports' ``OOMKilled``
  only when ``oom_from_diagnostics`` is on. Free text (a status message, output) never confirms.
* **Expected refusal**: a refusal the daemon confirms before launching anything (e.g. running as root
  not allowed) raises ``ExpectedRefusal`` – control flow, no failure event – or, for the configured
  default user, falls back to the image's user.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect as pyinspect
import json
import logging
import os
import re
import shlex
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

import httpx

from core.config import OpenSandboxAction, OpenSandboxSettings
from core.failures import (
    CommandDetails,
    Delivery,
    Evidence,
    FailureCause,
    FailureEvent,
    FailureStage,
    GenericDetails,
    OomDetails,
)
from core.failures.model import FailureDetails
from core.sandbox import tarsafe
from core.sandbox.base import (
    LABEL_INVOCATION,
    LABEL_OWNER,
    LABEL_RUN,
    ExecResult,
    ExpectedRefusal,
    NetworkPolicy,
    OutputCallback,
    OutputChunk,
    PtyHandle,
    QueuedOutput,
    Recovery,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxProbe,
    SandboxProvider,
    SandboxRecord,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    check_exec_args,
    default_owner,
    invocation_id,
    new_execution_id,
    parse_user_spec,
)
from core.sandbox.opensandbox.diagnostics import (
    TERMINAL_STATES,
    Diagnoser,
    Diagnosis,
    lifecycle_evidence,
)
from core.sandbox.opensandbox.http import Http, RequestFailed, classify_exception, error_code
from core.sandbox.opensandbox.policy import DEFAULT_OPENSANDBOX_POLICY, decide_request, merged_policy

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "opencode-tui/base:bookworm"
LABEL_CREATE = "opencode-tui.create"  # a nonce per create attempt: finds a half-created sandbox
OUTPUT_CAP_BYTES = 4 << 20  # per stream, tail kept
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


def _failure(
    kind: str,
    *,
    stage: FailureStage,
    operation: str,
    message: str,
    cause: BaseException | None = None,
    http_status: int | None = None,
    evidence: Sequence[Evidence] = (),
    details: FailureDetails | None = None,
) -> FailureEvent:
    return FailureEvent(
        kind=kind,
        stage=stage,
        operation=operation,
        message=message[:2000],
        http_status=http_status,
        cause=FailureCause.from_exception(cause) if cause is not None else None,
        evidence=list(evidence),
        details=details,
    )


def _error(failure: FailureEvent, cause: BaseException | None = None) -> SandboxError:
    error = SandboxError(failure.message, failure=failure)
    if cause is not None:
        error.__cause__ = cause
    return error


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
        self.notes: list[str] = []

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

    def result(self, **fields: Any) -> ExecResult:
        error = fields.pop("error", None)
        notes = [*self.notes, *([error] if error else [])]
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


class OpenSandboxPty(PtyHandle):
    """An interactive terminal over execd's PTY WebSocket (binary 0x00+stdin in, 0x01..+output out)."""

    def __init__(self, sandbox: OpenSandboxSandbox, session_id: str, ws: Any):
        self._sandbox = sandbox
        self.session_id = session_id
        self._ws = ws
        self._out = QueuedOutput()
        self._closed = False
        self.exit_code: int | None = None
        self.failure: FailureEvent | None = None  # set when the terminal broke unexpectedly
        self.output_offset = 0
        self._reattached = False
        self._closing: asyncio.Future[Any] | None = None
        self._reader = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                try:
                    async for message in self._ws:
                        self._on_message(message)
                except (ConnectionClosed, OSError):
                    pass
                if self._closed or self.exit_code is not None:
                    return  # closed by us, or the process ended and said so
                # The socket closed without an exit report: re-attach once from where we were.
                if not await self._reattach():
                    await self._broken()
                    return
        finally:
            self._out.put(b"")

    def _on_message(self, message: bytes | str) -> None:
        if isinstance(message, bytes):
            if message[:1] in (b"\x01", b"\x02", b"\x03") and len(message) > 1:
                self.output_offset += len(message) - 1
                self._out.put(message[1:])
            return
        with contextlib.suppress(ValueError):
            msg = json.loads(message)
            if isinstance(msg, dict) and msg.get("type") == "exit":
                code = msg.get("exit_code")
                self.exit_code = code if isinstance(code, int) else -1

    async def _reattach(self) -> bool:
        if self._closed or self._sandbox.closed:
            return False
        if self._reattached:
            return False
        self._reattached = True
        try:
            self._ws = await self._sandbox._pty_socket(self.session_id, since=self.output_offset)
        except Exception as exc:
            log.debug("pty %s: re-attach failed: %s", self.session_id, exc)
            return False
        return True

    async def _broken(self) -> None:
        """Diagnose (shared entry point, own bounded budget) and record the terminal's failure."""
        sb = self._sandbox
        loop = asyncio.get_running_loop()
        diagnosis = await sb._diagnose(loop.time() + sb.policy.evidence_polling.budget_s + 5.0)
        self.failure = sb._lost_failure(
            diagnosis,
            default_kind="sandbox_pty_failed",
            operation="pty",
            what=f"terminal {self.session_id} closed without an exit report",
            details=GenericDetails(data={"session_id": self.session_id, "output_offset": self.output_offset}),
        )
        sb._observe(self.failure)

    async def read(self, max_bytes: int = 65536) -> bytes:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if self._closed:
            return b""
        return await self._out.read(max_bytes)

    async def _send(self, operation: str, message: bytes | str) -> None:
        if self._closed or self._sandbox.closed:
            raise SandboxClosedError("the terminal is closed")
        try:
            await asyncio.wait_for(self._ws.send(message), self._sandbox.settings.request_timeout_s)
        except Exception as exc:
            failure = _failure(
                "sandbox_pty_failed",
                stage=FailureStage.AGENT,
                operation=f"pty.{operation}",
                message=f"terminal {operation} failed: {type(exc).__name__}: {exc}",
                cause=exc,
                details=GenericDetails(data={"session_id": self.session_id}),
            )
            raise _error(failure, exc) from exc

    async def write(self, data: bytes) -> None:
        await self._send("write", b"\x00" + bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        if cols <= 0 or rows <= 0:
            raise ValueError("cols and rows must be positive")
        await self._send("resize", json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def close(self) -> None:
        """End the terminal's process (DELETE /pty/{id}) and disconnect. Idempotent."""
        if self._closed:
            return
        self.close_now()
        if self._sandbox.closed and self._sandbox.owned:
            return
        with contextlib.suppress(Exception):
            await self._sandbox._execd_request(
                "pty",
                "DELETE",
                f"/pty/{self.session_id}",
                timeout=self._sandbox.settings.request_timeout_s,
                accept=(404,),
            )

    def close_now(self) -> None:
        """Disconnect only (the owned sandbox is about to be deleted)."""
        if self._closed:
            return
        self._closed = True
        self._reader.cancel()
        self._sandbox._ptys.discard(self)
        with contextlib.suppress(Exception):
            self._closing = asyncio.ensure_future(self._ws.close())


# ==================================================================================================


class OpenSandboxSandbox(Sandbox):
    """One OpenSandbox sandbox, owned (deleted on release) or borrowed (never deleted by us)."""

    provider = "opensandbox"

    def __init__(
        self,
        owner: OpenSandboxProvider,
        sandbox_id: str,
        *,
        owned: bool,
        workdir: str | None = None,
        memory_bytes: int | None = None,
        oom_at_connect: bool | None = None,
    ):
        self._provider = owner
        self.settings = owner.settings
        self.policy = owner.policy
        self._http = owner._http
        self.sandbox_id = sandbox_id
        self.owned = owned
        self.workdir = workdir
        self.memory_bytes = memory_bytes
        # The spec's user as execd's uid/gid (None: ``command_uid``/``command_gid``, else execd's own).
        self.user_ids: tuple[int, int | None] | None = None
        self.failures: list[FailureEvent] = []  # every failure seen here, recovered ones included
        self.remote_ids: dict[str, str] = {}  # our execution id -> execd's execution id
        self._execd_base: str | None = None
        self._execd_headers: dict[str, str] = {}
        self._closed = False
        self._deleted = False
        self._ptys: set[OpenSandboxPty] = set()
        self._release_lock = asyncio.Lock()
        self._diagnoser = Diagnoser(
            self._http,
            self.policy,
            sandbox_id,
            owner.api_url,
            oom_at_connect=oom_at_connect,
            server_version=lambda: owner.server_version,
            oom_reason_codes=owner.settings.oom_reason_codes,
            oom_from_diagnostics=owner.settings.oom_from_diagnostics,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<OpenSandboxSandbox {self.sandbox_id} owned={self.owned} closed={self._closed}>"

    def _ensure_open(self, operation: str) -> None:
        if self._closed:
            raise SandboxClosedError(
                f"{operation} refused: opensandbox sandbox {self.sandbox_id} was released "
                "(nothing runs on the host instead)"
            )

    def _observe(self, failure: FailureEvent) -> None:
        self.failures.append(failure)
        log.info("opensandbox %s: %s: %s", self.sandbox_id, failure.kind, failure.message)

    def _recovered(self, failure: FailureEvent, how: Recovery) -> None:
        """Report a failure this provider went on from without raising (``on_recovered``)."""
        if self.on_recovered is None:
            return
        try:
            self.on_recovered(failure, how)
        except Exception:  # a broken listener must not change what the command did
            log.exception("opensandbox %s: on_recovered failed", self.sandbox_id)

    # ---------------------------------------------------------------------------------- execd

    async def _resolve_execd(self, deadline: float | None = None) -> None:
        s = self.settings
        if s.use_server_proxy:
            self._execd_base = self._provider.api_url(f"/sandboxes/{self.sandbox_id}/proxy/{s.execd_port}")
            self._execd_headers = self._http.server_headers()
            return
        response = await self._http.request(
            "read",
            "GET",
            self._provider.api_url(f"/sandboxes/{self.sandbox_id}/endpoints/{s.execd_port}"),
            timeout=s.request_timeout_s,
            deadline=deadline,
            not_found_kind="sandbox_lost",
        )
        body = response.json()
        endpoint = body.get("endpoint") if isinstance(body, dict) else None
        if not isinstance(endpoint, str) or not endpoint:
            raise SandboxError(
                f"the server resolved no execd endpoint for sandbox {self.sandbox_id}: {body!r}",
                failure=_failure(
                    "provider_protocol_error",
                    stage=FailureStage.SEED,
                    operation="endpoint",
                    message=f"no endpoint in {str(body)[:300]}",
                ),
            )
        scheme = "https" if self._provider.settings.url.startswith("https://") else "http"
        self._execd_base = endpoint.rstrip("/") if "://" in endpoint else f"{scheme}://{endpoint.rstrip('/')}"
        headers = body.get("headers") if isinstance(body.get("headers"), dict) else {}
        self._execd_headers = {str(k): str(v) for k, v in headers.items()}

    def _execd_url(self, path: str) -> str:
        assert self._execd_base is not None, "execd endpoint not resolved"
        return self._execd_base + path

    async def _execd_request(self, operation: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._execd_base is None:
            await self._resolve_execd(kwargs.get("deadline"))
        return await self._http.request(
            operation,
            method,
            self._execd_url(path),
            server=self.settings.use_server_proxy,
            headers=self._execd_headers,
            **kwargs,
        )

    # ------------------------------------------------------------------------------ readiness

    async def _become_ready(self, budget_s: float) -> tuple[str | None, list[Evidence]]:
        """Wait until execd answers for *this* sandbox; ``(None, [])`` when ready, else a reason."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        evidence: list[Evidence] = []
        try:
            await self._resolve_execd(deadline)
        except (RequestFailed, SandboxError, TimeoutError) as exc:
            return f"resolving the execd endpoint failed: {exc}", evidence
        reason = "execd never answered"
        next_lifecycle = loop.time() + 1.0
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                await self._execd_request(
                    "ping", "GET", "/ping", timeout=min(READY_PING_TIMEOUT_S, remaining), deadline=deadline
                )
            except RequestFailed as exc:
                reason = f"execd ping failed: {exc}"
            except TimeoutError:
                break
            else:
                return await self._check_identity(deadline)
            if loop.time() >= next_lifecycle:
                next_lifecycle = loop.time() + 1.0
                with contextlib.suppress(TimeoutError):
                    ev, state, gone = await self._diagnoser.lifecycle(deadline, operation="read")
                    if gone or state in TERMINAL_STATES:
                        evidence.append(ev)
                        return (
                            f"the sandbox ended before its daemon answered ({ev.data.get('state') or 'gone'}: "
                            f"{ev.data.get('message') or ev.data.get('reason') or ''})",
                            evidence,
                        )
            await asyncio.sleep(min(0.1, max(deadline - loop.time(), 0)))
        return f"{reason} within {budget_s:g}s", evidence

    async def _check_identity(self, deadline: float) -> tuple[str | None, list[Evidence]]:
        """The daemon at the endpoint must be this sandbox's: with host networking every sandbox's
        execd binds the same port, so another sandbox's daemon could answer there."""
        loop = asyncio.get_running_loop()
        script = 'if [ -n "$1" ]; then mkdir -p -- "$1" || exit 1; fi; printf %s "${OPENSANDBOX_ID-}"'
        try:
            probe = await self.exec(
                ["/bin/sh", "-c", script, "sh", self.workdir or ""],
                cwd="/",
                timeout=max(deadline - loop.time(), 0.5),
            )
        except SandboxError as exc:
            return f"the readiness probe failed: {exc}", []
        if not probe.ok:
            detail = (
                probe.stderr.decode("utf-8", "replace").strip() or probe.error or f"exit {probe.exit_code}"
            )
            return f"the readiness probe failed: {detail}", []
        answered = probe.text().strip()
        if self.settings.verify_identity and answered and answered != self.sandbox_id:
            return (
                f"the daemon at {self._execd_base} belongs to sandbox {answered!r}, not {self.sandbox_id!r} "
                "(host networking: only one sandbox's execd can own the port)",
                [],
            )
        return None, []

    # ----------------------------------------------------------------------------------- exec

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
        execution_id: str | None = None,
        uid: int | None = None,
        gid: int | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run ``argv`` through execd. ``timeout`` is the hard cap: nothing waits past it.

        ``uid``/``gid`` ask execd to run the command as that user; a refusal execd confirms before
        launching raises ``ExpectedRefusal``. Without them, ``command_uid``/``command_gid`` from
        the settings apply, and a confirmed refusal falls back to the image's default user.
        """
        self._ensure_open("exec")
        check_exec_args(argv, timeout)
        run = _Run(execution_id or new_execution_id(), argv, on_output)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if user is not None and uid is None and gid is None:
            uid, gid = await self._user_ids(user)
        elif uid is None and gid is None and self.user_ids is not None:
            uid, gid = self.user_ids  # asked for in the spec: a refusal must not silently fall back
        explicit_user = uid is not None or gid is not None
        if not explicit_user:
            uid, gid = self.settings.command_uid, self.settings.command_gid
        try:
            async with asyncio.timeout_at(deadline) as cap:
                return await self._exec_flow(
                    run, argv, cwd, env, timeout, stdin, uid, gid, explicit_user, deadline
                )
        except TimeoutError:
            # The cap itself, or a request that found no time left before it.
            if not (cap.expired() or loop.time() >= deadline):
                raise
        return self._hard_cap_result(run, timeout)

    async def _user_ids(self, user: str) -> tuple[int, int | None]:
        """execd takes numeric ids: a name is looked up in the sandbox (``id``)."""
        name, uid, gid = parse_user_spec(user)
        if name is None:
            assert uid is not None
            return uid, gid
        if name == "root":
            return 0, 0
        r = await self.exec(
            ["/bin/sh", "-c", 'id -u -- "$1" && id -g -- "$1"', "sh", name], cwd="/", timeout=30, uid=None
        )
        ids = r.stdout.decode("utf-8", "replace").split()
        if not r.ok or len(ids) != 2 or not all(i.isdigit() for i in ids):
            raise self._file_error("user", f"there is no user {name!r} in sandbox {self.sandbox_id}", r)
        return int(ids[0]), int(ids[1])

    def _hard_cap_result(self, run: _Run, timeout: float) -> ExecResult:
        if run.remote_id is not None:
            when = "while the command ran" + (" (its output stream had broken)" if run.cause else "")
        elif run.submissions:
            when = "before the daemon confirmed the command"
        else:
            when = "before the command was submitted"
        message = (
            f"exec {run.execution_id}: the hard cap of {timeout:g}s expired {when}; the exit was not observed"
        )
        failure = _failure(
            "command_hard_cap_expired",
            stage=FailureStage.AGENT,
            operation="exec",
            message=message,
            cause=run.cause,
            evidence=[*run.evidence, *run.diagnosis.evidence],
            details=run.details(),
        )
        self._observe(failure)
        self._recovered(failure, Recovery.RETURNED_UNOBSERVED)
        return run.result(exit_code=None, observed=False, deadline_expired=True, error=message)

    async def _exec_flow(
        self,
        run: _Run,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        timeout: float,
        stdin: bytes | None,
        uid: int | None,
        gid: int | None,
        explicit_user: bool,
        deadline: float,
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        if self._execd_base is None:
            await self._resolve_execd(deadline)
        stdin_path = None
        if stdin is not None:
            name = f".opencode-tui-stdin-{uuid.uuid4().hex[:16]}"
            stdin_path = f"/tmp/{name}"
            if uid:
                # The command's user must read it, and nobody else: upload it as that user's own
                # (upload_tar extracts as root, so the archive's owner applies).
                owner = (uid, gid if gid is not None else 0)
                await self.upload_tar("/tmp", tarsafe.single_file_tar(name, stdin, 0o600, owner=owner))
            else:
                await self._upload_bytes(stdin_path, stdin, 0o600, operation="exec.stdin", deadline=deadline)
        body: dict[str, Any] = {
            "command": _shell_command(argv, stdin_path),
            "timeout": int((timeout + self.policy.command_timeout_headroom_s) * 1000),
        }
        if cwd or self.workdir:
            body["cwd"] = cwd or self.workdir
        if env:
            body["envs"] = {str(k): str(v) for k, v in env.items()}
        if uid is not None:
            body["uid"] = uid
        if gid is not None:
            body["gid"] = gid
        budget = self.policy.budget("submit")
        while True:
            run.submissions += 1
            try:
                await self._submit_and_stream(run, body)
            except _Rejected as rejected:
                if (
                    400 <= rejected.status < 500
                    and (rejected.code or "").upper()
                    in {c.upper() for c in self.settings.expected_refusal_codes}
                    and ("uid" in body or "gid" in body)
                ):
                    if explicit_user or not self.settings.fallback_to_default_user:
                        raise ExpectedRefusal(
                            f"the sandbox refused to launch {run.argv[0]!r} as uid={body.get('uid')}: {rejected}",
                            operation="exec",
                            code=rejected.code,
                            http_status=rejected.status,
                        ) from None
                    # Confirmed before launch: run as the image's default user instead (no failure).
                    log.info("opensandbox %s: %s; using the image's default user", self.sandbox_id, rejected)
                    body.pop("uid", None)
                    body.pop("gid", None)
                    continue
                failure = self._submit_failure(run, rejected, rejected.status, rejected.code)
            except _StreamBroken as broken:
                run.cause = broken.__cause__ or broken
                if run.remote_id is not None:
                    return await self._recover(run, deadline)
                # No execution id: the command may be running, but nothing identifies it.
                run.delivery = Delivery.POSSIBLY_DELIVERED
                failure = self._submit_failure(run, broken, None, None)
            except httpx.HTTPError as exc:
                failure = self._submit_failure(run, exc, None, None)
            else:
                return run.result(
                    exit_code=run.exit_code,
                    signal=run.signal,
                    observed=run.exit_code is not None or run.signal is not None,
                    error=run.remote_error if run.exit_code is None else None,
                )
            # The submission failed without an execution id.
            status = failure.http_status
            decision = decide_request(self.policy, operation="submit", http_status=status, kind=failure.kind)
            delay = budget.delay(run.submissions)
            if (
                decision.action is OpenSandboxAction.RETRY
                and run.delivery is Delivery.NOT_SENT
                and run.submissions < budget.max_attempts
                and loop.time() + delay < deadline
            ):
                self._observe(failure)  # kept even when the resubmission succeeds
                self._recovered(failure, Recovery.RESUBMITTED)
                await asyncio.sleep(delay)
                continue
            if run.delivery is Delivery.NOT_SENT and status is not None and 400 <= status < 500:
                raise _error(failure, run.cause)
            # Unreachable daemon or uncertain delivery: ask the server what became of the sandbox.
            diagnosis = await self._diagnose(deadline, run.diagnosis)
            raise _error(self._with_diagnosis(failure, diagnosis, run), run.cause)

    def _submit_failure(
        self, run: _Run, exc: BaseException, status: int | None, code: str | None
    ) -> FailureEvent:
        """Kind and delivery of a submission that produced no execution id (protocol facts)."""
        if isinstance(exc, _Rejected):
            if status == 502:
                delivery, kind = Delivery.NOT_SENT, "provider_unavailable"
                what = "the daemon could not be reached (502 before the command started)"
            elif 400 <= (status or 0) < 500:
                delivery = Delivery.NOT_SENT
                kind = (
                    "provider_unavailable"
                    if status in (408, 425, 429)
                    else ("provider_auth_failed" if status == 401 else "command_rejected")
                )
                what = "the daemon refused the command before starting it"
            else:
                delivery, kind = Delivery.POSSIBLY_DELIVERED, "command_delivery_uncertain"
                what = "the daemon answered an error; the command may have started"
        elif isinstance(exc, _StreamBroken):
            delivery, kind = Delivery.POSSIBLY_DELIVERED, "command_delivery_uncertain"
            what = "the answer broke before the daemon named the execution"
        else:
            kind0, delivery = classify_exception(exc)
            kind = kind0 if delivery is Delivery.NOT_SENT else "command_delivery_uncertain"
            what = (
                "the daemon could not be reached; nothing was sent"
                if delivery is Delivery.NOT_SENT
                else "the submission got no answer; the command may have started"
            )
        run.delivery = delivery
        run.cause = exc
        return _failure(
            kind,
            stage=FailureStage.AGENT,
            operation="exec.submit",
            message=f"exec {run.execution_id} ({run.argv[0]!r}), submission {run.submissions}: {what}: {exc}",
            cause=exc,
            http_status=status,
            details=run.details(delivery),
        )

    async def _submit_and_stream(self, run: _Run, body: dict[str, Any]) -> None:
        """POST /command and consume its event stream to ``execution_complete``.

        Raises ``_Rejected`` (an error status before any event), ``httpx.HTTPError`` (no answer),
        or ``_StreamBroken`` (the stream ended or broke before completion; ``run.remote_id`` says
        whether the command was identified).
        """
        s = self.settings
        client = self._http.client()
        timeout = httpx.Timeout(
            None, connect=s.connect_timeout_s, write=s.request_timeout_s, pool=s.request_timeout_s
        )
        headers = {**(self._http.server_headers() if s.use_server_proxy else {}), **self._execd_headers}
        request = client.build_request(
            "POST", self._execd_url("/command"), json=body, headers=headers, timeout=timeout
        )
        response = await client.send(request, stream=True)
        try:
            if response.status_code != 200:
                await response.aread()
                code, excerpt = error_code(response)
                raise _Rejected(response.status_code, code, excerpt)
            buffer = b""
            try:
                async for chunk in response.aiter_raw():
                    buffer += chunk
                    while True:
                        frame, sep, rest = buffer.partition(b"\n\n")
                        if not sep:
                            break
                        buffer = rest
                        if await self._on_frame(run, frame):
                            return
            except httpx.HTTPError as exc:
                raise _StreamBroken(f"the command's event stream broke: {type(exc).__name__}: {exc}") from exc
            if buffer.strip() and await self._on_frame(run, buffer):
                return
            raise _StreamBroken("the command's event stream ended before execution_complete")
        finally:
            await response.aclose()

    async def _on_frame(self, run: _Run, frame: bytes) -> bool:
        """Handle one event frame (bare JSON, or SSE ``data:`` lines); True once complete."""
        text = frame.decode("utf-8", "replace").strip()
        if not text:
            return False
        if text.startswith(("data:", "event:", "id:", ":")):
            text = "\n".join(line[5:].lstrip() for line in text.splitlines() if line.startswith("data:"))
            if not text:
                return False
        try:
            event = json.loads(text)
        except ValueError:
            run.notes.append(f"an unparseable event was skipped: {text[:80]!r}")
            return False
        if not isinstance(event, dict):
            return False
        kind = event.get("type")
        if kind == "init":
            if run.remote_id is None and isinstance(event.get("text"), str) and event["text"]:
                run.remote_id = event["text"]
                run.delivery = Delivery.DELIVERED
                self.remote_ids[run.execution_id] = run.remote_id
        elif kind in ("stdout", "stderr"):
            await run.emit(kind, str(event.get("text") or "").encode())
        elif kind == "error":
            err = event.get("error") if isinstance(event.get("error"), dict) else {}
            run.set_exit(err.get("evalue", ""))
            if run.exit_code is None and err.get("ename"):
                run.remote_error = f"{err.get('ename')}: {run.remote_error or ''}".strip()
        elif kind == "execution_complete":
            if run.exit_code is None and run.signal is None and run.remote_error is None:
                run.exit_code = 0
            run.completed = True
            return True
        return False

    async def _recover(self, run: _Run, deadline: float) -> ExecResult:
        """The stream broke after the command was identified: follow its execution id (status, then
        logs). Never resubmits. Runs inside the caller's hard cap."""
        loop = asyncio.get_running_loop()
        remote = run.remote_id
        assert remote is not None
        stream_lost = _failure(
            "command_stream_lost",
            stage=FailureStage.AGENT,
            operation="exec.stream",
            message=f"exec {run.execution_id} (execd {remote}): {run.cause}; following the execution id",
            cause=run.cause,
            details=run.details(Delivery.DELIVERED),
        )
        self._observe(stream_lost)
        recovery = self.policy.status_recovery
        lost_reason = "status recovery is disabled by policy"
        lost_cause: BaseException | None = run.cause
        if recovery.enabled:
            poll = recovery.poll_initial_s
            while True:
                try:
                    response = await self._execd_request(
                        "status",
                        "GET",
                        f"/command/status/{remote}",
                        timeout=self.settings.request_timeout_s,
                        deadline=deadline,
                        default_kind="command_status_lost",
                        not_found_kind="command_status_lost",
                    )
                    status = response.json()
                except RequestFailed as exc:
                    lost_reason, lost_cause = f"the command's status could not be read: {exc}", exc
                    break
                except ValueError as exc:
                    lost_reason, lost_cause = "the command's status was not JSON", exc
                    break
                if not isinstance(status, dict) or not isinstance(status.get("running"), bool):
                    lost_reason = f"the command's status has no 'running' field: {str(status)[:200]}"
                    break
                if not status["running"]:
                    code, error = status.get("exit_code"), status.get("error")
                    if isinstance(code, int) and code >= 0:
                        run.exit_code = code
                    elif error:
                        run.set_exit(error)
                    else:
                        lost_reason = f"the command ended but its status names no exit: {str(status)[:200]}"
                        break
                    await self._recover_logs(run, remote, deadline)
                    self._recovered(stream_lost, Recovery.FOLLOWED_EXECUTION_ID)
                    run.notes.append(
                        "the output stream broke; the exit was read by execution id"
                        + (
                            ""
                            if not recovery.fetch_logs
                            else "; later output comes from the command's combined log"
                        )
                    )
                    return run.result(
                        exit_code=run.exit_code,
                        signal=run.signal,
                        observed=True,
                        error=run.remote_error if run.exit_code is None else None,
                    )
                await asyncio.sleep(max(min(poll, deadline - loop.time()), 0))
                poll = min(poll * recovery.multiplier, recovery.poll_max_s)
        failure = _failure(
            "command_status_lost",
            stage=FailureStage.AGENT,
            operation="exec.status",
            message=f"exec {run.execution_id} (execd {remote}): {lost_reason}",
            cause=lost_cause,
            http_status=getattr(lost_cause, "http_status", None),
            details=run.details(Delivery.DELIVERED),
        )
        run.cause = lost_cause
        diagnosis = await self._diagnose(deadline, run.diagnosis)
        raise _error(self._with_diagnosis(failure, diagnosis, run), lost_cause)

    async def _recover_logs(self, run: _Run, remote: str, deadline: float) -> None:
        if not self.policy.status_recovery.fetch_logs:
            return
        try:
            response = await self._execd_request(
                "status",
                "GET",
                f"/command/{remote}/logs",
                timeout=self.settings.request_timeout_s,
                deadline=deadline,
                default_kind="command_status_lost",
            )
        except (RequestFailed, TimeoutError) as exc:
            run.notes.append(
                f"the command's log could not be read ({exc}); output after the break is missing"
            )
            return
        log_bytes = response.content
        streamed = run.combined.value()
        if run.combined.total == len(streamed) and log_bytes.startswith(streamed):
            await run.emit("stdout", log_bytes[len(streamed) :])
        else:
            run.notes.append("the command's log does not continue the streamed output; it was not merged")

    # ------------------------------------------------------------------------------- diagnosis

    async def _diagnose(self, deadline: float, into: Diagnosis | None = None) -> Diagnosis:
        """The shared entry point for exec and PTY diagnosis, inside ``deadline`` (the caller's
        remaining time: a repeated call never gets a fresh budget beyond it)."""
        return await self._diagnoser.diagnose(deadline, into)

    def _lost_failure(
        self,
        diagnosis: Diagnosis,
        *,
        default_kind: str,
        operation: str,
        what: str,
        cause: BaseException | None = None,
        details: FailureDetails | None = None,
    ) -> FailureEvent:
        """The failure a diagnosis supports: OOM (confirmed), lost (terminal/gone), else the default."""
        if diagnosis.oom is not None:
            return _failure(
                "provider_oom_killed",
                stage=FailureStage.AGENT,
                operation=operation,
                message=f"{what}: the sandbox was OOM-killed (confirmed by {diagnosis.oom.source}: "
                f"{diagnosis.oom.data.get('endpoint') or diagnosis.oom.data.get('reason')})",
                cause=cause,
                evidence=diagnosis.evidence,
                details=OomDetails(
                    container_id=self.sandbox_id,
                    memory_limit_bytes=self.memory_bytes,
                    exit_code=diagnosis.oom.data.get("exit_code"),
                ),
            )
        if diagnosis.terminal:
            state = "gone" if diagnosis.gone else diagnosis.state
            return _failure(
                "sandbox_lost",
                stage=FailureStage.AGENT,
                operation=operation,
                message=f"{what}: the sandbox is {state} (no OOM report"
                + (", diagnosis deadline reached" if diagnosis.deadline_reached else "")
                + ")",
                cause=cause,
                evidence=diagnosis.evidence,
                details=details,
            )
        return _failure(
            default_kind,
            stage=FailureStage.AGENT,
            operation=operation,
            message=what
            + (" (diagnosis deadline reached)" if diagnosis.deadline_reached else "")
            + (f"; sandbox state {diagnosis.state}" if diagnosis.state else ""),
            cause=cause,
            evidence=diagnosis.evidence,
            details=details,
        )

    def _with_diagnosis(self, failure: FailureEvent, diagnosis: Diagnosis, run: _Run) -> FailureEvent:
        """Re-type a command failure by what the diagnosis confirmed (the original stays the cause)."""
        if diagnosis.oom is None and not diagnosis.terminal:
            return failure.model_copy(update={"evidence": [*failure.evidence, *diagnosis.evidence]})
        typed = self._lost_failure(
            diagnosis,
            default_kind=failure.kind,
            operation=failure.operation,
            what=failure.message,
            cause=run.cause,
            details=failure.details,
        )
        return typed.model_copy(update={"http_status": failure.http_status})

    # ----------------------------------------------------------------------------------- pty

    async def _pty_socket(self, session_id: str, *, since: int = 0) -> Any:
        from websockets.asyncio.client import connect

        if self._execd_base is None:
            await self._resolve_execd()
        base = self._execd_url(f"/pty/{session_id}/ws")
        uri = re.sub(r"^http", "ws", base) + f"?pty=1&since={since}"
        headers = {
            **(self._http.server_headers() if self.settings.use_server_proxy else {}),
            **self._execd_headers,
        }
        return await connect(
            uri,
            additional_headers=headers or None,
            open_timeout=PTY_OPEN_TIMEOUT_S,
            max_size=None,
            ping_interval=None,
            proxy=None,
        )

    async def pty(
        self, argv: Sequence[str], *, cols: int = 80, rows: int = 24, cwd: str | None = None
    ) -> PtyHandle:
        self._ensure_open("pty")
        if not argv:
            raise ValueError("argv must not be empty")
        ids = self.user_ids or (
            (self.settings.command_uid, self.settings.command_gid)
            if self.settings.command_uid is not None
            else None
        )
        if ids is not None:
            # execd's terminal takes no uid/gid: the terminal drops to the sandbox user itself.
            uid, gid = ids[0], ids[1] if ids[1] is not None else 0
            argv = ["/bin/sh", "-c", _DROP_TO_USER_SH.format(uid=uid, gid=gid), "sh", *argv]

        async def not_sent(failed: RequestFailed) -> bool:
            # POST /pty starts a process: a request that may have reached the daemon is never sent
            # again (a second terminal would run beside the first, unseen).
            return failed.delivery is Delivery.NOT_SENT

        try:
            response = await self._execd_request(
                "pty",
                "POST",
                "/pty",
                json={
                    "command": shlex.join(argv),
                    **({"cwd": cwd or self.workdir} if (cwd or self.workdir) else {}),
                },
                timeout=PTY_OPEN_TIMEOUT_S,
                default_kind="sandbox_pty_failed",
                retry_gate=not_sent,
            )
            session_id = response.json()["session_id"]
            ws = await self._pty_socket(session_id)
        except RequestFailed as exc:
            uncertain = (
                exc.operation == "pty" and exc.method == "POST" and exc.delivery is not Delivery.NOT_SENT
            )
            raise _error(
                exc.failure(
                    stage=FailureStage.AGENT,
                    operation="pty.open",
                    kind="sandbox_pty_failed" if uncertain else None,
                    message=(
                        f"opening a terminal failed: {exc}"
                        + (
                            f" (after {exc.attempts} request(s); the last may have reached the daemon, so a "
                            "terminal may exist there; it was not requested again)"
                            if uncertain
                            else ""
                        )
                    ),
                ),
                exc,
            ) from exc
        except Exception as exc:
            failure = _failure(
                "sandbox_pty_failed",
                stage=FailureStage.AGENT,
                operation="pty.open",
                message=f"opening a terminal ({argv[0]!r}) failed: {type(exc).__name__}: {exc}",
                cause=exc,
            )
            raise _error(failure, exc) from exc
        handle = OpenSandboxPty(self, session_id, ws)
        self._ptys.add(handle)
        try:
            await handle.resize(cols, rows)
        except SandboxError:
            # A short-lived command can end (and its socket close) before the first resize: the
            # terminal opened, and its reader reports the exit. Any other resize failure is real.
            if getattr(ws, "close_code", None) is None:
                raise
        return handle

    # --------------------------------------------------------------------------------- files

    async def _upload_bytes(
        self, path: str, data: bytes, mode: int, *, operation: str = "upload", deadline: float | None = None
    ) -> None:
        metadata = json.dumps({"path": path, "mode": int(f"{mode & 0o7777:o}")})
        try:
            await self._execd_request(
                "upload",
                "POST",
                "/files/upload",
                files={
                    "metadata": (None, metadata, "application/json"),
                    "file": (PurePosixPath(path).name, data, "application/octet-stream"),
                },
                timeout=self.settings.file_timeout_s,
                deadline=deadline,
                default_kind="sandbox_file_failed",
            )
        except RequestFailed as exc:
            raise _error(
                exc.failure(
                    stage=FailureStage.SEED, operation=operation, message=f"upload of {path!r} failed: {exc}"
                ),
                exc,
            ) from exc

    async def upload_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._ensure_open("upload")
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"path must be absolute inside the sandbox, got {path!r}")
        await self._upload_bytes(path, data, mode)

    async def download_file(self, path: str) -> bytes:
        self._ensure_open("download")
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"path must be absolute inside the sandbox, got {path!r}")
        try:
            response = await self._execd_request(
                "download",
                "GET",
                "/files/download",
                params={"path": path},
                timeout=self.settings.file_timeout_s,
                default_kind="sandbox_file_failed",
            )
        except RequestFailed as exc:
            failure = exc.failure(
                stage=FailureStage.SEED, operation="download", message=f"download of {path!r} failed: {exc}"
            )
            if exc.http_status == 404:
                raise SandboxFileNotFoundError(
                    f"download: {path!r} does not exist in sandbox {self.sandbox_id}", failure=failure
                ) from exc
            raise _error(failure, exc) from exc
        return response.content

    def _file_error(self, operation: str, message: str, result: ExecResult | None = None) -> SandboxError:
        detail = ""
        if result is not None:
            detail = (
                result.stderr.decode("utf-8", "replace").strip() or result.error or f"exit {result.exit_code}"
            )
        return SandboxError(
            f"{message}: {detail}" if detail else message,
            failure=_failure(
                "sandbox_file_failed",
                stage=FailureStage.SEED,
                operation=operation,
                message=f"{message}: {detail}" if detail else message,
            ),
        )

    async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
        self._ensure_open("upload")
        if not PurePosixPath(dest_dir).is_absolute():
            raise ValueError(f"dest_dir must be an absolute path inside the sandbox, got {dest_dir!r}")
        tarsafe.check_archive(archive)  # raises UnsafeArchiveError before anything is written
        tmp = f"/tmp/.opencode-tui-upload-{uuid.uuid4().hex[:16]}.tar"
        await self._upload_bytes(tmp, archive, 0o600)
        script = 'mkdir -p -- "$1" && tar -xf "$2" -C "$1"; rc=$?; rm -f -- "$2"; exit $rc'
        argv = ["/bin/sh", "-c", script, "sh", dest_dir, tmp]
        result = None
        if self.user_ids is not None or self.settings.command_uid is not None:
            # Commands run as a chosen user: extract as root so the archive's owners and modes
            # apply (as that user, tar could neither chown nor set the mode of a root-owned target).
            with contextlib.suppress(ExpectedRefusal):
                result = await self.exec(argv, cwd="/", timeout=self.settings.file_timeout_s, uid=0, gid=0)
        if result is None:
            result = await self.exec(argv, cwd="/", timeout=self.settings.file_timeout_s)
        if not result.ok:
            raise self._file_error("upload", f"extracting into {dest_dir!r} failed", result)

    async def download_tar(self, path: str) -> bytes:
        self._ensure_open("download")
        p = PurePosixPath(path)
        if not p.is_absolute():
            raise ValueError(f"path must be absolute inside the sandbox, got {path!r}")
        parent, name = (str(p.parent), p.name) if p.name else ("/", ".")
        tmp = f"/tmp/.opencode-tui-download-{uuid.uuid4().hex[:16]}.tar"
        script = f'[ -e "$1/$2" ] || [ -L "$1/$2" ] || exit {NOT_FOUND_EXIT}; tar -cf "$3" -C "$1" -- "$2"'
        result = await self.exec(
            ["/bin/sh", "-c", script, "sh", parent, name, tmp], cwd="/", timeout=self.settings.file_timeout_s
        )
        try:
            if result.observed and result.exit_code == NOT_FOUND_EXIT:
                message = f"download: {path!r} does not exist in sandbox {self.sandbox_id}"
                raise SandboxFileNotFoundError(
                    message,
                    failure=_failure(
                        "sandbox_file_failed", stage=FailureStage.SEED, operation="download", message=message
                    ),
                )
            if not result.ok:
                raise self._file_error("download", f"archiving {path!r} failed", result)
            archive = await self.download_file(tmp)
        finally:
            if result.observed:
                with contextlib.suppress(SandboxError):
                    await self.exec(["rm", "-f", "--", tmp], cwd="/", timeout=30)
        tarsafe.check_archive(archive)
        return archive

    # -------------------------------------------------------------------------- lifecycle API

    async def lifecycle(self) -> dict[str, Any]:
        """The server's record of this sandbox (``GET /sandboxes/{id}``)."""
        response = await self._sandbox_request("read", "GET", "", operation="status")
        return response.json()

    async def _sandbox_request(
        self, op: str, method: str, subpath: str, *, operation: str, **kwargs: Any
    ) -> httpx.Response:
        """A lifecycle-API request about this sandbox; a 404 means the sandbox is gone."""
        try:
            return await self._http.request(
                op,
                method,
                self._provider.api_url(f"/sandboxes/{self.sandbox_id}{subpath}"),
                timeout=self.settings.request_timeout_s,
                not_found_kind="sandbox_lost",
                **kwargs,
            )
        except RequestFailed as exc:
            raise _error(exc.failure(stage=FailureStage.AGENT, operation=operation), exc) from exc

    async def renew(self, seconds: float) -> datetime:
        """Move the server-side expiry to ``now + seconds``; returns the new expiry."""
        self._ensure_open("renew")
        expires = _now() + timedelta(seconds=seconds)
        response = await self._sandbox_request(
            "renew",
            "POST",
            "/renew-expiration",
            operation="renew",
            json={"expiresAt": expires.isoformat().replace("+00:00", "Z")},
            default_kind="sandbox_lost",
        )
        value = response.json().get("expiresAt")
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else expires

    async def endpoint(self, port: int) -> tuple[str, dict[str, str]]:
        """The address (and extra headers) the server gives for ``port`` inside the sandbox."""
        self._ensure_open("endpoint")
        response = await self._sandbox_request("read", "GET", f"/endpoints/{port}", operation="endpoint")
        body = response.json()
        return str(body.get("endpoint")), dict(body.get("headers") or {})

    async def command_status(self, execution_id: str) -> dict[str, Any]:
        """execd's status of a command, by our execution id or execd's own."""
        self._ensure_open("command status")
        remote = self.remote_ids.get(execution_id, execution_id)
        try:
            response = await self._execd_request(
                "status",
                "GET",
                f"/command/status/{remote}",
                timeout=self.settings.request_timeout_s,
                not_found_kind="command_status_lost",
                default_kind="command_status_lost",
            )
        except RequestFailed as exc:
            raise _error(exc.failure(stage=FailureStage.AGENT, operation="command.status"), exc) from exc
        return response.json()

    async def command_logs(self, execution_id: str, cursor: int | None = None) -> tuple[bytes, int | None]:
        """A command's combined output from line ``cursor`` on, and the cursor for the next read."""
        self._ensure_open("command logs")
        remote = self.remote_ids.get(execution_id, execution_id)
        try:
            response = await self._execd_request(
                "status",
                "GET",
                f"/command/{remote}/logs",
                params={"cursor": cursor} if cursor is not None else None,
                timeout=self.settings.request_timeout_s,
                not_found_kind="command_status_lost",
                default_kind="command_status_lost",
            )
        except RequestFailed as exc:
            raise _error(exc.failure(stage=FailureStage.AGENT, operation="command.logs"), exc) from exc
        tail = response.headers.get("EXECD-COMMANDS-TAIL-CURSOR")
        return response.content, int(tail) if tail and tail.isdigit() else None

    async def interrupt(self, execution_id: str) -> None:
        """Ask execd to stop a command (by our execution id or execd's)."""
        self._ensure_open("interrupt")
        remote = self.remote_ids.get(execution_id, execution_id)
        try:
            await self._execd_request(
                "interrupt",
                "DELETE",
                "/command",
                params={"id": remote},
                timeout=self.settings.request_timeout_s,
                default_kind="command_failed",
            )
        except RequestFailed as exc:
            raise _error(exc.failure(stage=FailureStage.AGENT, operation="command.interrupt"), exc) from exc

    # ------------------------------------------------------------------------------ evidence

    async def inspect(self) -> list[Evidence]:
        """Lifecycle and the events descriptor (for people: it confirms an OOM only when
        ``oom_from_diagnostics`` admits it), plus the deprecated inspect text when that is on;
        within 10 s."""
        self._ensure_open("inspect")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + INSPECT_DEADLINE_S
        evidence: list[Evidence] = []
        with contextlib.suppress(TimeoutError):
            ev, _state, gone = await self._diagnoser.lifecycle(deadline)
            evidence.append(ev)
            if not gone:
                evidence.append(await self._diagnoser.events(deadline))
                if self.settings.oom_from_diagnostics:
                    evidence.append(await self._diagnoser.inspect_text(deadline))
        return evidence

    async def status(self) -> SandboxStatus:
        base = {
            "sandbox_id": self.sandbox_id,
            "provider": self.provider,
            "owned": self.owned,
            "memory_limit_enforced": bool(self.memory_bytes) or None,
        }
        if self._closed:
            return SandboxStatus(state=SandboxState.RELEASED, **base)
        loop = asyncio.get_running_loop()
        ev, state, gone = await self._diagnoser.lifecycle(
            loop.time() + self.settings.request_timeout_s, operation="read"
        )
        notes = [
            "network: decided by the OpenSandbox server's runtime settings; the model-only policy "
            "is not enforced by this provider (the model proxy is reached by URL)"
        ]
        if self.memory_bytes:
            notes.append(f"memory limit requested from the server: {self.memory_bytes} bytes")
        if gone:
            sandbox_state = SandboxState.GONE
        else:
            sandbox_state = _STATE_MAP.get(state or "", SandboxState.UNKNOWN)
            if sandbox_state is SandboxState.UNKNOWN:
                notes.append(
                    f"opensandbox state {state!r}"
                    + (f" ({ev.data['error']})" if ev.data.get("error") else "")
                )
        return SandboxStatus(state=sandbox_state, notes=notes, evidence=[ev], **base)

    async def probe(self, timeout: float) -> SandboxProbe:
        """The server's answer about this sandbox, also after release (issue 19: engine lost)."""
        from core.sandbox.opensandbox.probe import probe_sandbox

        return await probe_sandbox(self, timeout)

    # ------------------------------------------------------------------------------- release

    async def release(self) -> None:
        async with self._release_lock:
            self._closed = True
            for handle in list(self._ptys):
                if self.owned:
                    handle.close_now()  # deleting the sandbox ends its processes
                else:
                    await handle.close()  # borrowed: end only the terminals we opened
            self._ptys.clear()
            if not self.owned or self._deleted:
                return  # borrowed: disconnect only
            try:
                await self._provider._delete(self.sandbox_id)
            except RequestFailed as exc:
                raise _error(
                    exc.failure(
                        stage=FailureStage.CLEANUP,
                        operation="release",
                        # An unreachable server stays provider_unavailable: the close waits for it.
                        kind=exc.kind
                        if exc.kind == "provider_auth_failed"
                        or (exc.kind == "provider_unavailable" and exc.transport)
                        else "sandbox_release_failed",
                        message=f"deleting sandbox {self.sandbox_id} failed: {exc}",
                    ),
                    exc,
                ) from exc
            self._deleted = True


# ==================================================================================================


class OpenSandboxProvider(SandboxProvider):
    """Sandboxes from an OpenSandbox server (lifecycle API) driven through execd.

    ``main_argv`` replaces the sandbox's entrypoint (default from the settings); ``api_key``
    overrides the key read from ``settings.api_key_env``; ``event_hooks`` go to httpx (tests use
    them to see every request made).
    """

    name = "opensandbox"

    def __init__(
        self,
        settings: OpenSandboxSettings | None = None,
        *,
        api_key: str | None = None,
        owner: str | None = None,
        default_image: str = DEFAULT_IMAGE,
        main_argv: Sequence[str] | None = None,
        event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None,
    ):
        self.settings = settings or OpenSandboxSettings()
        self.policy = merged_policy(DEFAULT_OPENSANDBOX_POLICY, self.settings.policy)
        if api_key is None and self.settings.api_key_env:
            api_key = os.environ.get(self.settings.api_key_env) or None
        self._http = Http(self.settings, self.policy, api_key=api_key, event_hooks=event_hooks)
        self.owner = owner or default_owner()
        self.default_image = default_image
        self.main_argv = list(main_argv) if main_argv else list(self.settings.entrypoint)
        self.server_version: str | None = None

    def api_url(self, path: str) -> str:
        return f"{self.settings.url}{self.settings.api_prefix}{path}"

    async def aclose(self) -> None:
        """Close this event loop's HTTP connections."""
        await self._http.aclose()

    async def _fetch_version(self) -> None:
        if self.server_version is not None:
            return
        with contextlib.suppress(Exception):
            response = await self._http.client().get(
                f"{self.settings.url}/version", timeout=self._http.timeout(self.settings.request_timeout_s)
            )
            if response.is_success:
                self.server_version = str(response.json().get("version") or "") or None

    def _translate(
        self, exc: RequestFailed, *, stage: FailureStage, operation: str, what: str
    ) -> SandboxError:
        hint = ""
        if exc.kind == "provider_unavailable" and exc.transport:
            hint = f"; is the OpenSandbox server running at {self.settings.url}?"
        elif exc.kind == "provider_auth_failed":
            hint = f"; check the API key (settings.api_key_env={self.settings.api_key_env!r})"
        return _error(exc.failure(stage=stage, operation=operation, message=f"{what}: {exc}{hint}"), exc)

    # ------------------------------------------------------------------------------ create

    def _create_body(self, spec: SandboxSpec, nonce: str) -> dict[str, Any]:
        metadata = {k: label_value(v) for k, v in spec.labels.items()}
        metadata.update(
            {
                LABEL_RUN: label_value(spec.run_id),
                LABEL_OWNER: label_value(self.owner),
                LABEL_INVOCATION: label_value(invocation_id()),
                LABEL_CREATE: nonce,
            }
        )
        body: dict[str, Any] = {
            "image": {"uri": spec.image or self.default_image},
            "entrypoint": self.main_argv,
            "resourceLimits": {
                "cpu": _cpu_quantity(spec.cpus) if spec.cpus else self.settings.default_cpu,
                "memory": _memory_quantity(spec.memory_bytes)
                if spec.memory_bytes
                else self.settings.default_memory,
            },
            "metadata": metadata,
            "timeout": self.settings.sandbox_timeout_s,
        }
        if spec.env:
            body["env"] = dict(spec.env)
        if spec.mounts:
            body["volumes"] = [
                {"name": f"m{i}", "host": {"path": m.source}, "mountPath": m.target, "readOnly": m.read_only}
                for i, m in enumerate(spec.mounts)
            ]
        return body

    async def _find_by_label(
        self, key: str, value: str, *, deadline: float | None = None
    ) -> list[dict[str, Any]]:
        """Every sandbox whose metadata has ``key=value`` (all pages)."""
        out: list[dict[str, Any]] = []
        page = 1
        while True:
            response = await self._http.request(
                "read",
                "GET",
                self.api_url("/sandboxes"),
                params={"metadata": f"{key}={value}", "page": page, "pageSize": 100},
                timeout=self.settings.request_timeout_s,
                deadline=deadline,
            )
            body = response.json()
            items = body.get("items") if isinstance(body, dict) else None
            out.extend(
                i
                for i in (items or [])
                if isinstance(i, dict) and (i.get("metadata") or {}).get(key) == value
            )
            pagination = body.get("pagination") if isinstance(body, dict) else None
            if (
                not items
                or not isinstance(pagination, dict)
                or not pagination.get("hasNextPage")
                or page >= 100
            ):
                return out
            page += 1

    async def _remove_by_nonce(self, nonce: str) -> bool:
        """Delete whatever a failed create attempt left behind; True when nothing remains."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLEANUP_DEADLINE_S
        try:
            for item in await self._find_by_label(LABEL_CREATE, nonce, deadline=deadline):
                await self._delete(str(item.get("id")), deadline=deadline)
            return True
        except (RequestFailed, TimeoutError) as exc:
            log.warning(
                "could not check or remove what create attempt %s left (sweep will find it): %s", nonce, exc
            )
            return False

    async def _delete(self, sandbox_id: str, *, deadline: float | None = None) -> None:
        await self._http.request(
            "delete",
            "DELETE",
            self.api_url(f"/sandboxes/{sandbox_id}"),
            timeout=self.settings.delete_timeout_s,
            deadline=deadline,
            accept=(404,),
            default_kind="sandbox_release_failed",
        )

    async def create(self, spec: SandboxSpec) -> OpenSandboxSandbox:
        stage, op = FailureStage.SEED, "create"
        await self._fetch_version()
        nonce = uuid.uuid4().hex[:16]
        body = self._create_body(spec, nonce)
        cleaned: set[str] = set()

        async def may_retry(failed: RequestFailed) -> bool:
            # A create that may have landed is retried only once nothing of it remains.
            if failed.delivery is Delivery.NOT_SENT:
                return True
            if await self._remove_by_nonce(nonce):
                cleaned.add(nonce)
                return True
            return False

        try:
            response = await self._http.request(
                "create",
                "POST",
                self.api_url("/sandboxes"),
                json=body,
                timeout=self.settings.create_timeout_s,
                default_kind="sandbox_allocation_failed",
                retry_gate=may_retry,
            )
        except RequestFailed as exc:
            if exc.delivery is not Delivery.NOT_SENT and nonce not in cleaned:
                await self._remove_by_nonce(nonce)  # a half-created sandbox must not outlive us
            kind = "provider_image_missing" if _image_missing(exc) else exc.kind
            error = self._translate(exc, stage=stage, operation=op, what="creating the sandbox failed")
            assert error.failure is not None
            error.failure = error.failure.model_copy(
                update={
                    "kind": kind,
                    "message": error.failure.message
                    + (
                        f" (image {body['image']['uri']!r}: build it locally, e.g. scripts/build-images)"
                        if kind == "provider_image_missing"
                        else ""
                    ),
                }
            )
            raise error from exc
        created = response.json()
        sandbox_id = created.get("id") if isinstance(created, dict) else None
        if not isinstance(sandbox_id, str) or not sandbox_id:
            await self._remove_by_nonce(nonce)
            message = f"the server's create answer names no sandbox id: {str(created)[:300]}"
            raise SandboxError(
                message,
                failure=_failure("provider_protocol_error", stage=stage, operation=op, message=message),
            )
        sandbox = OpenSandboxSandbox(
            self,
            sandbox_id,
            owned=True,
            workdir=spec.workdir,
            memory_bytes=spec.memory_bytes,
            oom_at_connect=False,
        )
        try:
            reason, evidence = await sandbox._become_ready(spec.ready_timeout_s)
            if reason is None and spec.user:
                sandbox.user_ids = await sandbox._user_ids(spec.user)
        except BaseException:
            await self._release_quietly(sandbox)
            raise
        if reason is not None:
            loop = asyncio.get_running_loop()
            with contextlib.suppress(TimeoutError):
                if not evidence:
                    ev, _s, _g = await sandbox._diagnoser.lifecycle(loop.time() + 5.0, operation="read")
                    evidence.append(ev)
                evidence.append(await self._container_logs(sandbox_id, loop.time() + 5.0))
            deleted, delete_error = await self._release_quietly(sandbox)
            message = (
                f"sandbox {sandbox_id} did not become ready within {spec.ready_timeout_s:g}s: {reason}; "
                + (
                    "it was deleted"
                    if deleted
                    else f"deleting it failed ({delete_error}); sweep will find it"
                )
            )
            raise SandboxError(
                message,
                failure=_failure(
                    "sandbox_not_ready",
                    stage=stage,
                    operation=op,
                    message=message,
                    evidence=evidence,
                    details=GenericDetails(
                        data={
                            "sandbox_id": sandbox_id,
                            "reason": reason,
                            "ready_timeout_s": spec.ready_timeout_s,
                            "execd_endpoint": sandbox._execd_base,
                            "deleted": deleted,
                            "delete_error": delete_error,
                        }
                    ),
                ),
            )
        if spec.network is NetworkPolicy.MODEL_ONLY:
            log.debug("opensandbox %s: the model-only network policy is the server's to enforce", sandbox_id)
        return sandbox

    async def _container_logs(self, sandbox_id: str, deadline: float) -> Evidence:
        from core.sandbox.oom import SOURCE_OS_DIAGNOSTICS

        try:
            response = await self._http.request(
                "diagnostics",
                "GET",
                self.api_url(f"/sandboxes/{sandbox_id}/diagnostics/logs"),
                params={"scope": "container"},
                timeout=max(deadline - asyncio.get_running_loop().time(), 0.1),
                deadline=deadline,
            )
            content = response.json().get("content")
        except (RequestFailed, ValueError, AttributeError) as exc:
            return Evidence(
                source=SOURCE_OS_DIAGNOSTICS,
                scope=sandbox_id,
                data={"endpoint": "diagnostics/logs", "error": str(exc)[:500]},
            )
        text = content if isinstance(content, str) else ""
        return Evidence(
            source=SOURCE_OS_DIAGNOSTICS,
            scope=sandbox_id,
            data={"endpoint": "diagnostics/logs", "content_excerpt": text[-2000:]},
        )

    async def _release_quietly(self, sandbox: OpenSandboxSandbox) -> tuple[bool, str | None]:
        try:
            await sandbox.release()
        except Exception as exc:
            log.warning(
                "could not delete half-created sandbox %s (sweep will find it): %s", sandbox.sandbox_id, exc
            )
            return False, str(exc)
        return True, None

    # ----------------------------------------------------------------------------- connect

    async def connect(self, sandbox_id: str) -> OpenSandboxSandbox:
        stage, op = FailureStage.SEED, "connect"
        await self._fetch_version()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_DEADLINE_S
        try:
            response = await self._http.request(
                "read",
                "GET",
                self.api_url(f"/sandboxes/{sandbox_id}"),
                timeout=self.settings.request_timeout_s,
                deadline=deadline,
                not_found_kind="sandbox_lost",
            )
        except RequestFailed as exc:
            raise self._translate(
                exc, stage=stage, operation=op, what=f"connecting to sandbox {sandbox_id!r}"
            ) from exc
        body = response.json()
        state = ((body.get("status") or {}) if isinstance(body, dict) else {}).get("state")
        if state in TERMINAL_STATES:
            message = f"sandbox {sandbox_id!r} is {state}; nothing to connect to"
            raise SandboxError(
                message,
                failure=_failure(
                    "sandbox_lost",
                    stage=stage,
                    operation=op,
                    message=message,
                    evidence=[
                        lifecycle_evidence(
                            sandbox_id,
                            body,
                            server_version=self.server_version,
                            oom_reason_codes=self.settings.oom_reason_codes,
                        )
                    ],
                ),
            )
        sandbox = OpenSandboxSandbox(self, sandbox_id, owned=False)
        # A borrowed sandbox may have been OOM-killed before we came: remember that as the baseline
        # (only the diagnostics reports keep a flag from before; read only when they may confirm).
        if self.settings.oom_from_diagnostics:
            with contextlib.suppress(TimeoutError):
                baseline = await sandbox._diagnoser.events(min(deadline, loop.time() + 5.0))
                if baseline.data.get("subject") == sandbox_id and baseline.data.get("OOMKilled") is not None:
                    sandbox._diagnoser.oom_at_connect = bool(baseline.data["OOMKilled"])
        try:
            await sandbox._resolve_execd(deadline)
            await sandbox._execd_request(
                "ping", "GET", "/ping", timeout=READY_PING_TIMEOUT_S * 5, deadline=deadline
            )
        except RequestFailed as exc:
            raise self._translate(
                exc, stage=stage, operation=op, what=f"the daemon of sandbox {sandbox_id!r} does not answer"
            ) from exc
        return sandbox

    # ------------------------------------------------------------------------------- sweep

    async def sweep(self, *, dry_run: bool = False, owner: str | None = None) -> list[str]:
        stage, op = FailureStage.CLEANUP, "sweep"
        ids = [record.sandbox_id for record in await self.listed(owner=owner)]
        if dry_run:
            return ids
        removed: list[str] = []
        failures: list[str] = []
        for sid in ids:
            try:
                await self._delete(sid)
            except RequestFailed as exc:
                failures.append(f"{sid}: {exc}")
                continue
            removed.append(sid)
        if failures:
            message = f"sweep removed {len(removed)} sandbox(es) but failed on {len(failures)}: " + "; ".join(
                failures
            )
            raise SandboxError(
                message,
                failure=_failure("sandbox_release_failed", stage=stage, operation=op, message=message),
            )
        return removed

    async def listed(self, *, owner: str | None = None) -> list[SandboxRecord]:
        try:
            if owner is not None:
                items = await self._find_by_label(LABEL_OWNER, label_value(owner))
            else:
                items = await self._list_all()
        except RequestFailed as exc:
            raise self._translate(
                exc, stage=FailureStage.CLEANUP, operation="list", what="listing sandboxes failed"
            ) from exc
        return [
            SandboxRecord(
                provider=self.name,
                sandbox_id=str(i["id"]),
                labels={str(k): str(v) for k, v in (i.get("metadata") or {}).items()},
            )
            for i in items
            if isinstance(i.get("id"), str) and LABEL_OWNER in (i.get("metadata") or {})
        ]

    async def remove(self, sandbox_id: str) -> None:
        try:
            await self._delete(sandbox_id)
        except RequestFailed as exc:
            raise self._translate(
                exc, stage=FailureStage.CLEANUP, operation="remove", what=f"deleting sandbox {sandbox_id}"
            ) from exc

    async def _list_all(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        page = 1
        while page <= 100:
            response = await self._http.request(
                "read",
                "GET",
                self.api_url("/sandboxes"),
                params={"page": page, "pageSize": 100},
                timeout=self.settings.request_timeout_s,
            )
            body = response.json()
            items = body.get("items") if isinstance(body, dict) else None
            out.extend(i for i in (items or []) if isinstance(i, dict))
            pagination = body.get("pagination") if isinstance(body, dict) else None
            if not items or not isinstance(pagination, dict) or not pagination.get("hasNextPage"):
                break
            page += 1
        return out
