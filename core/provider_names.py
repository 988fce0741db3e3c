"""Which sandbox providers are registered: the entry points of ``opencode_tui.providers``, by name.

Kept apart from opencode_tui_core/provider_registry.py (the plug-ins themselves, pydantic models) so that naming
the providers costs no more than reading the installed metadata: the command line lists them in its
help and checks ``--provider`` without loading a plug-in.
"""

from __future__ import annotations

import functools
import importlib.metadata

from opencode_tui_core.plugins import scan

ENTRY_POINT_GROUP = "opencode_tui.providers"

# The built-in providers, also declared as entry points in pyproject.toml (a test keeps the two
# equal). Used only when the installed metadata lacks them: an editable install made before the
# entry points existed, or running from a source tree that is not installed.
BUILTIN = {
    "docker": "opencode_tui_core.sandbox.docker.plugin:PLUGIN",
    "local": "opencode_tui_core.sandbox.local.plugin:PLUGIN",
    "opensandbox": "opencode_tui_core.sandbox.opensandbox.plugin:PLUGIN",
}


@functools.cache
def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Each registered name's entry point (not loaded)."""
    return scan(ENTRY_POINT_GROUP, BUILTIN)


def names() -> list[str]:
    """Every registered provider name, sorted."""
    return sorted(entry_points())
