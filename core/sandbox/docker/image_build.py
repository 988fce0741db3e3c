"""Building a task's image from its Dockerfile with the Docker SDK (the docker plug-in's ``build_image``).

The tag carries the hash of the build context (core.tasks.with_build_tag), so an unchanged context is
built once and found afterwards. The build never pulls and has no network (``network_mode: none``):
its base must be an image the engine already has (scripts/build-images). Its output streams to the
episode as terminal output and to ``build/image.log`` in the run directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

from core.sandbox.docker.settings import DockerSettings
from core.sandbox.errors import image_build_failure


def _docker_client(settings: DockerSettings, timeout: int) -> Any:
    import docker

    if settings.base_url:
        return docker.DockerClient(base_url=settings.base_url, timeout=timeout)
    return docker.from_env(timeout=timeout)


def _failure(task: Any, message: str, log: str, **data: Any) -> Exception:
    return image_build_failure(task, message, log, source="docker.build", **data)


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
        raise _failure(task, f"the Docker engine is not reachable to build {task.image}: {exc}", "") from exc
    try:
        with contextlib.suppress(ImageNotFound):
            client.images.get(task.image)
            out(f"image {task.image}: built before from the same context (cached)\n")
            return task.image
        ctx = task.build_context
        out(f"building {task.image} from {ctx / task.build.dockerfile} (no network, no pull)\n")
        error: list[str] = []
        # The engine finishes a build whose client went away (a deadline): it builds under a name of
        # its own, and only a build that ended in time is tagged as the cached image.
        repo, _, final_tag = task.image.rpartition(":")
        scratch = f"{repo}:building-{uuid.uuid4().hex[:12]}"

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
                labels={"opencode-tui.task": task.id},
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
            raise _failure(
                task,
                f"building {task.image} did not finish within {task.build.timeout:g}s",
                "".join(log_parts),
                timeout_s=task.build.timeout,
            ) from exc
        except (APIError, DockerException) as exc:
            error.append(str(exc))
        if error:
            raise _failure(
                task,
                f"building {task.image} failed: {error[-1][:500]}",
                "".join(log_parts),
                error=error[-1][:2000],
            )
        try:
            client.api.tag(scratch, repo, final_tag)
            client.api.remove_image(scratch)  # only the scratch name: the image keeps its real tag
        except (APIError, DockerException) as exc:
            raise _failure(
                task, f"tagging the built image as {task.image} failed: {exc}", "".join(log_parts)
            ) from exc
        return task.image
    finally:
        client.close()
