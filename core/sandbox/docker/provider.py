"""The Docker provider: owned containers from a local image, or borrowed containers by id.

Design notes
------------
* **Blocking SDK calls never run on the event loop.** Short calls run in ``asyncio.to_thread``
  under ``asyncio.wait_for`` (every wait has a deadline). Long-lived streams (exec output, PTYs)
  are read by daemon threads of their own: an abandoned stream (a command past its deadline keeps
  running) must not hold up interpreter or event-loop shutdown, which joins the default executor.
* **Main process.** The container's main process is an idle shell loop under Docker's init
  (``init=True``: docker-init/tini as PID 1). Processes started by ``exec`` that orphan (a
  backgrounded relay, a daemon) are re-parented to PID 1, and tini reaps them, so zombies do not
  pile up. tini does not interfere with OOM semantics: the memory cgroup's OOM killer picks the
  task with the largest footprint (tini is ~1 MB and is never the choice while anything else is
  alive); an OOM kill of an exec'd process leaves tini and the idle loop running (the container
  stays up; evidence comes from the ``oom`` event and the cgroup counter); if the main process
  itself is OOM-killed, tini exits with its status and the engine records ``State.OOMKilled``.
  ``memswap_limit`` equals ``mem_limit`` so the limit cannot be dodged by swapping: OOM is real.
  ``pids_limit`` caps processes and threads (evidence: the container's pids cgroup counters);
  ``storage_opt size`` caps the writable layer only on storage drivers that can (``disk_limit_support``;
  otherwise ``status()`` says why it is not enforced).
* **Exec streaming** uses the exec's attach socket (``exec_start(socket=True)``) and parses
  Docker's multiplexed frames ourselves: the SDK's ``stream=True`` generator keeps the client's read
  timeout, so a command quiet for longer than that would break, and the socket lets us write stdin
  and half-close it. Each frame goes to ``on_output`` as soon as it is read. Bytes buffered by the
  HTTP layer past the upgrade headers are read through the same buffered reader, never lost.
* **PTY**: exec with ``tty=True, stdin=True``; raw bytes over the attach socket, read by a
  daemon thread into an ``asyncio.Queue``; ``resize`` is ``exec_resize``.
* **Evidence** (``inspect``) is scoped to this container id only: ``docker.state``,
  ``docker.events`` (bounded ``since``/``until`` query) and ``cgroup.memory`` (the container's own
  cgroup, found from its PID and checked to contain its id). See ``oom_rules``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

import docker
import docker.errors
from docker.types import Mount as DockerMount

from opencode_tui_core.config import DEFAULT_IMAGE
from opencode_tui_core.failures import (
    Evidence,
    FailureStage,
    GenericDetails,
)
from opencode_tui_core.sandbox.base import (
    LABEL_INVOCATION,
    LABEL_OWNER,
    LABEL_RUN,
    SANDBOX_MODEL_SOCKET,
    NetworkPolicy,
    SandboxProvider,
    SandboxRecord,
    SandboxSpec,
    default_owner,
    invocation_id,
)
from opencode_tui_core.sandbox.docker.cgroup import disk_limit_support
from opencode_tui_core.sandbox.docker.common import (
    API_TIMEOUT_S,
    BUILD_HINT,
    CALL_DEADLINE_S,
    IDLE_MAIN,
    RELEASE_DEADLINE_S,
    _blocking,
    _engine_error,
    _http_status,
    _slug,
    docker_client,
)
from opencode_tui_core.sandbox.docker.sandbox import DockerSandbox
from opencode_tui_core.sandbox.errors import SandboxError, sandbox_failure

log = logging.getLogger(__name__)


class DockerProvider(SandboxProvider):
    """Docker containers as sandboxes (docker SDK; local images only, never a bridge network).

    ``main_argv`` replaces the idle main process (e.g. for an image with its own init, or for tests
    that need the main process itself to be the workload); ``use_init`` runs it under docker-init.
    """

    name = "docker"

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        base_url: str | None = None,
        owner: str | None = None,
        default_image: str = DEFAULT_IMAGE,
        main_argv: Sequence[str] | None = None,
        use_init: bool = True,
        api_timeout: float = API_TIMEOUT_S,
    ):
        self._client = client
        self._disk_support_cache: tuple[bool, str] | None = None
        self._base_url = base_url
        self.owner = owner or default_owner()
        self.default_image = default_image
        self.main_argv = tuple(main_argv) if main_argv else IDLE_MAIN
        self.use_init = use_init
        self.api_timeout = api_timeout

    def _make_client(self) -> docker.DockerClient:
        return docker_client(self._base_url, int(self.api_timeout))

    async def _get_client(self, stage: FailureStage, operation: str) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = await _blocking(self._make_client, within=CALL_DEADLINE_S)
            except Exception as exc:
                raise _engine_error(
                    exc,
                    stage=stage,
                    operation=operation,
                    default_kind="provider_unavailable",
                    what="connecting to the Docker engine failed",
                ) from exc
        return self._client

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        stage, op = FailureStage.SEED, "create"
        client = await self._get_client(stage, op)
        image = spec.image or self.default_image
        try:
            await _blocking(client.api.inspect_image, image, within=CALL_DEADLINE_S)
        except docker.errors.NotFound as exc:
            message = f"image {image!r} is not available on this Docker engine; {BUILD_HINT}"
            raise SandboxError(
                message,
                failure=sandbox_failure(
                    "provider_image_missing",
                    stage=stage,
                    operation=op,
                    message=message,
                    cause=exc,
                    http_status=_http_status(exc),
                    details=GenericDetails(data={"image": image}),
                ),
            ) from exc
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_allocation_failed",
                what="checking the image",
            ) from exc

        mounts = [
            DockerMount(target=m.target, source=m.source, type="bind", read_only=m.read_only)
            for m in spec.mounts
        ]
        if spec.model_socket:
            source = os.path.abspath(spec.model_socket)  # noqa: ASYNC240 (pure string operation)
            if not await asyncio.to_thread(os.path.exists, source):
                message = f"model socket {source!r} does not exist on the host; start the model proxy first"
                raise SandboxError(
                    message,
                    failure=sandbox_failure(
                        "sandbox_allocation_failed", stage=stage, operation=op, message=message
                    ),
                )
            # Read-only: connect() still works, but the sandbox cannot chmod/chown the host's socket.
            mounts.append(
                DockerMount(target=SANDBOX_MODEL_SOCKET, source=source, type="bind", read_only=True)
            )
        name = f"opencode-tui-{_slug(spec.run_id)}-{uuid.uuid4().hex[:8]}"
        kwargs: dict[str, Any] = {
            "image": image,
            "entrypoint": list(self.main_argv),
            "name": name,
            "labels": {
                **spec.labels,
                LABEL_RUN: spec.run_id,
                LABEL_OWNER: self.owner,
                LABEL_INVOCATION: invocation_id(),
            },
            "init": self.use_init,
            "network_mode": "host" if spec.network is NetworkPolicy.HOST else "none",
            "working_dir": spec.workdir,
            "environment": dict(spec.env),
            "mounts": mounts,
            # Empty keeps the image's USER; every exec and terminal then runs as this user.
            "user": spec.user or "",
            "detach": True,
        }
        if spec.memory_bytes:
            kwargs["mem_limit"] = spec.memory_bytes
            kwargs["memswap_limit"] = spec.memory_bytes  # no swap: the limit is real and OOM is real
        if spec.cpus:
            kwargs["nano_cpus"] = int(spec.cpus * 1e9)
        if spec.pids_limit:
            kwargs["pids_limit"] = spec.pids_limit
        disk_note = None
        if spec.disk_bytes:
            can, why = await self._disk_support(client)
            if can:
                kwargs["storage_opt"] = {"size": str(spec.disk_bytes)}
            else:
                disk_note = f"disk limit not enforced: {why}"

        since = time.time() - 1.0
        try:
            container = await _blocking(client.containers.create, within=CALL_DEADLINE_S, **kwargs)
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                await self._remove_quietly(client, name)  # the create may still land later
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_allocation_failed",
                what="creating the container",
            ) from exc
        try:
            await _blocking(container.start, within=CALL_DEADLINE_S)
            attrs = await _blocking(client.api.inspect_container, container.id, within=CALL_DEADLINE_S)
        except Exception as exc:
            await self._remove_quietly(client, container.id)
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_allocation_failed",
                what="starting the container",
            ) from exc

        sandbox = DockerSandbox(
            client, container.id, owned=True, since=since, name=name, memory_bytes=spec.memory_bytes
        )
        sandbox._disk_note = disk_note
        try:
            await sandbox._record_baseline(attrs=attrs)
            reason = await sandbox._wait_ready(spec.ready_timeout_s)
        except BaseException:
            await sandbox.release()
            raise
        if reason is not None:
            evidence: list[Evidence] = []
            with contextlib.suppress(Exception):
                evidence = await sandbox.inspect()
            await sandbox.release()
            message = (
                f"container {container.id[:12]} did not become ready within {spec.ready_timeout_s:g}s "
                f"(exec `true`): {reason}"
            )
            raise SandboxError(
                message,
                failure=sandbox_failure(
                    "sandbox_not_ready", stage=stage, operation=op, message=message, evidence=evidence
                ),
            )
        return sandbox

    async def _disk_support(self, client: docker.DockerClient) -> tuple[bool, str]:
        """``disk_limit_support`` of this engine, asked once per provider."""
        if self._disk_support_cache is None:
            try:
                info = await _blocking(client.info, within=CALL_DEADLINE_S)
                self._disk_support_cache = disk_limit_support(info)
            except Exception as exc:
                return False, f"docker info failed: {exc}"
        return self._disk_support_cache

    async def _remove_quietly(self, client: docker.DockerClient, ref: str) -> None:
        try:
            await _blocking(client.api.remove_container, ref, force=True, v=True, within=RELEASE_DEADLINE_S)
        except docker.errors.NotFound:
            pass
        except Exception as exc:
            log.warning(
                "could not remove container %s after a failed create: %s (sweep will find it)", ref, exc
            )

    async def connect(self, sandbox_id: str) -> DockerSandbox:
        stage, op = FailureStage.SEED, "connect"
        client = await self._get_client(stage, op)
        since = time.time()
        try:
            attrs = await _blocking(client.api.inspect_container, sandbox_id, within=CALL_DEADLINE_S)
        except docker.errors.NotFound as exc:
            message = f"no container {sandbox_id!r} on this Docker engine"
            raise SandboxError(
                message,
                failure=sandbox_failure(
                    "sandbox_lost",
                    stage=stage,
                    operation=op,
                    message=message,
                    cause=exc,
                    http_status=_http_status(exc),
                ),
            ) from exc
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_lost",
                what=f"connecting to {sandbox_id!r}",
            ) from exc
        memory = (attrs.get("HostConfig") or {}).get("Memory") or None
        sandbox = DockerSandbox(
            client,
            attrs["Id"],
            owned=False,
            since=since,
            name=(attrs.get("Name") or "").lstrip("/"),
            memory_bytes=memory,
        )
        await sandbox._record_baseline(attrs=attrs)
        return sandbox

    async def sweep(self, *, dry_run: bool = False, owner: str | None = None) -> list[str]:
        stage, op = FailureStage.CLEANUP, "sweep"
        ids = [record.sandbox_id for record in await self.listed(owner=owner)]
        if dry_run:
            return ids
        client = await self._get_client(stage, op)
        removed: list[str] = []
        failures: list[str] = []
        for cid in ids:
            try:
                await _blocking(
                    client.api.remove_container, cid, force=True, v=True, within=RELEASE_DEADLINE_S
                )
            except docker.errors.NotFound:
                pass  # gone already: still a leftover that no longer exists
            except Exception as exc:
                failures.append(f"{cid[:12]}: {exc}")
                continue
            removed.append(cid)
        if failures:
            message = (
                f"sweep removed {len(removed)} container(s) but failed on {len(failures)}: "
                + "; ".join(failures)
            )
            raise SandboxError(
                message,
                failure=sandbox_failure("sandbox_release_failed", stage=stage, operation=op, message=message),
            )
        return removed

    async def listed(self, *, owner: str | None = None) -> list[SandboxRecord]:
        stage, op = FailureStage.CLEANUP, "list"
        client = await self._get_client(stage, op)
        label = f"{LABEL_OWNER}={owner}" if owner else LABEL_OWNER
        try:
            found = await _blocking(
                client.api.containers, all=True, filters={"label": label}, within=CALL_DEADLINE_S
            )
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_release_failed",
                what="listing sandboxes",
            ) from exc
        return [
            SandboxRecord(provider=self.name, sandbox_id=c["Id"], labels=dict(c.get("Labels") or {}))
            for c in found
        ]

    async def remove(self, sandbox_id: str) -> None:
        stage, op = FailureStage.CLEANUP, "remove"
        client = await self._get_client(stage, op)
        try:
            await _blocking(
                client.api.remove_container, sandbox_id, force=True, v=True, within=RELEASE_DEADLINE_S
            )
        except docker.errors.NotFound:
            pass
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=stage,
                operation=op,
                default_kind="sandbox_release_failed",
                what=f"removing container {sandbox_id[:12]} failed",
            ) from exc
