"""Building a task's image (Harbor task directories) on a provider that can: ``image_build``.

The provider's plug-in does the build (``ProviderPlugin.build_image``); this module holds what every
provider shares: the refusal for one that builds no images, the build log's name, the typed failure
(``opencode_tui_core.sandbox.errors.image_build_failure``), and where the build log goes (``RunFiles.BUILD_LOG``,
and the terminal as it streams).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from opencode_tui_core import provider_registry as registry
from opencode_tui_core.artifacts import RunDir, RunFiles
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.events import Event, TerminalOutput
from opencode_tui_core.sandbox.errors import image_build_failure
from opencode_tui_core.tasks import Task


def build_refusal(task: Task, config: AgentConfig) -> str | None:
    """Why ``task`` cannot run on the configured provider (one line), or None when it can."""
    context = task.build_context
    if (
        task.build is None
        or context is None
        or registry.get(config.sandbox.provider).capabilities.image_build
    ):
        return None
    where = context / task.build.dockerfile
    builders = [name for name in registry.names() if registry.get(name).capabilities.image_build]
    use = " or ".join(f"--provider {name}" for name in builders) or "a provider that builds images"
    return f"task {task.id} needs its image built from {where}; the {config.sandbox.provider} provider builds no images: use {use}"


async def ensure_task_image(
    task: Task, config: AgentConfig, run_dir: RunDir, emit: Callable[[Event], object]
) -> str | None:
    """Build ``task.image`` from ``task.build`` unless the engine has it already; the tag, or None
    for a task without a build. Raises ImageBuildFailed (also when the provider builds no images)."""
    if task.build is None:
        return None
    refusal = build_refusal(task, config)
    if refusal:
        raise image_build_failure(task, refusal, "", source="engine")
    loop = asyncio.get_running_loop()

    def log(text: str) -> None:
        # Called from the build's thread; a build past its deadline may still print after the episode
        # moved on (the loop is then closed).
        run_dir.append_text(RunFiles.BUILD_LOG, text)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(emit, TerminalOutput(stream="display", data=text))

    return await registry.get(config.sandbox.provider).build_image(task, config, log)
