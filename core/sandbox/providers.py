"""Provider selection by name; imports are lazy so a missing optional backend never breaks the rest."""

from __future__ import annotations

from core.config import AgentConfig, ProviderName
from core.sandbox.base import SandboxProvider


def get_provider(name: ProviderName | str, config: AgentConfig | None = None) -> SandboxProvider:
    config = config or AgentConfig()
    name = ProviderName(name)
    if name is ProviderName.DOCKER:
        from core.sandbox.docker.provider import DockerProvider

        return DockerProvider()
    if name is ProviderName.LOCAL:
        from core.sandbox.local.provider import LocalProvider

        return LocalProvider()
    from core.sandbox.opensandbox.provider import OpenSandboxProvider  # type: ignore[import-not-found]

    return OpenSandboxProvider(config.sandbox.opensandbox)
