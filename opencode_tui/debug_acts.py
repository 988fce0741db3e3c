"""The TUI's side of the episode debugger (issue 27): a person's acts go to the run's control socket
(``opencode_tui_core.debugger.client``, the one ``opencode-tui ctl`` uses) as ``who="tui"``; replies written in the
answer/edit box become a ``HandAnswer``.

What the box takes: plain text (the model's reply is that text), one tool call as
``{"tool": NAME, "arguments": {...}}`` (with an optional ``"text"``), or the full form
``{"text": "...", "tool_calls": [{"name": NAME, "arguments": {...}}]}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from opencode_tui_core.debugger.client import NotLive, request
from opencode_tui_core.debugger.protocol import CtlReply, CtlRequest
from opencode_tui_core.model import HandAnswer, HandToolCall

WHO = "tui"
ANSWER_FORMS = 'plain text, {"tool": NAME, "arguments": {...}}, or {"text": ..., "tool_calls": [...]}'


class BadAnswer(ValueError):
    """The box holds no reply this can send (one line: what is wrong, what is accepted)."""


def parse_answer(text: str) -> HandAnswer:
    stripped = text.strip()
    if not stripped:
        raise BadAnswer(f"the reply is empty: write {ANSWER_FORMS}")
    if not stripped.startswith("{"):
        return HandAnswer(text=text.strip("\n"))
    try:
        data: Any = json.loads(stripped)
    except ValueError as exc:
        line = getattr(exc, "lineno", "?")
        raise BadAnswer(f"not valid JSON (line {line}): write {ANSWER_FORMS}") from None
    try:
        if isinstance(data, dict) and "tool" in data:
            extra = set(data) - {"tool", "arguments", "text"}
            if extra:
                raise BadAnswer(f"unknown field(s) {', '.join(sorted(extra))}: write {ANSWER_FORMS}")
            call = HandToolCall(name=data["tool"], arguments=data.get("arguments") or {})
            return HandAnswer(text=str(data.get("text") or ""), tool_calls=[call])
        return HandAnswer.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reply"
        raise BadAnswer(f"{where}: {first['msg']} (write {ANSWER_FORMS})") from None


def answer_text(answer: HandAnswer) -> str:
    """A reply as the box shows it for editing (the form ``parse_answer`` reads back)."""
    if not answer.tool_calls:
        return answer.text
    if len(answer.tool_calls) == 1:
        call = answer.tool_calls[0]
        data: dict[str, Any] = {"tool": call.name, "arguments": call.arguments}
        if answer.text:
            data["text"] = answer.text
        return json.dumps(data, indent=2, ensure_ascii=False)
    return json.dumps(answer.model_dump(exclude_defaults=True), indent=2, ensure_ascii=False)


def send(run_dir: Path | None, req: CtlRequest) -> CtlReply:
    """One act through the run's control socket (blocking: call it from a thread)."""
    if run_dir is None:
        return CtlReply(ok=False, message="the run directory does not exist yet: nothing to debug")
    try:
        return request(run_dir, req.model_copy(update={"who": WHO}))
    except NotLive as exc:
        return CtlReply(ok=False, message=str(exc))
    except ValueError as exc:  # a reply that is not the protocol's (a run of another version)
        return CtlReply(ok=False, message=f"the run answered something unexpected: {exc}")
