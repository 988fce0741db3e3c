"""Provider selection by name, through the plug-in registry (core/provider_registry.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opencode_tui_core import provider_registry as registry
from opencode_tui_core.sandbox.base import SandboxProvider

if TYPE_CHECKING:
    from opencode_tui_core.config import AgentConfig


def get_provider(name: str, config: AgentConfig | None = None) -> SandboxProvider:
    """The provider registered as ``name``, configured by ``config``'s settings for it (defaults if none).

    Raises ``UnknownProviderError`` (a ValueError) listing the registered names."""
    from opencode_tui_core.config import AgentConfig

    plugin = registry.get(name)
    return plugin.provider((config or AgentConfig()).sandbox.settings_for(plugin.name))
