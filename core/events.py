"""The typed event stream: every observable fact of an episode, in order.

One discriminated union (``Event``), each member with a monotonically increasing ``seq`` and a
timestamp. The same events feed the live TUI, the run directory (``events.jsonl``) and batch output;
a replayed run directory feeds them to the same widgets.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from opencode_tui_core.failures import Decision, Evidence, FailureClass, FailureEvent, Outcome, Recovery
from opencode_tui_core.failures.evidence import utcnow


class Phase(StrEnum):
    ADMISSION = "admission"
    SEED = "seed"
    INSTALL = "install"
    AGENT = "agent"
    CLOSING = "closing"
    TRANSCRIPT = "transcript"
    VERIFICATION = "verification"
    RELEASE = "release"
    DONE = "done"


class CleanupProof(StrEnum):
    """What proved that no process of the run is left: the supervisor's positive receipt, or the
    destruction of an owned sandbox (a destroyed container or PID namespace holds no process)."""

    RECEIPT = "receipt"
    DESTROYED = "destroyed"
    NOTHING_LAUNCHED = "nothing_launched"  # the harness never started: no process of the run existed
    # the engine, asked again after it went away, reports the sandbox dead (an exited container, a
    # PID namespace whose pid 1 is gone): no process of the run can be left, receipt or not
    FOUND_DEAD = "found_dead"


class StepState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = 0
    ts: datetime = Field(default_factory=utcnow)
    attempt: int = 1


class EpisodeStarted(_Event):
    type: Literal["episode_started"] = "episode_started"
    run_id: str
    task_id: str
    provider: str
    opencode_version: str
    run_budget_s: float
    close_budget_s: float
    model: str
    model_url: str | None = None  # None: the embedded scripted model


class PhaseChanged(_Event):
    type: Literal["phase"] = "phase"
    phase: Phase
    state: StepState = StepState.RUNNING
    detail: str | None = None


class SandboxReady(_Event):
    type: Literal["sandbox"] = "sandbox"
    sandbox_id: str
    provider: str
    owned: bool
    network: str
    memory_limit_enforced: bool | None = None
    pids_limit_enforced: bool | None = None
    disk_limit_enforced: bool | None = None
    notes: list[str] = Field(default_factory=list)
    # Who the harness, OpenCode and the shell run as: "agent (uid 1000, gid 1000)"; who chose it.
    user: str | None = None
    uid: int | None = None
    gid: int | None = None
    user_source: str | None = None

    @property
    def unenforced_limits(self) -> list[str]:
        """The limits asked for that the provider does not enforce (``notes`` says why)."""
        flags = (
            ("memory", self.memory_limit_enforced),
            ("pids", self.pids_limit_enforced),
            ("disk", self.disk_limit_enforced),
        )
        return [name for name, enforced in flags if enforced is False]


class WarmSandbox(_Event):
    """The attempt was given a sandbox prepared ahead of it by the batch's warm pool (created, OpenCode
    installed): when it was prepared, and how long the attempt waited for it (0: it was ready)."""

    type: Literal["warm_sandbox"] = "warm_sandbox"
    sandbox_id: str
    provider: str
    prepared_at: datetime  # when its preparation finished
    prepare_s: float  # how long creating it and installing OpenCode took
    waited_s: float  # how long this attempt waited for it (its preparation was under way)
    age_s: float  # how long it had waited ready, when the attempt took it
    pool_run: str  # its run label (``pool-…``): the pool's, not this run's
    server_ahead: bool = False  # OpenCode's server was started too, and waited for this task


class InstallProgress(_Event):
    type: Literal["install_progress"] = "install_progress"
    package: str
    bytes_done: int
    bytes_total: int | None = None
    cached: bool = False


# Warning codes that report a step the engine took for the run, not a risk to it: shown as information.
INFORMATIONAL_WARNINGS = frozenset(
    {"ripgrep_provisioned", "replay_started", "replay_said", "replay_live", "replay_workspace_matched"}
)
# Warning codes that say the agent is being stopped ("stopping the agent…"): news until it has stopped.
STOPPING_WARNINGS = frozenset({"cancel_requested", "cancel_hurried", "agent_stopped"})


class Warning_(_Event):
    type: Literal["warning"] = "warning"
    code: str
    message: str

    @property
    def informational(self) -> bool:
        return self.code in INFORMATIONAL_WARNINGS


class TerminalOutput(_Event):
    """Bytes the harness (or an exec) printed, decoded as UTF-8; ``stream`` says which pipe."""

    type: Literal["terminal"] = "terminal"
    stream: Literal["stdout", "stderr", "pty", "display"]
    data: str


class OpenCodeEvent(_Event):
    """One JSON event from ``opencode run --format json`` or the server's event stream, as received."""

    type: Literal["opencode"] = "opencode"
    event_type: str
    payload: dict[str, Any]


