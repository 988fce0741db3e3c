"""Break conditions: when the recording proxy holds an agent's model call before forwarding it.

Written as ``next``, ``call:N``, ``tool:NAME``, ``warning``, ``error`` or ``failure`` (``run --break``,
``debug.breaks`` in a config file, or live through the control socket).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class BreakKind(StrEnum):
    NEXT = "next"  # before the next agent call
    CALL = "call"  # before the N-th agent call
    TOOL = "tool"  # before the first call after a tool named NAME ran
    WARNING = "warning"  # before the first call after a health warning
    ERROR = "error"  # before the first call after a failed call (4xx/5xx/stall/empty answer)
    FAILURE = "failure"  # before the first call after a failure event


BREAK_SYNTAX = "next, call:N (N >= 1), tool:NAME, warning, error or failure"


class BreakCondition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: BreakKind
    call: int | None = Field(default=None, ge=1)
    tool: str | None = None

    @property
    def words(self) -> str:
        if self.kind is BreakKind.CALL:
            return f"call:{self.call}"
        if self.kind is BreakKind.TOOL:
            return f"tool:{self.tool}"
        return self.kind.value


class BreakSyntaxError(ValueError):
    pass


def parse_break(text: str) -> BreakCondition:
    """``call:2`` → BreakCondition; BreakSyntaxError naming the accepted forms otherwise."""
    word, sep, arg = text.strip().partition(":")
    try:
        kind = BreakKind(word.strip().lower())
    except ValueError:
        raise BreakSyntaxError(f"unknown break condition {text!r}: use {BREAK_SYNTAX}") from None
    arg = arg.strip()
    if kind is BreakKind.CALL:
        if not arg.isdigit() or int(arg) < 1:
            raise BreakSyntaxError(f"break condition {text!r} needs a call number: call:N with N >= 1")
        return BreakCondition(kind=kind, call=int(arg))
    if kind is BreakKind.TOOL:
        if not arg:
            raise BreakSyntaxError(f"break condition {text!r} needs a tool name: tool:NAME (e.g. tool:bash)")
        return BreakCondition(kind=kind, tool=arg)
    if sep:
        raise BreakSyntaxError(
            f"break condition {word!r} takes no argument (got {text!r}): use {BREAK_SYNTAX}"
        )
    return BreakCondition(kind=kind)
