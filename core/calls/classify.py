"""What kind of model call a request is: OpenCode's title request, an agent turn, a compaction, or other.

Shared by the scripted model (to decide what to answer) and the recording proxy (to label calls).
Observed with OpenCode 1.18.32 (docs/opencode-notes.md):

- title: no tools; the system prompt begins "You are a title generator".
- agent turn: tools present (``bash``, ``read``, ...); system prompt "You are opencode, ...".
- compaction: no tools; the system prompt begins "You are a context summarization agent"; the last user
  message holds ``<conversation>...</conversation>`` and asks for an "anchored summary".

The explicit title and summarization prompts win over the presence of tools, so a future version that
sends tools with those prompts is still classified by what it asks for.
"""

from __future__ import annotations

import json
from typing import Any, Literal

CallKind = Literal["title", "agent", "compaction", "other"]

TITLE_PREFIX = "you are a title generator"
COMPACTION_PREFIX = "you are a context summarization agent"
_COMPACTION_USER_MARKERS = ("<conversation>", "anchored summary", "<prior-summary>")


def content_text(content: Any) -> str:
    """The text of a chat message's ``content``: a string, or a list of parts (``{"type": "text"}``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
        return "\n".join(out)
    return ""


def system_prompt(body: dict[str, Any]) -> str:
    """All system text of a chat request: ``system``/``developer`` messages (or a top-level ``system``)."""
    parts: list[str] = []
    top = body.get("system")
    if top is not None:
        parts.append(content_text(top))
    for msg in body.get("messages") or []:
        if isinstance(msg, dict) and msg.get("role") in ("system", "developer"):
            parts.append(content_text(msg.get("content")))
    return "\n".join(p for p in parts if p)


def has_tools(body: dict[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and len(tools) > 0


def classify_body(body: dict[str, Any]) -> CallKind:
    """Classify a parsed chat-completions (or messages/responses) request body."""
    if not isinstance(body, dict) or not isinstance(body.get("messages") or body.get("input"), list):
        return "other"
    system = system_prompt(body).lstrip().lower()
    if system.startswith(TITLE_PREFIX):
        return "title"
    if system.startswith(COMPACTION_PREFIX):
        return "compaction"
    if has_tools(body):
        return "agent"
    if "summariz" in system or "summaris" in system:
        return "compaction"
    messages = body.get("messages") or []
    last_user = next(
        (m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"),
        None,
    )
    if last_user is not None:
        text = content_text(last_user.get("content"))
        if all(marker in text for marker in _COMPACTION_USER_MARKERS[:2]):
            return "compaction"
    if "title generator" in system:
        return "title"
    return "other"


def classify(path: str, body: bytes | str | dict[str, Any] | None) -> CallKind:
    """Classify a request by path and body; anything that is not a JSON chat request is ``other``."""
    if not path.rstrip("/").endswith(("/chat/completions", "/messages", "/responses")):
        return "other"
    if isinstance(body, dict):
        return classify_body(body)
    if not body:
        return "other"
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "other"
    return classify_body(parsed) if isinstance(parsed, dict) else "other"