def call_failed(status: int | None, error: str | None) -> bool:
    """One definition of a failed model call: no response, an HTTP error, or an error the recording
    proxy noted (a broken stream, a 2xx that is no answer)."""
    return status is None or status >= 400 or error is not None


class ModelCall(_Event):
    """One model call seen by the recording proxy (bodies live in model_calls.jsonl)."""

    type: Literal["model_call"] = "model_call"
    call_id: str
    method: str
    path: str
    status: int | None
    started_at: datetime
    latency_s: float | None  # the hold (``held_s``) left out: a forwarded call's latency is the model's
    held_s: float | None = None  # the debugger held the request this long (issue 27)
    ttft_s: float | None = None
    kind: Literal["title", "agent", "compaction", "other"] = "other"
    session_id: str | None = None
    message_id: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_cache_read: int | None = None
    tokens_reasoning: int | None = None
    error: str | None = None
    # A 2xx that is no answer (opencode_tui_core.calls.records.AnswerFault: empty_body, no_choices, unterminated,
    # error_object); such a call has an ``error`` too and counts as failed.
    answer_fault: str | None = None
    produced: bool | None = None  # text, a tool call, reasoning or output tokens; None: not a chat answer
    answered_by: str | None = None  # a person wrote this reply at a breakpoint: the model never saw it
    edited_by: str | None = None  # the model answered, a person edited the reply before OpenCode saw it

    @property
    def failed(self) -> bool:
        return call_failed(self.status, self.error)


class ToolCall(_Event):
    type: Literal["tool_call"] = "tool_call"
    call_id: str
    tool: str
    status: Literal["running", "completed", "error"]
    title: str | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    output: str | None = None
    message_id: str | None = None
    # bash: the command's exit status as OpenCode reported it (``state.metadata.exit``); None: not known
    exit_code: int | None = None
    # how long the tool ran, by OpenCode's own clock (``state.time``, once it ended): the events reach
    # the engine later than the tool starts and ends, so their times would not say
    duration_s: float | None = None


class Compaction(_Event):
    type: Literal["compaction"] = "compaction"
    count: int
    trigger: Literal["auto", "overflow", "manual", "unknown"] = "unknown"


class CleanupStep(StrEnum):
    RECEIPT = "receipt"
    DESCENDANTS = "descendants"
    TRANSCRIPT_SNAPSHOT = "transcript_snapshot"
    SANDBOX_RELEASED = "sandbox_released"


class CleanupObserved(_Event):
    type: Literal["cleanup"] = "cleanup"
    step: CleanupStep
    state: StepState
    reason: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class FailureRecorded(_Event):
    type: Literal["failure"] = "failure"
    failure: FailureEvent
    decision: Decision


class FailureRecovered(_Event):
    """A failure the sandbox provider recovered from without raising (an output stream lost and
    followed by execution id, a submission resubmitted, a hard cap returned as an unknown exit, a
    terminal's socket re-attached), or went on after (a terminal whose socket broke: it ended).
    Shown and recorded; never classified and never the outcome (that rests on ``FailureRecorded``
    and the results the episode itself observes)."""

    type: Literal["failure_recovered"] = "failure_recovered"
    failure: FailureEvent
    recovery: Recovery


