"""What every phase of an episode shares: how it speaks (events), records a failure, and stamps it.

A phase is a function that takes what it needs and returns a typed result. It says what it sees
through ``PhaseIO.emit`` and records failures through ``PhaseIO.record`` at the moment they happen:
the order of recorded failures decides the outcome (``opencode_tui_core.outcome.primary_failure``), and a failure
recorded by someone else meanwhile (a shell a person opened, a full disk) must keep its place.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from opencode_tui_core.artifacts import RunDir
from opencode_tui_core.events import CleanupObserved, CleanupStep, Event, Phase, StepState
from opencode_tui_core.failures import Evidence, FailureEvent, FailureStage
from opencode_tui_core.sandbox.errors import failure_of


class StageFailure(Exception):
    """A step failed in a way that ends the agent part of the episode; carries the FailureEvent."""

    def __init__(self, failure: FailureEvent) -> None:
        super().__init__(failure.message)
        self.failure = failure


# errno values that mean "the run directory's disk does not take writes", not a bug of ours.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO, errno.EACCES, errno.EPERM})

# The failure kind of an unexpected exception, by the phase it escaped from.
UNEXPECTED_KIND = {
    Phase.SEED: "sandbox_allocation_failed",
    Phase.INSTALL: "install_failed",
    Phase.AGENT: "agent_bootstrap_failed",
}


def stage_of(phase: Phase | str) -> FailureStage:
    """The failure stage of an episode phase: each phase is its own stage; ``done`` (or a phase this
    version does not know, read from an old run.json) counts as release."""
    try:
        return FailureStage(phase)
    except ValueError:
        return FailureStage.RELEASE


def failure_from(exc: BaseException, kind: str, stage: FailureStage, operation: str) -> FailureEvent:
    """The exception's typed failure (a provider's), stamped with the stage the episode was in.

    A provider knows what failed, not what the episode was doing: an OOM or a lost sandbox during
    verification is a grading failure, not the agent's.
    """
    failure = failure_of(exc, kind=kind, stage=stage, operation=operation)
    return failure if failure.stage is stage else failure.model_copy(update={"stage": stage})


def evidence_key(evidence: Evidence) -> tuple[str, str]:
    """What makes two evidence pieces the same observation (a risen counter is a new one)."""
    return evidence.source, json.dumps(evidence.data, sort_keys=True, default=str)


@dataclass
class PhaseIO:
    """A phase's voice: events to the bus, failures to the episode's record (decided there)."""

    emit: Callable[[Event], object]
    record: Callable[[FailureEvent], object]
    run_dir: RunDir
    # What this phase recorded, in order (a phase's result reports it).
    recorded: list[FailureEvent] = field(default_factory=list)

    def fail(self, failure: FailureEvent) -> None:
        self.recorded.append(failure)
        self.record(failure)

    def disk_full(self, exc: BaseException) -> bool:
        """An error writing the run directory itself (disk full, read-only) is said as what it is."""
        if not (isinstance(exc, OSError) and exc.errno in DISK_ERRNOS):
            return False
        self.run_dir.write_failed(exc.filename or self.run_dir.path, exc)
        return True

    def step_failed(
        self, step: CleanupStep, exc: BaseException, kind: str, stage: FailureStage, operation: str
    ) -> None:
        """A cleanup-side step failed: show it in the cleanup panel and record it as a failure."""
        self.emit(CleanupObserved(step=step, state=StepState.FAILED, reason=str(exc)))
        if not self.disk_full(exc):
            self.fail(failure_from(exc, kind, stage, operation))
