"""One OpenSandbox sandbox; the failure handling is described in core/sandbox/opensandbox/provider.py.

Above 800 lines because execd's command protocol (submit, stream, follow by execution id, diagnose)
is one state machine over one sandbox's connection state; its helpers are in common.py and pty.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shlex
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import httpx

from core.failures import (
    Delivery,
    Evidence,
    FailureEvent,
    FailureStage,
    OomDetails,
)
from core.failures.model import FailureDetails
from core.failures.policy import STATUS_BLIND_KINDS
from core.sandbox import tarsafe
from core.sandbox.base import (
    ExecResult,
    OutputCallback,
    PtyHandle,
    Recovery,
    Sandbox,
    SandboxProbe,
    SandboxState,
    SandboxStatus,
    SingleFlight,
    check_exec_args,
    new_execution_id,
    parse_user_spec,
)
from core.sandbox.errors import (
    ExpectedRefusal,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    sandbox_error,
    sandbox_failure,
)
from core.sandbox.faults import NOT_WATCHED_NOTE
from core.sandbox.opensandbox.common import (
    _DROP_TO_USER_SH,
    _STATE_MAP,
    INSPECT_DEADLINE_S,
    NOT_FOUND_EXIT,
    PTY_OPEN_TIMEOUT_S,
    READY_PING_TIMEOUT_S,
    _now,
    _Rejected,
    _Run,
    _shell_command,
    _StreamBroken,
)
from core.sandbox.opensandbox.diagnostics import (
    TERMINAL_STATES,
    Diagnoser,
    Diagnosis,
)
from core.sandbox.opensandbox.http import RequestFailed, classify_exception, error_code
from core.sandbox.opensandbox.policy import decide_request
from core.sandbox.opensandbox.pty import OpenSandboxPty
from core.sandbox.opensandbox.settings import OpenSandboxAction

if TYPE_CHECKING:
    from core.sandbox.opensandbox.provider import OpenSandboxProvider

log = logging.getLogger(__name__)


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
        self.pids_limit: int | None = None  # as asked for at create (not enforceable per sandbox)
        self.disk_bytes: int | None = None
        # The spec's user as execd's uid/gid (None: ``command_uid``/``command_gid``, else execd's own).
        self.user_ids: tuple[int, int | None] | None = None
        self.failures: list[FailureEvent] = []  # every failure seen here, recovered ones included
        self.remote_ids: dict[str, str] = {}  # our execution id -> execd's execution id
        self._execd_base: str | None = None
        self._execd_headers: dict[str, str] = {}
        self._closed = False
        self._deleted = False
        self._ptys: set[OpenSandboxPty] = set()
        self._release_once = SingleFlight(self._release)
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
                failure=sandbox_failure(
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
        failure = sandbox_failure(
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
            # Refused (4xx), unreachable or uncertain: ask the server what became of the sandbox. A
            # refusal too: a daemon (or the server's proxy to it) may refuse because the sandbox was
            # OOM-killed meanwhile, and the lifecycle says so.
            diagnosis = await self._diagnose(deadline, run.diagnosis)
            raise sandbox_error(self._with_diagnosis(failure, diagnosis, run), run.cause)

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
        return sandbox_failure(
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
            run.note(f"an unparseable event was skipped: {text[:80]!r}")
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
        stream_lost = sandbox_failure(
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
                    run.note(
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
        failure = sandbox_failure(
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
        raise sandbox_error(self._with_diagnosis(failure, diagnosis, run), lost_cause)

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
            run.note(f"the command's log could not be read ({exc}); output after the break is missing")
            return
        log_bytes = response.content
        streamed = run.combined.value()
        if run.combined.total == len(streamed) and log_bytes.startswith(streamed):
            await run.emit("stdout", log_bytes[len(streamed) :])
        else:
            run.note("the command's log does not continue the streamed output; it was not merged")

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
            return sandbox_failure(
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
            return sandbox_failure(
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
        return sandbox_failure(
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
        if typed.kind in STATUS_BLIND_KINDS:
            # An OOM keeps its own precedence: the status of the poll that noticed it stays in the
            # cause chain, never in the policy's HTTP-status table (a 502 would retry it).
            return typed
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
            raise sandbox_error(
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
            failure = sandbox_failure(
                "sandbox_pty_failed",
                stage=FailureStage.AGENT,
                operation="pty.open",
                message=f"opening a terminal ({argv[0]!r}) failed: {type(exc).__name__}: {exc}",
                cause=exc,
            )
            raise sandbox_error(failure, exc) from exc
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
        metadata = json.dumps({"path": path, "mode": int(f"{mode & 0o7777 & ~tarsafe.SPECIAL_BITS:o}")})
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
            raise sandbox_error(
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
            raise sandbox_error(failure, exc) from exc
        return response.content

    def _file_error(self, operation: str, message: str, result: ExecResult | None = None) -> SandboxError:
        detail = ""
        if result is not None:
            detail = (
                result.stderr.decode("utf-8", "replace").strip() or result.error or f"exit {result.exit_code}"
            )
        return SandboxError(
            f"{message}: {detail}" if detail else message,
            failure=sandbox_failure(
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
        archive = tarsafe.without_special_bits(archive)  # tar as root keeps setuid/setgid as given
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
                    failure=sandbox_failure(
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
            raise sandbox_error(exc.failure(stage=FailureStage.AGENT, operation=operation), exc) from exc

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
            raise sandbox_error(
                exc.failure(stage=FailureStage.AGENT, operation="command.status"), exc
            ) from exc
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
            raise sandbox_error(exc.failure(stage=FailureStage.AGENT, operation="command.logs"), exc) from exc
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
            raise sandbox_error(
                exc.failure(stage=FailureStage.AGENT, operation="command.interrupt"), exc
            ) from exc

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
            "pids_limit_enforced": False if self.pids_limit else None,
            "disk_limit_enforced": False if self.disk_bytes else None,
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
        if self.pids_limit:
            # OpenSandbox 1.1's lifecycle API takes cpu and memory only; its Docker runtime applies
            # the server's own ``pids_limit`` setting to every sandbox.
            notes.append(
                f"process limit {self.pids_limit} not set per sandbox: the OpenSandbox API has no such field; "
                "the server's own docker pids_limit setting applies"
            )
        if self.disk_bytes:
            notes.append("disk limit not enforced: the OpenSandbox API has no per-sandbox disk size")
        # The lifecycle API reports a sandbox that died, not a process killed inside a live one.
        notes.append(NOT_WATCHED_NOTE + " (the OpenSandbox lifecycle reports only a sandbox that ended)")
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
        # One deletion, however many callers: a second caller (a hurried close) joins the one in
        # flight, and a caller cancelled midway does not abort the DELETE request (SingleFlight).
        await self._release_once()

    async def _release(self) -> None:
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
            raise sandbox_error(
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
