"""The control socket's wire format: one JSON request per line, one JSON reply per line."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.model.hold import HandAnswer

CONTROL_SOCKET = "control.sock"  # in the run directory, mode 0600, while the run is live


class CtlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: Literal["status", "pause", "continue", "step", "say", "answer", "edit", "abort", "break"]
    text: str | None = None  # say: the message; break: the condition
    # answer: the model's reply, written by hand; edit: the model's held reply, edited (none: forward
    # the held call and hold its reply)
    answer: HandAnswer | None = None
    who: str = "ctl"
    with_request: bool = False  # status: the held request's whole body too (the TUI's call view)


class HeldView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_number: int
    call_id: str
    age_s: float
    reason: str
    run_deadline_in_s: float | None = None
    conversation: str  # the held request, short and readable
    stage: Literal["request", "reply"] = "request"  # reply: the model answered, held for editing
    reply: HandAnswer | None = None  # that reply
    request_body: Any = None  # the whole request (asked for with ``with_request``)


class StatusView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    phase: str
    live: bool
    held: HeldView | None = None
    breaks: list[str] = Field(default_factory=list)
    agent_calls: int = 0
    interventions: int = 0


class CtlReply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    message: str  # one line for a person
    status: StatusView | None = None
