"""Sandboxes: the provider interface (base), the built-in providers and what they share.

The names below are the package's public surface: what code outside ``core`` (the CLI and the TUI)
may use. Everything else under ``opencode_tui_core.sandbox`` is the engine's own (an import-linter contract in
pyproject.toml keeps ``opencode_tui`` to these).
"""

from opencode_tui_core.sandbox.base import PtyHandle
from opencode_tui_core.sandbox.kept import KeptRecord
from opencode_tui_core.sandbox.kept import find as find_kept
from opencode_tui_core.sandbox.providers import get_provider

__all__ = ["KeptRecord", "PtyHandle", "find_kept", "get_provider"]