class VerificationFinished(_Event):
    type: Literal["verification"] = "verification"
    exit_code: int | None
    reward: float | None
    passed: bool | None
    duration_s: float
    output_excerpt: str = ""
    user: str | None = None  # who ran the verifier (the sandbox user, or root when the task says so)


class TranscriptStats(_Event):
    """Counts from the transcript snapshot taken after confirmed cleanup (the source of truth)."""

    type: Literal["transcript"] = "transcript"
    messages: int
    tool_calls: dict[str, int]
    compactions: int
    compaction_triggers: list[str] = Field(default_factory=list)
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_cache_read: int | None = None
    tokens_reasoning: int | None = None
    # Sessions the agent started with the ``task`` tool; the counts above are the root session's (every
    # model call, a subagent's included, is in model_calls.jsonl).
    subagent_sessions: int = 0


class ShellOpened(_Event):
    """A person opened a shell in the sandbox. Before verification has finished this marks the
    sample (``marks_sample``): what a hand did in the sandbox can change the grade."""

    type: Literal["shell_opened"] = "shell_opened"
    shell: int
    phase: Phase
    marks_sample: bool
    cast: str  # its terminal recording, relative to the run directory
    user: str | None = None


class ShellClosed(_Event):
    type: Literal["shell_closed"] = "shell_closed"
    shell: int
    duration_s: float
    bytes_in: int
    bytes_out: int


class HealthKind(StrEnum):
    """Signs that an episode is going badly while it still runs (core/health.py decides them)."""

    COMPACTION_STORM = "compaction_storm"
    READS_WITHOUT_EDITS = "reads_without_edits"
    COMMAND_SILENT = "command_silent"
    REPEATED_TOOL_CALL = "repeated_tool_call"
    RETRY_STORM = "retry_storm"
    EMPTY_ANSWERS = "empty_answers"


class HealthWarning(_Event):
    """An episode-health warning: shown and counted, never a failure and never the outcome."""

    type: Literal["health"] = "health"
    kind: HealthKind
    message: str
    data: dict[str, Any] = Field(default_factory=dict)


class FaultKind(StrEnum):
    """What the sandbox's kernel did to the run while it ran (``SandboxFault``)."""

    OOM_KILL = "oom_kill"  # the kernel's OOM killer killed a process of the sandbox
    DISK_FULL = "disk_full"  # the sandbox's writable space reached its limit (writes fail: ENOSPC)


class SandboxFault(_Event):
    """A kernel kill or a full disk, seen while the agent ran (the provider's live watch), emitted when
    seen with ``ts`` set to when it happened (the kernel's record, else the poll that saw it).

    ``pid`` is the process id as the sandbox sees it, ``host_pid`` as the host does; ``command`` is its
    command line from the sandbox's process table (or the kernel's task name when only that is known).
    ``tool_call_id``/``tool_command``: the agent's shell command that was running then, when one was."""

    type: Literal["sandbox_fault"] = "sandbox_fault"
    kind: FaultKind
    source: str  # what saw it: kernel.log, cgroup.memory, docker.events, sandbox.disk
    message: str
    pid: int | None = None
    host_pid: int | None = None
    command: str | None = None
    tool_call_id: str | None = None
    tool_command: str | None = None
    evidence: list[Evidence] = Field(default_factory=list)


class Intervention(_Event):
    """A person acted on the live agent through the debugger (issue 27): held a call, released it,
    added a message, wrote the model's answer, or stopped the turn."""

    type: Literal["intervention"] = "intervention"
    # edit: forward the held call and hold its reply; reply: the model's reply is held (text: the reply
    # as JSON); edited: a person replaced that reply (text: the new one).
    what: Literal[
        "break", "pause", "continue", "step", "say", "answer", "edit", "reply", "edited", "abort", "release"
    ]
    who: str  # "ctl", "tui", "engine" (a break condition or the run's end)
    call_id: str | None = None  # the held call it concerns
    call_number: int | None = None  # that call's number among the agent's calls
    text: str | None = None  # what was said or answered; the break condition; a release's reason


