"""opencode-tui: the Textual TUI and command line over the ``core`` engine."""

from opencode_tui_core import __version__

__all__ = ["__version__"]
