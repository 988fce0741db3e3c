"""One OpenSandbox sandbox: its state, execd's address and readiness, lifecycle, evidence and release.

Its other parts are mixins over the same state, one module each: execd's command protocol
(commands.py), file transfer (files.py) and the terminal (terminal.py). The failure handling is
described in core/sandbox/opensandbox/provider.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta
from typing import Any, Protocol

import httpx

from opencode_tui_core.failures import (
    Evidence,
    FailureEvent,
    FailureStage,
)
from opencode_tui_core.sandbox.base import (
    Recovery,
    Sandbox,
    SandboxProbe,
    SandboxState,
    SandboxStatus,
    SingleFlight,
)
from opencode_tui_core.sandbox.errors import (
    SandboxClosedError,
    SandboxError,
    sandbox_error,
    sandbox_failure,
)
from opencode_tui_core.sandbox.faults import NOT_WATCHED_NOTE
from opencode_tui_core.sandbox.opensandbox.commands import ExecdCommands
from opencode_tui_core.sandbox.opensandbox.common import (
    _STATE_MAP,
    INSPECT_DEADLINE_S,
    READY_PING_TIMEOUT_S,
    _now,
)
from opencode_tui_core.sandbox.opensandbox.diagnostics import (
    TERMINAL_STATES,
    Diagnoser,
)
from opencode_tui_core.sandbox.opensandbox.files import ExecdFiles
from opencode_tui_core.sandbox.opensandbox.http import Http, RequestFailed
from opencode_tui_core.sandbox.opensandbox.probe import probe_sandbox
from opencode_tui_core.sandbox.opensandbox.pty import OpenSandboxPty
from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxPolicyConfig, OpenSandboxSettings
from opencode_tui_core.sandbox.opensandbox.terminal import ExecdTerminal

log = logging.getLogger(__name__)


class SandboxOwner(Protocol):
    """What a sandbox needs of the provider that made or connected it (``OpenSandboxProvider`` is one)."""

    settings: OpenSandboxSettings
    policy: OpenSandboxPolicyConfig
    _http: Http  # the provider's client, shared by its sandboxes
    server_version: str | None

    def api_url(self, path: str) -> str: ...

    async def _delete(self, sandbox_id: str, *, deadline: float | None = None) -> None: ...


class OpenSandboxSandbox(ExecdTerminal, ExecdFiles, ExecdCommands, Sandbox):
    """One OpenSandbox sandbox, owned (deleted on release) or borrowed (never deleted by us)."""

    provider = "opensandbox"

    def __init__(
        self,
        owner: SandboxOwner,
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

    # ------------------------------------------------------------------------------- diagnosis

    # ----------------------------------------------------------------------------------- pty

    # --------------------------------------------------------------------------------- files

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
        base: dict[str, Any] = {
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
        url = self._provider.api_url(f"/sandboxes/{self.sandbox_id}")  # the sandbox's own provider
        return await probe_sandbox(self._http, url, self.sandbox_id, timeout)

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
