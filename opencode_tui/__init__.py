"""opencode-tui: the Textual TUI and command line over the ``core`` engine."""

from core import __version__

__all__ = ["__version__"]
