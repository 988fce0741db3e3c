"""The batch screen's model: one row per attempt, folded from the batch engine's episodes' events and
its results (no Textual here: the screen draws it, the tests read it).

Rows are made by the batch engine's hooks: a queued row per task at the start; ``attach`` when the
engine creates an attempt's episode (the task's queued row becomes attempt 1, a retry adds a row after
the task's last one); ``count`` with each of that episode's events; ``finished`` with the task's result
(a resumed task's row says "resumed", a queued one the cancel never started says "not started").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opencode_tui_core.episode import EpisodeResult
from opencode_tui_core.events import (
    CleanupObserved,
    CleanupStep,
    EpisodeStarted,
    Event,
    HealthWarning,
    OutcomeDecided,
    PhaseChanged,
    StepState,
)
from opencode_tui_core.failure_groups import FailureGroup, group_failures
from opencode_tui_core.failures import Outcome
from opencode_tui_core.tally import Tally


@dataclass
class AttemptRow:
    """One attempt (or a task still queued: ``run_id`` empty)."""

    task_id: str
    attempt: int
    attempts: int  # the bound (k of n)
    provider: str = ""
    run_id: str = ""
    phase: str = "queued"
    started_at: float | None = None  # the board's clock
    ended_at: float | None = None
    budget_s: float | None = None
    tally: Tally = field(default_factory=Tally)
    health: int = 0
    outcome: str = ""
    reward: float | None = None
    failure_kind: str | None = None
    failure_class: str | None = None
    cleanup: str = ""  # "", pending, confirmed, unconfirmed
    human_intervened: bool = False
    node: str = ""  # the node it runs on (a remote executor's: its address), "" here
    node_id: str = ""
    result: EpisodeResult | None = None
    run_dir: str = ""
    version: int = 0  # the board's change count when this row last changed (for a caller that diffs)

    @property
    def running(self) -> bool:
        return self.started_at is not None and self.ended_at is None and self.result is None

    @property
    def queued(self) -> bool:
        return self.phase == "queued"

    def elapsed(self, now: float) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at if self.ended_at is not None else now) - self.started_at


def _cleanup_word(result: EpisodeResult) -> str:
    if not result.started or result.resumed:
        return ""
    return "confirmed" if result.cleanup_confirmed else "unconfirmed"


class BatchBoard:
    """Every attempt of one batch, and its totals."""

    def __init__(
        self,
        task_ids: list[str],
        attempts: int,
        *,
        batch_id: str = "",
        clock: Callable[[], float] = time.monotonic,
        remote: bool = False,
    ) -> None:
        self.batch_id = batch_id
        # The attempts run on other machines (Ray): rows show their node; their phases come from the
        # executor (``phase``), their counts with their results.
        self.remote = remote
        self.attempts = attempts
        self.clock = clock
        self.started_at = clock()
        self.rows: list[AttemptRow] = [AttemptRow(t, 1, attempts) for t in task_ids]
        self.results: list[EpisodeResult] = []
        self.version = 0
        self.ended = False

    # -- from the engine -----------------------------------------------------------------------

    def _queued_row(self, task_id: str) -> int | None:
        for i, row in enumerate(self.rows):
            if row.task_id == task_id and row.queued and not row.run_id:
                return i
        return None

    def start(self, task_id: str, attempt: int, run_id: str, provider: str = "") -> AttemptRow:
        """An attempt has started: the task's queued row (the same row: the screen keeps its place), or
        a new row after the task's last one (a retry)."""
        i = self._queued_row(task_id)
        if i is not None:
            row = self.rows[i]
            row.attempt, row.run_id, row.provider, row.phase = attempt, run_id, provider, "admission"
        else:
            row = AttemptRow(
                task_id, attempt, self.attempts, provider=provider, run_id=run_id, phase="admission"
            )
            after = [j for j, r in enumerate(self.rows) if r.task_id == task_id]
            self.rows.insert(after[-1] + 1 if after else len(self.rows), row)
        row.started_at = self.clock()
        # A retry starts after the attempt before it ended (the engine reports only a task's last result).
        for other in self.rows:
            if other.task_id == task_id and other is not row and other.running:
                other.ended_at, other.phase = row.started_at, "retried"
                self._touch(other)
        self._touch(row)
        return row

    def _by_run(self, run_id: str) -> AttemptRow | None:
        for row in self.rows:
            if row.run_id == run_id:
                return row
        return None

    def phase(self, run_id: str, phase: str) -> None:
        """A remote attempt's phase, as its worker reports it (its events stay on its node)."""
        row = self._by_run(run_id)
        if row is not None and row.result is None and row.phase != "retried":
            row.phase = phase
            self._touch(row)

    def placed(self, run_id: str, node_id: str, address: str) -> None:
        """A remote attempt started on a node."""
        row = self._by_run(run_id)
        if row is not None:
            row.node_id, row.node = node_id, address or node_id[:12]
            self._touch(row)

    def count(self, row: AttemptRow, event: Event) -> None:
        """One of the attempt's events."""
        row.tally.count(event)
        if isinstance(event, PhaseChanged):
            if event.state is StepState.RUNNING:
                row.phase = event.phase.value
        elif isinstance(event, EpisodeStarted):
            row.budget_s = event.run_budget_s
            row.provider = event.provider
        elif isinstance(event, HealthWarning):
            row.health += 1
        elif isinstance(event, OutcomeDecided):
            row.outcome = str(event.action)
            row.reward = event.reward
            row.failure_kind = event.failure_kind
            row.failure_class = str(event.failure_class) if event.failure_class else None
            if not row.cleanup:
                row.cleanup = "pending"
        elif isinstance(event, CleanupObserved):
            if event.step is CleanupStep.SANDBOX_RELEASED and event.state is StepState.OK:
                row.cleanup = "confirmed"
            elif event.state is StepState.FAILED:
                row.cleanup = "unconfirmed"
            elif not row.cleanup:
                row.cleanup = "pending"
        self._touch(row)

    def finished(self, result: EpisodeResult) -> None:
        """A task's result (its last attempt): that row, and its earlier attempts' rows, end."""
        self.results.append(result)
        row = self._row_of(result)
        row.result = result
        row.ended_at = self.clock() if row.started_at is not None else None
        row.attempt = result.attempt
        row.provider = result.provider or row.provider
        row.run_id = result.run_id or row.run_id
        row.run_dir = result.run_dir
        row.outcome = "resumed" if result.resumed else str(result.action) if result.started else "not started"
        row.phase = "resumed" if result.resumed else "done" if result.started else "not started"
        row.reward = result.reward
        row.failure_kind = result.failure_kind
        row.failure_class = result.failure_class
        row.cleanup = _cleanup_word(result)
        row.human_intervened = result.human_intervened
        if result.started and not result.resumed:
            row.tally = Tally()  # the result's counts are the record's (the transcript's, after cleanup)
            row.health = sum(result.health.values())
        # The earlier attempts (retries) ended before this one started.
        for other in self.rows:
            if other.task_id == result.task_id and other is not row and other.result is None:
                if other.ended_at is None and other.started_at is not None:
                    other.ended_at = row.started_at or self.clock()
                other.phase = "retried"
                self._touch(other)
        self._touch(row)

    def _row_of(self, result: EpisodeResult) -> AttemptRow:
        for row in self.rows:
            if result.run_id and row.run_id == result.run_id:
                return row
        i = self._queued_row(result.task_id)
        if i is not None:
            return self.rows[i]
        row = AttemptRow(result.task_id, result.attempt, self.attempts)
        self.rows.append(row)
        return row

    def _touch(self, row: AttemptRow) -> None:
        self.version += 1
        row.version = self.version

    # -- read ----------------------------------------------------------------------------------

    def row_counts(self, row: AttemptRow) -> tuple[int, int | None, int]:
        """Model calls, tokens (in + out; None unknown) and compactions: the result's once it is in."""
        r = row.result
        if r is not None and r.started and not r.resumed:
            tokens = (
                None
                if r.tokens_in is None and r.tokens_out is None
                else (r.tokens_in or 0) + (r.tokens_out or 0)
            )
            return r.model_calls, tokens, r.compactions
        totals = row.tally.tokens
        tin, tout = totals.tokens_in, totals.tokens_out
        tokens = None if tin is None and tout is None else (tin or 0) + (tout or 0)
        return len(row.tally.model_calls), tokens, row.tally.compactions

    def totals(self) -> dict[str, int]:
        scored = zero = failed_model = failed_infra = running = queued = resumed = 0
        for row in self.rows:
            r = row.result
            if r is not None:
                if r.resumed:
                    resumed += 1
                if r.action.is_sample:
                    scored += 1
                    zero += r.action is Outcome.COUNT_AS_ZERO
                elif r.failure_class == "model":
                    failed_model += 1
                else:
                    failed_infra += 1
            elif row.running and row.phase not in ("retried", "submitted"):
                running += 1
            elif row.queued or row.phase == "submitted":  # (handed to a cluster, no worker has it yet)
                queued += 1
        return {
            "scored": scored,
            "zero": zero,  # scored as zero (an oom, a timeout: the model's failure)
            "failed_model": failed_model,
            "failed_infra": failed_infra,
            "running": running,
            "queued": queued,
            "resumed": resumed,
            "done": len(self.results),
            "tasks": len({row.task_id for row in self.rows}),
        }

    def rate_per_min(self) -> float | None:
        """Episodes finished per minute since the batch started (resumed ones do not count)."""
        ran = sum(1 for r in self.results if not r.resumed)
        minutes = (self.clock() - self.started_at) / 60
        return ran / minutes if ran and minutes > 0 else None

    def eta_s(self) -> float | None:
        t = self.totals()
        left = t["tasks"] - t["done"]
        rate = self.rate_per_min()
        if left <= 0:
            return 0.0
        return None if rate is None else left / rate * 60

    def groups(self) -> list[FailureGroup]:
        return group_failures(self.results)
