"""HTTP plumbing of the OpenSandbox provider: clients, failure classification, policy-driven retries.

* One ``httpx.AsyncClient`` per event loop, shared by the lifecycle API and every sandbox's execd,
  with the configured connection limits. Headers are per request: the OpenSandbox API key goes to
  the server only, never to the daemon inside a sandbox.
* Every failed request becomes a ``RequestFailed`` carrying the operation, method, URL, HTTP status,
  the server's error code, a body excerpt, the original exception (as ``__cause__``), the failure
  kind and the **delivery** (whether the request can have taken effect). Kind and delivery follow
  the protocol and are never changed by policy.
* ``request`` applies the policy (``opencode_tui_core.sandbox.opensandbox.policy``) to decide whether a failed
  attempt is tried again, within the operation's attempt budget and the caller's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from opencode_tui_core.failures import (
    Delivery,
    Evidence,
    FailureEvent,
    FailureStage,
    HttpDetails,
)
from opencode_tui_core.failures.model import FailureDetails
from opencode_tui_core.sandbox.errors import sandbox_failure
from opencode_tui_core.sandbox.opensandbox.policy import RequestDecision, decide_request
from opencode_tui_core.sandbox.opensandbox.settings import (
    OpenSandboxAction,
    OpenSandboxPolicyConfig,
    OpenSandboxSettings,
)

log = logging.getLogger(__name__)

API_KEY_HEADER = "OPEN-SANDBOX-API-KEY"
BODY_EXCERPT = 500
AUTH_CODES = ("MISSING_API_KEY", "INVALID_API_KEY")


class RequestFailed(Exception):
    """One request (after its retries) failed; everything needed to build a FailureEvent."""

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        method: str,
        url: str,
        kind: str,
        delivery: Delivery,
        http_status: int | None = None,
        code: str | None = None,
        body_excerpt: str | None = None,
        attempts: int = 1,
        decision: RequestDecision | None = None,
    ):
        super().__init__(message)
        self.operation = operation
        self.method = method
        self.url = url
        self.kind = kind
        self.delivery = delivery
        self.http_status = http_status
        self.code = code
        self.body_excerpt = body_excerpt
        self.attempts = attempts
        self.decision = decision

    @property
    def transport(self) -> bool:
        """No HTTP answer at all (connection refused, reset, timed out)."""
        return self.http_status is None

    @property
    def connect_failed(self) -> bool:
        return isinstance(self.__cause__, httpx.ConnectError | httpx.ConnectTimeout)

    def details(self) -> HttpDetails:
        return HttpDetails(
            method=self.method, url=self.url, status=self.http_status, body_excerpt=self.body_excerpt
        )

    def failure(
        self,
        *,
        stage: FailureStage,
        operation: str | None = None,
        message: str | None = None,
        kind: str | None = None,
        details: FailureDetails | None = None,
        evidence: list[Evidence] | None = None,
    ) -> FailureEvent:
        """The FailureEvent for this request: kind, HTTP status, original cause, details, evidence."""
        return sandbox_failure(
            kind or self.kind,
            stage=stage,
            operation=operation or self.operation,
            message=message or str(self),
            cause=self.__cause__,
            http_status=self.http_status,
            evidence=evidence or (),
            details=details if details is not None else self.details(),
        )


def error_code(response: httpx.Response) -> tuple[str | None, str | None]:
    """The server's ``{code, message}`` (or FastAPI's ``{detail}``) of an error response, and an excerpt."""
    try:
        text = response.text
    except Exception:  # a streamed response that was not read
        return None, None
    excerpt = text[:BODY_EXCERPT] if text else None
    try:
        body = json.loads(text)
    except ValueError:
        return None, excerpt
    if isinstance(body, dict):
        code = body.get("code")
        detail = body.get("detail")
        if code is None and isinstance(detail, dict):
            code = detail.get("code")
        return (str(code) if code is not None else None), excerpt
    return None, excerpt


def classify_exception(exc: BaseException) -> tuple[str, Delivery]:
    """Kind and delivery of a transport failure (no HTTP answer)."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "provider_unavailable", Delivery.NOT_SENT  # no connection: nothing was sent
    if isinstance(exc, httpx.PoolTimeout):
        return "provider_io_timeout", Delivery.NOT_SENT  # never got a connection to send on
    if isinstance(exc, httpx.TimeoutException):
        return "provider_io_timeout", Delivery.POSSIBLY_DELIVERED
    return "provider_unavailable", Delivery.POSSIBLY_DELIVERED  # reset, closed mid-answer


def classify_status(
    status: int, code: str | None, *, operation: str, default_kind: str, not_found_kind: str | None
) -> tuple[str, Delivery]:
    """Kind and delivery of an HTTP error answer (protocol facts; policy never changes them).

    A 4xx answer means the request was refused as a whole (nothing was done). A 5xx answer may
    come after the work started, except a 502 on a command submission: OpenSandbox's proxy answers
    502 when it could not connect to the daemon, so the command never started.
    """
    if status == 401 or (code or "").upper() in AUTH_CODES:
        return "provider_auth_failed", Delivery.NOT_SENT
    if status == 404:
        return not_found_kind or default_kind, Delivery.NOT_SENT
    if status == 429:
        return (
            "provider_quota_exhausted" if operation == "create" else "provider_unavailable"
        ), Delivery.NOT_SENT
    if 400 <= status < 500:
        if "QUOTA" in (code or "").upper():
            return "provider_quota_exhausted", Delivery.NOT_SENT
        return default_kind, Delivery.NOT_SENT
    if status == 502 and operation == "submit":
        return "provider_unavailable", Delivery.NOT_SENT
    return default_kind, Delivery.POSSIBLY_DELIVERED


