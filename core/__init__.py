"""opencode-tui engine: runs one OpenCode episode in a sandbox and reports it as a typed event stream.

This package never imports Textual or the TUI package (an import-linter contract enforces it).
"""

__version__ = "0.1.0"

# The sandbox provider a config that names none uses (opencode_tui_core.config.SandboxConfig). Kept here, free of
# imports, so that the command line can name it in its help without loading pydantic or the registry.
DEFAULT_PROVIDER = "local"
