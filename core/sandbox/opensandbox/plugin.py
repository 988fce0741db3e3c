"""The OpenSandbox provider as a plug-in (entry point ``opensandbox``): settings, capabilities, checks."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from pydantic import BaseModel

from opencode_tui_core.provider_registry import Capabilities, Check, ProviderPlugin
from opencode_tui_core.sandbox.opensandbox.oom_rules import RULES, SOURCE_OS_DIAGNOSTICS, SOURCE_OS_LIFECYCLE
from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxSettings

if TYPE_CHECKING:
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.sandbox.opensandbox.provider import OpenSandboxProvider

PREFLIGHT_DEADLINE_S = 10.0


class OpenSandboxPlugin(ProviderPlugin):
    name = "opensandbox"
    summary = "sandboxes from an OpenSandbox server (lifecycle and execd APIs)"
    settings_model = OpenSandboxSettings
    # No model socket: the sandboxes use the server's network mode and reach the model proxy by URL.
    capabilities = Capabilities(
        memory_limit=True,
        cpu_limit=True,
        pty=True,
        oom_evidence=frozenset({SOURCE_OS_LIFECYCLE, SOURCE_OS_DIAGNOSTICS}),
        borrowed=True,
        images=True,
        users=True,
        host_mounts=True,
        listing=True,
        sweep_by_default=False,  # listing needs the configured server: sweep names it explicitly
    )
    oom_rules = RULES

    def provider(self, settings: BaseModel) -> OpenSandboxProvider:
        from opencode_tui_core.sandbox.opensandbox.provider import OpenSandboxProvider

        s = self.settings(settings)
        assert isinstance(s, OpenSandboxSettings)
        return OpenSandboxProvider(s)

    async def preflight(self, config: AgentConfig) -> list[Check]:
        """The configured server answers a listing of our sandboxes (a warning when it does not:
        OpenSandbox is optional)."""
        from opencode_tui_core.sandbox.base import default_owner

        settings = config.sandbox.settings_for(self.name)
        provider = self.provider(settings)
        try:
            records = await asyncio.wait_for(provider.listed(owner=default_owner()), PREFLIGHT_DEADLINE_S)
        except Exception as exc:
            detail = f"{provider.api_url('')} not usable ({str(exc) or type(exc).__name__}); only needed for --provider opensandbox"
            return [Check(name="opensandbox server", status="warn", detail=detail)]
        finally:
            await provider.aclose()
        return [
            Check(
                name="opensandbox server",
                status="ok",
                detail=f"{provider.api_url('')}: {len(records)} sandbox(es) of ours",
            )
        ]


PLUGIN = OpenSandboxPlugin()
