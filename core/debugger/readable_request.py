"""A held request as a short conversation a person reads at a break (built on opencode_tui_core.model.readable)."""

from __future__ import annotations

import json
from typing import Any

from opencode_tui_core.model.readable import conversation

MESSAGES_SHOWN = 6
TEXT_CHARS = 300


def _clip(text: str, limit: int = TEXT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_conversation(body: Any) -> str:
    """The last few messages of the request, one block each; the tools offered on one line."""
    conv = conversation(body)
    if not conv.understood:
        return "(the request is not a chat conversation)"
    lines = [f"tools offered: {', '.join(t.name for t in conv.tools) or 'none'}"]
    skipped = len(conv.messages) - MESSAGES_SHOWN
    if skipped > 0:
        lines.append(f"… {skipped} earlier message(s)")
    for m in conv.messages[-MESSAGES_SHOWN:]:
        head = f"[{m.role}]" + (f" (result of {m.tool_call_id})" if m.tool_call_id else "")
        body_text = _clip(m.text) if m.text else ""
        lines.append(f"{head} {body_text}".rstrip())
        for tc in m.tool_calls:
            args = json.dumps(tc.arguments) if tc.parsed else tc.arguments_raw
            lines.append(f"    → {tc.name}({_clip(args, 200)})")
    return "\n".join(lines)
