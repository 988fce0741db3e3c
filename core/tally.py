"""The one tally of an episode's tool calls, compactions, model calls and tokens, folded from its
events: live (a bus subscriber of the episode: the batch line and run.json's counts), in the TUI (the
stats panel, live and in replay) and read back (``opencode-tui diff``). They cannot disagree.

- Tool calls: the transcript's counts once it is known (``TranscriptStats``: the source of truth,
  taken after confirmed cleanup), before that each distinct tool call the events showed (a call id
  counts once, from its first event; a subagent's calls are not the episode's and are not events).
- Compactions: likewise, the transcript's, else the highest count the proxy reported (never lowered by
  a late, lower one).
- Model calls: one per call id (a later record of the same call replaces it); their tokens are
  ``opencode_tui_core.tokens.token_totals`` (unknown is None, never 0). Agent tokens: the transcript's.
- A subagent's model calls: the episode's own session is the one the serve runner created (its
  ``runner.session`` line); a call that names another session (OpenCode's ``x-opencode-session`` header,
  recorded as the call's ``session_id``) was made by a subagent (the ``task`` tool's child session).
  Either fact missing (an older record, a call without the header): not marked.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from opencode_tui_core.events import (
    Compaction,
    Event,
    ModelCall,
    OpenCodeEvent,
    SandboxFault,
    SandboxReady,
    ToolCall,
    TranscriptStats,
)
from opencode_tui_core.tokens import TokenTotals, token_totals

# The serve runner's line naming the session it created (core/inside/serve_runner.py): the episode's own.
ROOT_SESSION_EVENT = "runner.session"


@dataclass
class Tally:
    """Counts taken from the event stream as it passes (``count`` each event, in order)."""

    model_calls: list[ModelCall] = field(default_factory=list)
    tools: dict[str, str] = field(default_factory=dict)  # call id → tool, every call seen
    errored: set[str] = field(default_factory=set)  # call ids that ended in an error
    compaction_events: list[Compaction] = field(default_factory=list)
    transcript: TranscriptStats | None = None
    last_command: str | None = None  # the agent's last bash command (for the record)
    unenforced_limits: list[str] = field(default_factory=list)  # from SandboxReady
    faults: list[SandboxFault] = field(default_factory=list)  # kernel kills, a full disk, seen live
    root_session: str | None = None  # the episode's own OpenCode session (ROOT_SESSION_EVENT)
    _call_rows: dict[str, int] = field(default_factory=dict, repr=False)

    def count(self, event: Event) -> None:
        if isinstance(event, OpenCodeEvent):
            if event.event_type == ROOT_SESSION_EVENT and self.root_session is None:
                props = event.payload.get("properties")
                sid = props.get("sessionID") if isinstance(props, dict) else None
                self.root_session = sid if isinstance(sid, str) and sid else None
        elif isinstance(event, SandboxFault):
            self.faults.append(event)
        elif isinstance(event, SandboxReady):
            self.unenforced_limits = event.unenforced_limits
        elif isinstance(event, ModelCall):
            row = self._call_rows.get(event.call_id)
            if row is None:
                self._call_rows[event.call_id] = len(self.model_calls)
                self.model_calls.append(event)
            else:
                self.model_calls[row] = event
        elif isinstance(event, ToolCall):
            self.tools.setdefault(event.call_id, event.tool)
            if event.status == "running":
                command = event.input.get("command")
                if isinstance(command, str):
                    self.last_command = command[:200]
            elif event.status == "error":
                self.errored.add(event.call_id)
        elif isinstance(event, Compaction):
            self.compaction_events.append(event)
        elif isinstance(event, TranscriptStats):
            self.transcript = event

    def subagent_session(self, session_id: str | None) -> bool:
        """Is ``session_id`` a subagent's (known, and not the episode's own session)?"""
        return session_id is not None and self.root_session is not None and session_id != self.root_session

    def subagent_call(self, call: ModelCall) -> bool:
        return self.subagent_session(call.session_id)

    @property
    def subagent_calls(self) -> int:
        return sum(1 for c in self.model_calls if self.subagent_call(c))

    @property
    def tool_calls(self) -> dict[str, int]:
        """Tool calls by tool (in the order the tools were first used)."""
        if self.transcript is not None:
            return dict(self.transcript.tool_calls)
        return dict(Counter(self.tools.values()))

    @property
    def tool_call_count(self) -> int:
        return sum(self.tool_calls.values())

    @property
    def tool_errors(self) -> int:
        """Tool calls that ended in an error (the events'; the transcript does not count them)."""
        return len(self.errored)

    @property
    def compactions(self) -> int:
        if self.transcript is not None:
            return self.transcript.compactions
        if not self.compaction_events:
            return 0
        return max(max(c.count for c in self.compaction_events), len(self.compaction_events))

    @property
    def tokens(self) -> TokenTotals:
        """Every model call's tokens (title and compaction calls included)."""
        return token_totals(self.model_calls)

    @property
    def agent_tokens_in(self) -> int | None:
        return self.transcript.tokens_in if self.transcript else None

    @property
    def agent_tokens_out(self) -> int | None:
        return self.transcript.tokens_out if self.transcript else None
