"""No progress is a failure, not a loop: model answers that give the agent nothing end the episode.

A real server can answer every call with HTTP 200 and nothing in it (llama.cpp's server with a chat
format that cannot stream tool calls sends an empty body); OpenCode then asks again at once, thousands
of times. ``ProgressWatch`` folds the episode's model calls and says when that has gone on long enough:
``consecutive`` empty answers in a row, or ``total`` in the episode. What it finds is
``model_empty_response``, an evaluation failure (the endpoint is broken; the model is not judged),
cited with the calls as evidence.

An empty answer is a 2xx that is no answer (``ModelCall.answer_fault``) or a chat answer without text,
a tool call, reasoning or an output token. Calls answered with an HTTP error have kinds of their own
(rate limits, server errors) and OpenCode's own retries: they neither count nor break a run of empty
answers. Title calls count like the others.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.events import ModelCall
from opencode_tui_core.failures import Evidence, FailureEvent, FailureStage, GenericDetails

EMPTY_RESPONSE_KIND = "model_empty_response"
EVIDENCE_SOURCE = "proxy.model_calls"
_CITED = 20  # call ids named in the evidence (the first and the last ones)


def empty_answer(call: ModelCall) -> bool:
    """The call's answer gave the agent nothing (see the module docstring)."""
    if call.answer_fault is not None:
        return True
    return call.status is not None and 200 <= call.status < 300 and call.produced is False


def good_answer(call: ModelCall) -> bool:
    return call.produced is True and not call.failed


class NoProgress(BaseModel):
    """What ended the episode: which limit, and the empty calls behind it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: str  # "consecutive" or "total"
    count: int
    calls_seen: int
    call_ids: list[str]
    last_error: str | None = None

    def to_failure(self) -> FailureEvent:
        what = "in a row" if self.limit == "consecutive" else "in this episode"
        why = f" (last: {self.last_error})" if self.last_error else ""
        cited = self.call_ids if len(self.call_ids) <= _CITED else self.call_ids[:5] + self.call_ids[-15:]
        return FailureEvent(
            kind=EMPTY_RESPONSE_KIND,
            stage=FailureStage.AGENT,
            operation="model calls",
            message=f"{self.count} model answers {what} gave the agent nothing{why}; "
            f"the endpoint is not answering, so the agent was stopped after {self.calls_seen} calls",
            evidence=[
                Evidence(
                    source=EVIDENCE_SOURCE,
                    data={"limit": self.limit, "empty_answers": self.count, "call_ids": cited},
                )
            ],
            details=GenericDetails(
                data={"limit": self.limit, "empty_answers": self.count, "calls_seen": self.calls_seen}
            ),
        )


class ProgressWatch:
    """Folds model calls; ``observe`` returns a NoProgress once (a limit of 0 is off)."""

    def __init__(self, consecutive: int, total: int) -> None:
        self.consecutive = consecutive
        self.total = total
        self.calls = 0
        self.run: list[str] = []  # the current run of empty answers
        self.empty: list[str] = []  # every empty answer
        self.fired = False

    def observe(self, call: ModelCall) -> NoProgress | None:
        self.calls += 1
        if empty_answer(call):
            self.run.append(call.call_id)
            self.empty.append(call.call_id)
        elif good_answer(call):
            self.run.clear()
        if self.fired:
            return None
        if self.consecutive and len(self.run) >= self.consecutive:
            limit, ids = "consecutive", self.run
        elif self.total and len(self.empty) >= self.total:
            limit, ids = "total", self.empty
        else:
            return None
        self.fired = True
        return NoProgress(
            limit=limit, count=len(ids), calls_seen=self.calls, call_ids=list(ids), last_error=call.error
        )
