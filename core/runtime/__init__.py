"""OpenCode inside the sandbox: installing it, preparing its home, supervising it, reading its stream.

The names below are the package's public surface: what code outside ``core`` (the CLI and the TUI)
may use (an import-linter contract in pyproject.toml keeps ``opencode_tui`` to these).
"""

from opencode_tui_core.runtime.stream import EventRenderer

__all__ = ["EventRenderer"]
