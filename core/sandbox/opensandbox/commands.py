"""execd's command protocol for one OpenSandbox sandbox: submit, stream (SSE), follow by execution id when the
stream is lost, resubmit only what provably never started, and diagnose a loss (the failure handling is
described in core/sandbox/opensandbox/provider.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from opencode_tui_core.failures import (
    Delivery,
    FailureEvent,
    FailureStage,
    OomDetails,
)
from opencode_tui_core.failures.model import FailureDetails
from opencode_tui_core.failures.policy import STATUS_BLIND_KINDS
from opencode_tui_core.sandbox import tarsafe
from opencode_tui_core.sandbox.base import (
    ExecResult,
    OutputCallback,
    Recovery,
    exec_start,
    parse_user_spec,
)
from opencode_tui_core.sandbox.errors import (
    ExpectedRefusal,
    sandbox_error,
    sandbox_failure,
)
from opencode_tui_core.sandbox.opensandbox.common import (
    _Rejected,
    _Run,
    _shell_command,
    _StreamBroken,
)
from opencode_tui_core.sandbox.opensandbox.diagnostics import (
    Diagnosis,
)
from opencode_tui_core.sandbox.opensandbox.http import RequestFailed, classify_exception, error_code
from opencode_tui_core.sandbox.opensandbox.policy import decide_request
from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxAction

log = logging.getLogger(__name__)


class ExecdCommands:
    """``exec`` and the execd command calls of ``OpenSandboxSandbox`` (its connection state lives there)."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into

        def __getattr__(self, name: str) -> Any: ...

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
        eid, deadline = exec_start(argv, timeout, execution_id)
        run = _Run(eid, argv, on_output)
        loop = asyncio.get_running_loop()
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
        if run.lost is not None:
            # The status was lost before the cap, which only cut its diagnosis short: under load
            # the last lifecycle read can straddle the cap, and the loss must not become a timeout.
            diagnosis = self._diagnoser.conclude(run.diagnosis, cut=True)
            raise sandbox_error(self._with_diagnosis(run.lost, diagnosis, run), run.cause)
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
            err = event["error"] if isinstance(event.get("error"), dict) else {}
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
        run.lost = failure
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
            cut = " (diagnosis deadline reached)" if diagnosis.deadline_reached else ""
            return failure.model_copy(
                update={
                    "evidence": [*failure.evidence, *diagnosis.evidence],
                    "message": failure.message + cut,
                }
            )
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
