"""What every part of the Docker provider shares: deadlines, engine-error classification, failures."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import docker
import docker.errors
import requests

from opencode_tui_core.failures import (
    FailureStage,
)
from opencode_tui_core.failures.model import FailureDetails
from opencode_tui_core.sandbox.base import (
    SandboxState,
)
from opencode_tui_core.sandbox.errors import SandboxError, sandbox_failure

T = TypeVar("T")

# The idle main process (under docker-init): portable to any image with /bin/sh.
IDLE_MAIN = ("/bin/sh", "-c", "while :; do sleep 3600; done")
BUILD_HINT = "build it locally with scripts/build-images (there is no registry to pull from)"

API_TIMEOUT_S = 60.0  # the SDK's socket timeout for ordinary requests
CALL_DEADLINE_S = 60.0  # deadline for one short engine call (create, start, inspect...)
INSPECT_DEADLINE_S = 10.0  # the whole of one inspect()
EVENTS_DEADLINE_S = 5.0
# At most this many of the container's own events are kept as evidence (every oom report first).
EVENTS_KEPT = 20
# How often the live watch asks for oom events when the host cannot see the container's cgroup.
EVENTS_POLL_S = 1.0
RELEASE_DEADLINE_S = 30.0
FILE_DEADLINE_S = 300.0  # put_archive / get_archive
PTY_WRITE_DEADLINE_S = 30.0
EXIT_POLL_S = 5.0  # after the output ends, how long to wait for the engine to report the exit code
OUTPUT_CAP_BYTES = 4 << 20  # per stream, tail kept
# Every PTY process carries this variable (value unique per terminal): close() ends the processes
# that carry it, since a closed attach socket alone leaves an interactive shell running.
PTY_MARKER_ENV = "OPENCODE_TUI_PTY"
PTY_END_DEADLINE_S = 5.0

_STATE_MAP = {
    "created": SandboxState.CREATING,
    "running": SandboxState.RUNNING,
    "paused": SandboxState.UNKNOWN,
    "restarting": SandboxState.UNKNOWN,
    "removing": SandboxState.GONE,
    "exited": SandboxState.EXITED,
    "dead": SandboxState.FAILED,
}


def docker_client(base_url: str | None, timeout: int) -> docker.DockerClient:
    """The engine's client (``base_url``, else the environment's ``DOCKER_HOST``), the one way every
    part of the provider makes one.

    Over the SDK's own transports (a unix socket, a named pipe, ssh) it ignores the proxy variables:
    no proxy applies to them, and requests would otherwise read the whole environment twice per call
    looking for one (a third of the controller's CPU per engine call, measured)."""
    client = (
        docker.DockerClient(base_url=base_url, timeout=timeout)
        if base_url
        else docker.from_env(timeout=timeout)
    )
    if client.api.base_url.startswith("http+docker://"):  # how the SDK names its own transports
        client.api.trust_env = False
    return client


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(epoch: float) -> str:
    return f"{epoch:.9f}"


async def _blocking(fn: Callable[..., T], *args: Any, within: float, **kwargs: Any) -> T:
    """Run one blocking call in a worker thread; raise TimeoutError after ``within`` seconds."""
    return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), max(within, 0.001))


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
    return status if isinstance(status, int) and 100 <= status <= 599 else None


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and len(out) < 10:
        out.append(node)
        node = node.__cause__ or node.__context__
    return out


def _engine_timed_out(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError | requests.exceptions.Timeout)


def _engine_unreachable(exc: BaseException) -> bool:
    """The engine could not be talked to at all (socket missing, refused, connection dropped)."""
    if isinstance(exc, docker.errors.APIError):
        return False
    if "Error while fetching server API version" in str(exc):
        return True
    return any(
        isinstance(e, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError)
        for e in _chain(exc)
    )


def _engine_error(
    exc: BaseException,
    *,
    stage: FailureStage,
    operation: str,
    default_kind: str,
    what: str,
    details: FailureDetails | None = None,
) -> SandboxError:
    """Map an engine exception to a SandboxError carrying a FailureEvent."""
    if _engine_timed_out(exc):
        kind, message = "provider_io_timeout", f"{what}: the Docker engine did not answer in time"
    elif isinstance(exc, docker.errors.ImageNotFound):
        kind, message = "provider_image_missing", f"{what}: image not found ({exc}); {BUILD_HINT}"
    elif _engine_unreachable(exc):
        kind = "provider_unavailable"
        message = (
            f"{what}: the Docker engine is not reachable ({exc}); is dockerd running? (scripts/start-dockerd)"
        )
    else:
        kind, message = default_kind, f"{what}: {exc}"
    failure = sandbox_failure(
        kind,
        stage=stage,
        operation=operation,
        message=message,
        cause=exc,
        http_status=_http_status(exc),
        details=details,
    )
    error = SandboxError(message, failure=failure)
    error.__cause__ = exc
    return error


def _slug(text: str, limit: int = 40) -> str:
    slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.") or "run"
    return slug[:limit]
