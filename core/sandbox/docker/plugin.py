"""The Docker provider as a plug-in (entry point ``docker``): settings, capabilities, doctor checks.

Cheap to import (the CLI loads every plug-in for its choices): the SDK is imported only when used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from opencode_tui_core.provider_registry import Capabilities, Check, ProviderPlugin
from opencode_tui_core.sandbox.docker.oom_rules import RULES, SOURCE_EVENTS, SOURCE_STATE
from opencode_tui_core.sandbox.docker.settings import DockerSettings
from opencode_tui_core.sandbox.oom import SOURCE_CGROUP

if TYPE_CHECKING:
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.sandbox.docker.provider import DockerProvider

SHORT_ID = 12  # a Docker short id


def _client(settings: DockerSettings) -> Any:
    from opencode_tui_core.sandbox.docker.common import docker_client

    return docker_client(settings.base_url, 10)


class DockerPlugin(ProviderPlugin):
    name = "docker"
    summary = "Docker containers from local images (the reference provider)"
    settings_model = DockerSettings
    capabilities = Capabilities(
        model_socket=True,
        memory_limit=True,
        cpu_limit=True,
        pids_limit=True,
        disk_limit=True,  # storage-opt size, only on storage drivers that support it; status() says
        pty=True,
        oom_evidence=frozenset({SOURCE_STATE, SOURCE_EVENTS, SOURCE_CGROUP}),
        borrowed=True,
        images=True,
        image_build=True,
        users=True,
        host_mounts=True,
        listing=True,
        sweep_by_default=True,
        warm=True,
    )
    oom_rules = RULES

    def provider(self, settings: BaseModel) -> DockerProvider:
        from opencode_tui_core.sandbox.docker.provider import DockerProvider

        s = self.settings(settings)
        assert isinstance(s, DockerSettings)
        return DockerProvider(base_url=s.base_url, api_timeout=s.api_timeout_s)

    async def build_image(self, task: Any, config: AgentConfig, log: Callable[[str], None]) -> str:
        from opencode_tui_core.sandbox.docker.image_build import build_task_image

        settings = config.sandbox.settings_for(self.name)
        assert isinstance(settings, DockerSettings)
        return await build_task_image(task, settings, log)

    async def preflight(self, config: AgentConfig) -> list[Check]:
        return await asyncio.to_thread(self._preflight, config)

    def _preflight(self, config: AgentConfig) -> list[Check]:
        from opencode_tui_core.config import DEFAULT_IMAGE

        settings = config.sandbox.settings_for(self.name)
        assert isinstance(settings, DockerSettings)
        try:
            client = _client(settings)
            version = client.version().get("Version", "?")
        except Exception as exc:
            return [
                Check(
                    name="docker engine",
                    status="warn",
                    detail=f"not reachable ({exc}); start it with scripts/start-dockerd",
                )
            ]
        out = [Check(name="docker engine", status="ok", detail=f"version {version}")]
        from opencode_tui_core.sandbox.docker.cgroup import disk_limit_support

        try:
            info = client.info()
            can, why = disk_limit_support(info)
            out.append(
                Check(
                    name="docker disk limit",
                    status="ok" if can else "warn",
                    detail=why if can else f"not enforced: {why}",
                )
            )
            pids = info.get("PidsLimit")
            detail = (
                "pids_limit supported" if pids else "not enforced: the engine reports no pids cgroup support"
            )
            out.append(Check(name="docker process limit", status="ok" if pids else "warn", detail=detail))
        except Exception as exc:
            out.append(Check(name="docker limits", status="warn", detail=f"docker info failed: {exc}"))
        image = config.sandbox.image or DEFAULT_IMAGE
        try:
            client.images.get(image)
            out.append(Check(name="docker image", status="ok", detail=image))
        except Exception:
            out.append(
                Check(
                    name="docker image",
                    status="warn",
                    detail=f"{image} missing; build it with scripts/build-images",
                )
            )
        return out

    async def admit(self, config: AgentConfig, images: Sequence[str]) -> list[Check]:
        return await asyncio.to_thread(self._admit, config, images)

    def _admit(self, config: AgentConfig, images: Sequence[str]) -> list[Check]:
        settings = config.sandbox.settings_for(self.name)
        assert isinstance(settings, DockerSettings)
        try:
            client = _client(settings)
            client.ping()
        except Exception as exc:
            detail = f"the Docker engine is not reachable ({exc}); start it (scripts/start-dockerd) or use --provider local"
            return [Check(name="docker engine", status="fail", detail=detail)]
        out = []
        for image in sorted(set(images)):
            try:
                client.images.get(image)
            except Exception:
                detail = f"image {image!r} does not exist on the Docker engine; build it with scripts/build-images (no registry is used)"
                out.append(Check(name="docker image", status="fail", detail=detail))
            else:
                out.append(Check(name="docker image", status="ok", detail=image))
        return out

    def short_id(self, sandbox_id: str) -> str:
        return sandbox_id[:SHORT_ID]


PLUGIN = DockerPlugin()