RetryGate = Callable[[RequestFailed], Awaitable[bool]]


class Http:
    """The provider's HTTP side: clients per event loop, and requests with policy-driven retries."""

    def __init__(
        self,
        settings: OpenSandboxSettings,
        policy: OpenSandboxPolicyConfig,
        *,
        api_key: str | None,
        event_hooks: Mapping[str, list[Callable[..., Any]]] | None = None,
    ):
        self.settings = settings
        self.policy = policy
        self.api_key = api_key
        self.event_hooks = {k: list(v) for k, v in (event_hooks or {}).items()}
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    # ------------------------------------------------------------------------------ clients

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        for other in [lp for lp in self._clients if lp.is_closed()]:
            del self._clients[other]  # its loop is gone; the client cannot be used (or closed) any more
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            s = self.settings
            client = httpx.AsyncClient(
                limits=httpx.Limits(
                    max_connections=s.max_connections,
                    max_keepalive_connections=s.max_keepalive_connections,
                    keepalive_expiry=s.keepalive_expiry_s,
                ),
                timeout=httpx.Timeout(s.request_timeout_s, connect=s.connect_timeout_s),
                event_hooks=self.event_hooks,
                follow_redirects=False,
                trust_env=False,  # loopback servers: never route through an environment proxy
            )
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        with contextlib.suppress(RuntimeError):
            loop = asyncio.get_running_loop()
            client = self._clients.pop(loop, None)
            if client is not None:
                await client.aclose()

    def server_headers(self) -> dict[str, str]:
        return {API_KEY_HEADER: self.api_key} if self.api_key else {}

    def timeout(self, seconds: float) -> httpx.Timeout:
        seconds = max(seconds, 0.001)
        return httpx.Timeout(seconds, connect=min(self.settings.connect_timeout_s, seconds))

    # ----------------------------------------------------------------------------- requests

    async def request(
        self,
        operation: str,
        method: str,
        url: str,
        *,
        timeout: float,
        deadline: float | None = None,
        server: bool = True,
        headers: Mapping[str, str] | None = None,
        default_kind: str = "provider_unavailable",
        not_found_kind: str | None = None,
        accept: tuple[int, ...] = (),
        retry_gate: RetryGate | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send one request; retry per policy; return a 2xx (or ``accept``-ed) response or raise.

        ``deadline`` (event-loop time) bounds every attempt and every pause: no attempt starts
        after it. ``retry_gate`` lets a state-changing operation veto a retry the policy chose.
        """
        loop = asyncio.get_running_loop()
        budget = self.policy.budget(operation)
        all_headers = {**(self.server_headers() if server else {}), **(headers or {})}
        attempt = 0
        while True:
            attempt += 1
            per_try = timeout
            if deadline is not None:
                per_try = min(per_try, deadline - loop.time())
                if per_try <= 0:
                    raise TimeoutError(f"{operation}: no time left before the deadline")
            try:
                response = await self.client().request(
                    method, url, headers=all_headers, timeout=self.timeout(per_try), **kwargs
                )
            except httpx.HTTPError as exc:
                kind, delivery = classify_exception(exc)
                failed = RequestFailed(
                    f"{method} {url}: {type(exc).__name__}: {exc}"
                    + (" (no answer within the timeout)" if isinstance(exc, httpx.TimeoutException) else ""),
                    operation=operation,
                    method=method,
                    url=url,
                    kind=kind,
                    delivery=delivery,
                    attempts=attempt,
                )
                failed.__cause__ = exc
            else:
                if response.is_success or response.status_code in accept:
                    return response
                code, excerpt = error_code(response)
                kind, delivery = classify_status(
                    response.status_code,
                    code,
                    operation=operation,
                    default_kind=default_kind,
                    not_found_kind=not_found_kind,
                )
                failed = RequestFailed(
                    f"{method} {url} answered {response.status_code}"
                    + (f" {code}" if code else "")
                    + (f": {excerpt}" if excerpt else ""),
                    operation=operation,
                    method=method,
                    url=url,
                    kind=kind,
                    delivery=delivery,
                    http_status=response.status_code,
                    code=code,
                    body_excerpt=excerpt,
                    attempts=attempt,
                )
                # The HTTP error itself is the original cause (type, status, URL).
                failed.__cause__ = httpx.HTTPStatusError(
                    f"{response.status_code} {response.reason_phrase} for {method} {url}"
                    + (f" ({code})" if code else ""),
                    request=response.request,
                    response=response,
                )
            decision = decide_request(
                self.policy, operation=operation, http_status=failed.http_status, kind=failed.kind
            )
            failed.decision = decision
            if decision.action is not OpenSandboxAction.RETRY or attempt >= budget.max_attempts:
                raise failed
            delay = budget.delay(attempt)
            if deadline is not None and loop.time() + delay >= deadline:
                raise failed
            if retry_gate is not None and not await retry_gate(failed):
                raise failed
            log.debug(
                "%s: attempt %d failed (%s); retrying by rule %s", operation, attempt, failed, decision.rule
            )
            await asyncio.sleep(delay)
