"""Building a task's image from its Dockerfile with the Docker SDK (the docker plug-in's ``build_image``).

The tag carries the hash of the build context (opencode_tui_core.tasks.with_build_tag), so an unchanged context is
built once and found afterwards. The build never pulls and has no network (``network_mode: none``):
its base must be an image the engine already has (scripts/build-images). Its output streams to the
episode as terminal output and to ``build/image.log`` in the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from opencode_tui_core.sandbox.docker.settings import DockerSettings
from opencode_tui_core.sandbox.errors import image_build_failure


def _docker_client(settings: DockerSettings, timeout: int) -> Any:
    from opencode_tui_core.sandbox.docker.common import docker_client

    return docker_client(settings.base_url, timeout)


# A build runs under a scratch tag that carries its deadline: ``<repo>:building-<unix deadline>-<id>``.
# The engine finishes a build whose client left at the deadline and tags it anyway; such a tag is
# garbage the moment it exists, so every later build removes scratch tags past their deadline.
SCRATCH_PREFIX = "building-"
LEGACY_SCRATCH_AGE_S = 3600.0  # scratch tags from before the deadline was in the name


def _scratch_tag(repo: str, deadline: float) -> str:
    return f"{repo}:{SCRATCH_PREFIX}{int(deadline) + 1}-{uuid.uuid4().hex[:8]}"


def scratch_expired(tag: str, now: float, created: float | None = None) -> bool:
    """Whether ``tag`` is a scratch tag whose build can no longer be waited for by anyone."""
    name = tag.rpartition(":")[2]
    if not name.startswith(SCRATCH_PREFIX):
        return False
    stamp, sep, _ = name[len(SCRATCH_PREFIX) :].partition("-")
    if sep and stamp.isdigit():
        return int(stamp) < now
    return created is not None and now - created > LEGACY_SCRATCH_AGE_S


def remove_expired_scratch(client: Any, now: float | None = None) -> list[str]:
    """Untag the scratch tags of abandoned task builds (blocking; the removed tags)."""
    from docker.errors import APIError

    now = time.time() if now is None else now
    removed = []
    for image in client.images.list(filters={"label": "opencode-tui.task"}):
        created = _created(image.attrs.get("Created"))
        for tag in image.tags:
            if scratch_expired(tag, now, created):
                with contextlib.suppress(APIError):  # in use by a container, or gone already
                    client.api.remove_image(tag)
                    removed.append(tag)
    return removed


def _created(text: Any) -> float | None:
    """Docker's ``Created`` (RFC 3339, nanoseconds) as a Unix time; None if unreadable."""
    from datetime import UTC, datetime

    try:
        whole = str(text).split(".")[0].removesuffix("Z")
        return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


# The images a task image was built FROM, by ID: the tag hashes the build context only, so a base
# rebuilt since (scripts/build-images) would otherwise leave every cached task image stale.
BASES_LABEL = "opencode-tui.bases"


def dockerfile_bases(text: str) -> list[str]:
    """The images a Dockerfile builds FROM, in order (its own stages and ``scratch`` left out)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: set[str] = set()
    bases: list[str] = []
    for line in logical:
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            continue
        if args[0].lower() not in stages and args[0] != "scratch" and args[0] not in bases:
            bases.append(args[0])
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2].lower())
    return bases


def _base_ids(client: Any, bases: list[str]) -> str:
    from docker.errors import ImageNotFound

    ids = []
    for base in bases:
        try:
            ids.append(f"{base}={client.images.get(base).id}")
        except ImageNotFound:
            ids.append(f"{base}=missing")
    return ",".join(ids)


BUILD_SOURCE = "docker.build"  # the evidence source of a failed build's log


async def build_task_image(task: Any, settings: DockerSettings, log: Callable[[str], None]) -> str:
    """Build ``task.image`` from ``task.build`` with the Docker SDK unless the engine has it already."""
    from docker.errors import APIError, DockerException, ImageNotFound

    log_parts: list[str] = []
    lock = threading.Lock()

    def out(text: str) -> None:
        with lock:
            log_parts.append(text)
        log(text)

    try:
        client = _docker_client(settings, max(60, int(task.build.timeout)))
    except DockerException as exc:
        raise image_build_failure(
            task, f"the Docker engine is not reachable to build {task.image}: {exc}", "", source=BUILD_SOURCE
        ) from exc
    try:
        with contextlib.suppress(APIError, DockerException):
            for tag in await asyncio.to_thread(remove_expired_scratch, client):
                out(f"removed {tag}: an earlier build finished after its deadline\n")
        ctx = task.build_context
        try:
            bases = dockerfile_bases((ctx / task.build.dockerfile).read_text(errors="replace"))
        except OSError:
            bases = []  # the build itself says what is wrong with the file
        base_ids = await asyncio.to_thread(_base_ids, client, bases)
        with contextlib.suppress(ImageNotFound):
            cached = client.images.get(task.image)
            if (cached.labels or {}).get(BASES_LABEL) == base_ids:
                out(f"image {task.image}: built before from the same context and base (cached)\n")
                return task.image
            out(f"image {task.image}: its base image changed since it was built: rebuilding\n")
        out(f"building {task.image} from {ctx / task.build.dockerfile} (no network, no pull)\n")
        error: list[str] = []
        # The engine finishes a build whose client went away (a deadline): it builds under a name of
        # its own, and only a build that ended in time is tagged as the cached image.
        repo, _, final_tag = task.image.rpartition(":")
        scratch = _scratch_tag(repo, time.time() + task.build.timeout)

        def build() -> None:
            for chunk in client.api.build(
                path=str(ctx),
                dockerfile=task.build.dockerfile,
                tag=scratch,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                decode=True,
                labels={"opencode-tui.task": task.id, BASES_LABEL: base_ids},
            ):
                if "stream" in chunk:
                    out(str(chunk["stream"]))
                elif "status" in chunk:
                    out(f"{chunk['status']}\n")
                if "error" in chunk or "errorDetail" in chunk:
                    msg = (
                        chunk.get("error")
                        or (chunk.get("errorDetail") or {}).get("message")
                        or "build failed"
                    )
                    error.append(str(msg))
                    out(f"ERROR: {msg}\n")

        try:
            await asyncio.wait_for(asyncio.to_thread(build), task.build.timeout)
        except TimeoutError as exc:
            client.close()  # breaks the build's stream; the engine stops the build with it
            raise image_build_failure(
                task,
                f"building {task.image} did not finish within {task.build.timeout:g}s",
                "".join(log_parts),
                timeout_s=task.build.timeout,
                source=BUILD_SOURCE,
            ) from exc
        except (APIError, DockerException) as exc:
            error.append(str(exc))
        if error:
            raise image_build_failure(
                task,
                f"building {task.image} failed: {error[-1][:500]}",
                "".join(log_parts),
                error=error[-1][:2000],
                source=BUILD_SOURCE,
            )
        try:
            client.api.tag(scratch, repo, final_tag)
            client.api.remove_image(scratch)  # only the scratch name: the image keeps its real tag
        except (APIError, DockerException) as exc:
            raise image_build_failure(
                task,
                f"tagging the built image as {task.image} failed: {exc}",
                "".join(log_parts),
                source=BUILD_SOURCE,
            ) from exc
        return task.image
    finally:
        client.close()
