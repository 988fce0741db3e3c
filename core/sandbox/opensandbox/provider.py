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
* **OOM is confirmed only by structured evidence about this sandbox** (``oom_rules``): a
  terminal lifecycle state with a recognised reason code; the diagnostics reports' ``OOMKilled``
  only when ``oom_from_diagnostics`` is on. Free text (a status message, output) never confirms.
* **Expected refusal**: a refusal the daemon confirms before launching anything (e.g. running as root
  not allowed) raises ``ExpectedRefusal`` – control flow, no failure event – or, for the configured
  default user, falls back to the image's user.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opencode_tui_core.config import DEFAULT_IMAGE
from opencode_tui_core.failures import (
    Delivery,
    Evidence,
    FailureStage,
    GenericDetails,
)
from opencode_tui_core.sandbox.base import (
    LABEL_INVOCATION,
    LABEL_OWNER,
    LABEL_RUN,
    NetworkPolicy,
    SandboxProvider,
    SandboxRecord,
    SandboxSpec,
    default_owner,
    invocation_id,
)
from opencode_tui_core.sandbox.errors import SandboxError, sandbox_error, sandbox_failure
from opencode_tui_core.sandbox.opensandbox.common import (
    CLEANUP_DEADLINE_S,
    CONNECT_DEADLINE_S,
    LABEL_CREATE,
    READY_PING_TIMEOUT_S,
    _cpu_quantity,
    _image_missing,
    _memory_quantity,
    label_value,
)
from opencode_tui_core.sandbox.opensandbox.diagnostics import (
    TERMINAL_STATES,
    lifecycle_evidence,
)
from opencode_tui_core.sandbox.opensandbox.http import Http, RequestFailed
from opencode_tui_core.sandbox.opensandbox.policy import DEFAULT_OPENSANDBOX_POLICY, merged_policy
from opencode_tui_core.sandbox.opensandbox.sandbox import OpenSandboxSandbox
from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxSettings

log = logging.getLogger(__name__)


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
        return sandbox_error(
            exc.failure(stage=stage, operation=operation, message=f"{what}: {exc}{hint}"), exc
        )

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
                failure=sandbox_failure(
                    "provider_protocol_error", stage=stage, operation=op, message=message
                ),
            )
        sandbox = OpenSandboxSandbox(
            self,
            sandbox_id,
            owned=True,
            workdir=spec.workdir,
            memory_bytes=spec.memory_bytes,
            oom_at_connect=False,
        )
        sandbox.pids_limit, sandbox.disk_bytes = spec.pids_limit, spec.disk_bytes
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
                failure=sandbox_failure(
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
        from opencode_tui_core.sandbox.opensandbox.oom_rules import SOURCE_OS_DIAGNOSTICS

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
                failure=sandbox_failure(
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
                failure=sandbox_failure("sandbox_release_failed", stage=stage, operation=op, message=message),
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
