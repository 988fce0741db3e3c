"""Building a task's image from its Dockerfile (Harbor task directories), with the Docker SDK.

The tag carries the hash of the build context (core.tasks.with_build_tag), so an unchanged context is
built once and found afterwards. The build never pulls and has no network (``network_mode: none``):
its base must be an image the engine already has (scripts/build-images). Its output streams to the
episode as terminal output and to ``build/image.log`` in the run directory; a failed build is the
``image_build_failed`` failure at stage seed, with the end of the build log as evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

from core.events import Event, TerminalOutput
from core.failures import FailureEvent, FailureStage
from core.failures.evidence import Evidence

BUILD_LOG = "build/image.log"
LOG_TAIL_CHARS = 4000


class ImageBuildFailed(Exception):
    """Carries the typed failure (the episode records it at stage seed)."""

    def __init__(self, failure: FailureEvent) -> None:
        super().__init__(failure.message)
        self.failure = failure


def _failure(task: Any, message: str, log: str, **data: Any) -> ImageBuildFailed:
    return ImageBuildFailed(
        FailureEvent(
            kind="image_build_failed",
            stage=FailureStage.SEED,
            operation="build task image",
            message=message,
            evidence=[
                Evidence(
                    source="docker.build",
                    scope=task.image,
                    data={"log_file": BUILD_LOG, "log_tail": log[-LOG_TAIL_CHARS:], **data},
                )
            ],
        )
    )


def build_refusal(task: Any, config: Any) -> str | None:
    """Why ``task`` cannot run on the configured provider (one line), or None when it can."""
    from core.sandbox import registry

    if task.build is None or registry.get(config.sandbox.provider).capabilities.image_build:
        return None
    where = task.build_context / task.build.dockerfile
    return (
        f"task {task.id} needs its image built from {where}; "
        f"the {config.sandbox.provider} provider builds no images: use --provider docker"
    )


def _docker_client(config: Any, timeout: int) -> Any:
    import docker

    base_url = getattr(config.sandbox.settings_for("docker"), "base_url", None)
    if base_url:
        return docker.DockerClient(base_url=base_url, timeout=timeout)
    return docker.from_env(timeout=timeout)


async def ensure_task_image(task: Any, config: Any, run_dir: Any, emit: Callable[[Event], Any]) -> str | None:
    """Build ``task.image`` from ``task.build`` unless the engine has it already; the tag, or None
    for a task without a build. Raises ImageBuildFailed (also when the provider builds no images)."""
    if task.build is None:
        return None
    refusal = build_refusal(task, config)
    if refusal:
        raise _failure(task, refusal, "")
    from docker.errors import APIError, DockerException, ImageNotFound

    loop = asyncio.get_running_loop()
    log_parts: list[str] = []
    lock = threading.Lock()

    def out(text: str) -> None:
        with lock:
            log_parts.append(text)
        run_dir.append_text(BUILD_LOG, text)
        # A build past its deadline may still print from its thread after the episode moved on.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(emit, TerminalOutput(stream="display", data=text))

    try:
        client = _docker_client(config, max(60, int(task.build.timeout)))
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