class OutcomeDecided(_Event):
    type: Literal["outcome"] = "outcome"
    action: Outcome
    reward: float | None
    failure_kind: str | None = None
    failure_class: FailureClass | None = None
    summary: str
    evidence: list[Evidence] = Field(default_factory=list)


Event = Annotated[
    EpisodeStarted
    | PhaseChanged
    | SandboxReady
    | WarmSandbox
    | InstallProgress
    | Warning_
    | TerminalOutput
    | OpenCodeEvent
    | ModelCall
    | ToolCall
    | Compaction
    | CleanupObserved
    | FailureRecorded
    | FailureRecovered
    | VerificationFinished
    | TranscriptStats
    | ShellOpened
    | ShellClosed
    | HealthWarning
    | SandboxFault
    | Intervention
    | OutcomeDecided,
    Field(discriminator="type"),
]

_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def encode(event: Event) -> str:
    """One JSON line (no trailing newline)."""
    return event.model_dump_json()


def decode(line: str | bytes) -> Event:
    return _ADAPTER.validate_json(line)


Subscriber = Callable[[Event], None]
# Sees every stamped event and returns events derived from it (emitted right after, outside the lock).
Deriver = Callable[[Event], Iterable[Event]]


class EventBus:
    """Stamps events with ``seq`` and fans them out to subscribers, in order, on every thread.

    Subscribers must be quick (append to a file, put on a queue); a failing subscriber is removed so
    one broken consumer cannot stop the episode.
    """

    def __init__(self, attempt: int = 1) -> None:
        self._seq = 0
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._derivers: list[Deriver] = []
        self.attempt = attempt
        self.errors: list[str] = []

    def subscribe(self, fn: Subscriber) -> None:
        self._subscribers.append(fn)

    def derive(self, fn: Deriver) -> None:
        """``fn`` sees every event after the subscribers and may return new events to emit (a subscriber
        cannot emit: the fan-out holds the bus's lock so every consumer sees one order)."""
        self._derivers.append(fn)

    def queue(self, loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Queue[Event]:
        """A queue that receives every event from now on (thread-safe delivery onto ``loop``)."""
        loop = loop or asyncio.get_running_loop()
        q: asyncio.Queue[Event] = asyncio.Queue()

        def put(ev: Event) -> None:
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                q.put_nowait(ev)
            else:
                loop.call_soon_threadsafe(q.put_nowait, ev)

        self.subscribe(put)
        return q

    def emit(self, event: Event) -> Event:
        failed: list[str] = []
        with self._lock:
            self._seq += 1
            stamped = event.model_copy(update={"seq": self._seq, "attempt": self.attempt})
            for fn in list(self._subscribers):
                try:
                    fn(stamped)
                except Exception as exc:  # a broken consumer must not break the episode
                    self.errors.append(f"{fn!r}: {exc!r}")
                    self._subscribers.remove(fn)
                    failed.append(f"{getattr(fn, '__qualname__', fn)!s}: {type(exc).__name__}: {exc}")
        for derive in list(self._derivers):
            try:
                derived = list(derive(stamped))
            except Exception as exc:  # like a broken subscriber: removed, and the rest are told
                self._derivers.remove(derive)
                failed.append(f"{getattr(derive, '__qualname__', derive)!s}: {type(exc).__name__}: {exc}")
                continue
            for ev in derived:
                self.emit(ev)
        # Never silent: the remaining consumers (the TUI, the run directory) are told.
        for what in failed:
            self.emit(
                Warning_(
                    code="event_consumer_failed",
                    message=f"an event consumer failed and receives no further events ({what})",
                )
            )
        return stamped

    @property
    def seq(self) -> int:
        return self._seq
