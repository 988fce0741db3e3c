"""The panels' state: a fold over the event stream (pure Python, no Textual).

Live and replay feed the same :meth:`RunState.apply_batch`. For the replay timeline the state "as of" an
event is rebuilt by folding only the key events (everything but terminal output and OpenCode's own
events, which only affect the terminal pane, but for the line naming the episode's own session, which
tells a subagent's model calls apart) up to that point, which is cheap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

from opencode_tui_core.artifacts import RunInfo
from opencode_tui_core.debugger.debugger import INTERVENING
from opencode_tui_core.events import (
    CleanupObserved,
    CleanupStep,
    Compaction,
    EpisodeStarted,
    Event,
    FailureRecorded,
    FailureRecovered,
    HealthWarning,
    InstallProgress,
    Intervention,
    ModelCall,
    OpenCodeEvent,
    OutcomeDecided,
    PhaseChanged,
    SandboxFault,
    SandboxReady,
    ShellOpened,
    TerminalOutput,
    ToolCall,
    TranscriptStats,
    VerificationFinished,
    Warning_,
)
from opencode_tui_core.tally import ROOT_SESSION_EVENT, Tally

CLEANUP_ORDER = (
    CleanupStep.RECEIPT,
    CleanupStep.DESCENDANTS,
    CleanupStep.TRANSCRIPT_SNAPSHOT,
    CleanupStep.SANDBOX_RELEASED,
)


# Interventions that start a hold, and those that end it (say and pause leave it as it is).
HOLDS = frozenset({"break", "reply"})
RELEASES = frozenset({"continue", "step", "answer", "edit", "edited", "abort", "release"})


@dataclass
class RunState:
    """Everything the header and the panels show, folded from events (plus run.json when replaying)."""

    info: RunInfo | None = None
    started: EpisodeStarted | None = None
    sandbox: SandboxReady | None = None
    phase: PhaseChanged | None = None
    install: dict[str, InstallProgress] = field(default_factory=dict)
    warnings: list[Warning_] = field(default_factory=list)
    tally: Tally = field(
        default_factory=Tally
    )  # tool calls, compactions, model calls, tokens (opencode_tui_core.tally)
    cleanup: dict[CleanupStep, CleanupObserved] = field(default_factory=dict)
    failures: list[FailureRecorded | FailureRecovered] = field(default_factory=list)  # both, in order
    health: list[HealthWarning] = field(default_factory=list)  # episode-health warnings (core/health.py)
    faults: list[SandboxFault] = field(default_factory=list)  # kernel kills and a full disk, seen live
    verification: VerificationFinished | None = None
    outcome: OutcomeDecided | None = None
    shells: list[ShellOpened] = field(default_factory=list)
    interventions: list[Intervention] = field(default_factory=list)  # the debugger's (issue 27)
    # The hold in force: the ``break`` (a call held before it is sent) or ``reply`` (its reply held for
    # editing) intervention that started it; None once released.
    held: Intervention | None = None
    first_ts: datetime | None = None
    last_ts: datetime | None = None
    events: int = 0
    terminal_chars: int = 0

    @classmethod
    def fold(cls, events: Iterable[Event], info: RunInfo | None = None) -> RunState:
        state = cls(info=info)
        for event in events:
            state.apply(event)
        return state

    def apply_batch(self, events: list[Event], base: int) -> list[int]:
        """Fold a batch in; returns the stream indices (``base`` + position) of its key events."""
        if not events:
            return []
        if self.first_ts is None:
            self.first_ts = events[0].ts
        self.last_ts = events[-1].ts
        self.events += len(events)
        keys: list[int] = []
        for i, ev in enumerate(events):
            kind = type(ev)
            if kind is TerminalOutput:
                self.terminal_chars += len(cast(TerminalOutput, ev).data)
            elif kind is not OpenCodeEvent or cast(OpenCodeEvent, ev).event_type == ROOT_SESSION_EVENT:
                self._apply_key(ev)
                keys.append(base + i)
        return keys

    def apply(self, ev: Event) -> bool:
        """Fold one event in; True when a panel other than the terminal changed."""
        self.events += 1
        if self.first_ts is None:
            self.first_ts = ev.ts
        self.last_ts = ev.ts
        if isinstance(ev, TerminalOutput):
            self.terminal_chars += len(ev.data)
            return False
        if isinstance(ev, OpenCodeEvent) and ev.event_type != ROOT_SESSION_EVENT:
            return False
        self._apply_key(ev)
        return True

    def _apply_key(self, ev: Event) -> None:
        if isinstance(ev, ModelCall | ToolCall | Compaction | TranscriptStats | OpenCodeEvent):
            self.tally.count(ev)
        elif isinstance(ev, PhaseChanged):
            self.phase = ev
        elif isinstance(ev, EpisodeStarted):
            self.started = ev
        elif isinstance(ev, SandboxReady):
            self.sandbox = ev
        elif isinstance(ev, InstallProgress):
            self.install[ev.package] = ev
        elif isinstance(ev, Warning_):
            self.warnings.append(ev)
        elif isinstance(ev, CleanupObserved):
            self.cleanup[ev.step] = ev
        elif isinstance(ev, FailureRecorded | FailureRecovered):
            self.failures.append(ev)
        elif isinstance(ev, VerificationFinished):
            self.verification = ev
        elif isinstance(ev, OutcomeDecided):
            self.outcome = ev
        elif isinstance(ev, ShellOpened):
            self.shells.append(ev)
        elif isinstance(ev, HealthWarning):
            self.health.append(ev)
        elif isinstance(ev, SandboxFault):
            self.faults.append(ev)
        elif isinstance(ev, Intervention):
            self.interventions.append(ev)
            if ev.what in HOLDS:
                self.held = ev
            elif ev.what in RELEASES:
                self.held = None

    # -- derived values ------------------------------------------------------------------------

    @property
    def problems(self) -> Sequence[FailureRecorded | FailureRecovered | HealthWarning | SandboxFault]:
        """Failures, health warnings and live kernel faults in stream order (the Failures/warnings table)."""
        if not self.health and not self.faults:
            return self.failures
        return sorted([*self.failures, *self.health, *self.faults], key=lambda ev: ev.seq)

    @property
    def human_intervened(self) -> bool:
        """A person used a shell before verification finished, or acted on the agent through the debugger
        (run.json says so for old runs too)."""
        return (
            any(s.marks_sample for s in self.shells)
            or any(i.what in INTERVENING for i in self.interventions)
            or bool(self.info and self.info.human_intervened)
        )

    @property
    def task_id(self) -> str | None:
        return self.started.task_id if self.started else (self.info.task_id if self.info else None)

    @property
    def provider(self) -> str | None:
        if self.sandbox:
            return self.sandbox.provider
        if self.started:
            return self.started.provider
        return self.info.provider if self.info else None

    @property
    def sandbox_id(self) -> str | None:
        return self.sandbox.sandbox_id if self.sandbox else (self.info.sandbox_id if self.info else None)

    @property
    def sandbox_user(self) -> str | None:
        if self.sandbox is not None and self.sandbox.user:
            return self.sandbox.user
        user = self.info.sandbox_user if self.info else None
        if not user:
            return None
        return f"{user.get('name') or '?'} (uid {user.get('uid')}, gid {user.get('gid')})"

    @property
    def sandbox_owned(self) -> bool | None:
        return self.sandbox.owned if self.sandbox else (self.info.sandbox_owned if self.info else None)

    @property
    def opencode_version(self) -> str | None:
        if self.started:
            return self.started.opencode_version
        return self.info.versions.get("opencode") if self.info else None

    @property
    def run_budget_s(self) -> float | None:
        return self.started.run_budget_s if self.started else None

    @property
    def start_time(self) -> datetime | None:
        if self.started:
            return self.started.ts
        if self.info:
            return self.info.started_at
        return self.first_ts

    @property
    def finished(self) -> bool:
        return self.outcome is not None or (self.phase is not None and self.phase.phase == "done")

    def elapsed_s(self, now: datetime | None = None) -> float | None:
        """Seconds since the episode started, up to ``now`` (live) or the last event seen (replay)."""
        start = self.start_time
        end = now or self.last_ts
        if start is None or end is None:
            return None
        return max((end - start).total_seconds(), 0.0)

    @property
    def model_calls(self) -> list[ModelCall]:
        return self.tally.model_calls

    @property
    def transcript(self) -> TranscriptStats | None:
        return self.tally.transcript

    @property
    def compactions(self) -> list[Compaction]:
        return self.tally.compaction_events

    @property
    def tool_counts(self) -> dict[str, int]:
        """Tool calls by tool, the most used first (opencode_tui_core.tally)."""
        return dict(Counter(self.tally.tool_calls).most_common())

    @property
    def tool_errors(self) -> int:
        return self.tally.tool_errors

    @property
    def compaction_count(self) -> int:
        return self.tally.compactions

    def tokens(self, attr: str) -> int | None:
        """A token total over every model call (opencode_tui_core.tokens: unknown is None, not zero)."""
        return getattr(self.tally.tokens, attr)

    @property
    def install_totals(self) -> tuple[int, int | None]:
        done = sum(p.bytes_done for p in self.install.values())
        totals = [p.bytes_total for p in self.install.values()]
        total = None if not totals or any(t is None for t in totals) else sum(t for t in totals if t)
        return done, total
