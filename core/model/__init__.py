"""The model side of an episode: the recording proxy, the scripted model, and model calls made readable.

The names below are the package's public surface: what code outside ``core`` (the CLI and the TUI)
may use (an import-linter contract in pyproject.toml keeps ``opencode_tui`` to these).
"""

from opencode_tui_core.model.hold import HandAnswer, HandToolCall, answer_json
from opencode_tui_core.model.readable import (
    AssembledResponse,
    Conversation,
    ToolCallMade,
    assemble_response,
    conversation,
)

__all__ = [
    "AssembledResponse",
    "Conversation",
    "HandAnswer",
    "HandToolCall",
    "ToolCallMade",
    "answer_json",
    "assemble_response",
    "conversation",
]
