"""opencode-tui engine: runs one OpenCode episode in a sandbox and reports it as a typed event stream.

This package never imports Textual or the TUI package (an import-linter contract enforces it).
"""

__version__ = "0.1.0"
