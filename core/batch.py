"""Many episodes with bounded concurrency; retries as fresh attempts; resume; JSON-lines results.

Every attempt keeps its own run directory. ``results.jsonl`` in the runs directory records each
finished episode (its last attempt); a re-run skips episodes already recorded as scored and runs
the others again with the next attempt number, leaving earlier attempts' artifacts in place.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core import provider_registry
from opencode_tui_core.admission import next_attempt_blocked
from opencode_tui_core.artifacts import OutcomeSummary, RunDir, RunInfo, list_runs
from opencode_tui_core.batch_record import BatchRecord, append_record
from opencode_tui_core.config import AgentConfig, warm_depth
from opencode_tui_core.episode import Episode, EpisodeResult
from opencode_tui_core.episode.common import stage_of
from opencode_tui_core.episode.pool import WarmCounts, WarmPool
from opencode_tui_core.events import EventBus, FailureRecorded
from opencode_tui_core.executor_registry import ExecutorHooks, ExecutorPlugin
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.failures import FailureStage, Outcome
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.invocation import invocation_id, pid_of
from opencode_tui_core.memory import Reclaimer
from opencode_tui_core.resume import RESULTS_FILE, Resumption, load_previous, results_line, resume_key
from opencode_tui_core.tasks import Task


def new_batch_id() -> str:
    """A batch's id: on every result line, in every run.json, on every sandbox's labels."""
    return "b" + uuid.uuid4().hex[:11]


class BatchControl:
    """Cancels a running batch: queued episodes are not started (and recorded as such), running ones
    close gracefully and concurrently, each within its close budget. A second cancel hurries them."""

    def __init__(self, batch_id: str | None = None) -> None:
        # The batch's id (``sweep --batch ID`` removes its leftovers; see opencode_tui_core.sandbox.base.LABEL_BATCH).
        self.batch_id = batch_id or new_batch_id()
        self.cancelled_by: str | None = None
        self.halted: str | None = None  # why no further episode starts (the runs directory failed)
        self.running: set[Episode] = set()  # the local executor's episodes
        # What else must hear a cancel (the Ray executor forwards it to its workers).
        self.cancellers: list[Callable[[str], Awaitable[object]]] = []
        # What else must hear a halt (the warm pool stops preparing sandboxes no attempt will use).
        self.on_halt: list[Callable[[], object]] = []

    def halt(self, reason: str) -> None:
        """Start nothing more; the running episodes finish (and close) as usual."""
        if self.halted is None:
            self.halted = reason
            for listener in self.on_halt:
                listener()

    async def cancel(self, by: str) -> None:
        if self.cancelled_by is None:
            self.cancelled_by = by
        episodes = list(self.running)
        await asyncio.gather(
            *(e.cancel(by) for e in episodes), *(c(by) for c in self.cancellers), return_exceptions=True
        )


class RunsDirError(OSError):
    """The runs directory cannot be written at all: nothing was started."""

    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(exc.errno, f"cannot write the runs directory {path}: {exc.strerror or exc}")
        self.path = path


class BatchSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total: int
    scored: int
    batch_id: str | None = None
    results: list[EpisodeResult] = Field(default_factory=list)
    failures_by_kind: dict[str, int] = Field(default_factory=dict)
    health_by_kind: dict[str, int] = Field(default_factory=dict)  # episode-health warnings, all episodes
    # Episodes that ran without a limit they asked for, by limit (``limits.enforce: warn``).
    unenforced_by_limit: dict[str, int] = Field(default_factory=dict)
    # Failures kept as warnings (the reward stood), by kind.
    warnings_by_kind: dict[str, int] = Field(default_factory=dict)
    cancelled: bool = False
    cancelled_by: str | None = None
    warm: WarmCounts | None = None  # the warm pool's counts (None: no pool ran)
    warm_not_used: str | None = None  # why the configured warm-ahead was not used (the executor's words)

    def line(self) -> str:
        """One line: how many were scored (those counted as zero, and why), how many failed and why,
        how many never ran, the health warnings. ``5 of 6 scored (1 as zero: provider_oom_killed x1);
        1 failed: model_server_error x1``."""

        def why(results: list[EpisodeResult]) -> str:
            counts = Counter(r.failure_kind or str(r.action) for r in results)
            return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))

        zeros = [r for r in self.results if r.action is Outcome.COUNT_AS_ZERO]
        failed = [r for r in self.results if not r.action.is_sample and r.started]
        # (``scored`` too: a summary may carry counts without its results)
        not_run = max(0, self.total - max(len(self.results), self.scored))
        not_run += sum(1 for r in self.results if not r.started)
        health = ", ".join(f"{k} x{n}" for k, n in sorted(self.health_by_kind.items()))
        unenforced = ", ".join(f"{k} x{n}" for k, n in sorted(self.unenforced_by_limit.items()))
        kept = ", ".join(f"{k} x{n}" for k, n in sorted(self.warnings_by_kind.items()))
        return (
            f"{self.scored} of {self.total} scored"
            + (f" ({len(zeros)} as zero: {why(zeros)})" if zeros else "")
            + (f"; {len(failed)} failed: {why(failed)}" if failed else "")
            + (
                f"; {not_run} not run" + (f" (cancelled by {self.cancelled_by})" if self.cancelled_by else "")
                if not_run > 0
                else ""
            )
            + (f"; warnings (reward kept): {kept}" if kept else "")
            + (f"; health warnings: {health}" if health else "")
            + (f"; limits not enforced: {unenforced}" if unenforced else "")
            + (f"; {self.warm.words()}" if self.warm is not None and self.warm.active else "")
            + (f"; warm-ahead not used: {self.warm_not_used}" if self.warm_not_used else "")
        )


def mark_orphans(runs_dir: Path) -> list[RunInfo]:
    """Run directories whose controller died mid-episode (run.json without an outcome, its process
    gone): each gets the outcome ``run_interrupted`` so nothing shows them as running forever. Their
    sandboxes (the owned ones) are left for ``opencode-tui sweep --run RUN_ID``."""
    marked: list[RunInfo] = []
    for path, info in list_runs(runs_dir):
        if info is None or not info.orphaned:
            continue
        info.outcome = OutcomeSummary(
            action=Outcome.KEEP_UNKNOWN,
            failure_kind="run_interrupted",
            failure_stage=stage_of(info.phase).value,
            failure_class="unknown",
            summary=f"interrupted during {info.phase}: its controller (pid {pid_of(info.controller)}) died "
            f"before the episode ended; cleanup unknown (opencode-tui sweep --run {info.run_id})",
        )
        info.counts["cleanup_confirmed"] = False
        try:
            RunDir(path).write_run_info(info)
        except OSError:
            continue  # an unwritable old run stays as it was; it is still reported below
        marked.append(info)
    return marked


# ---- the executor seam: where one attempt runs (this process, or a Ray cluster) ---------------
# Retries, resume, records and exit codes live here once, for every executor.


@dataclass
class Attempt:
    """One finished attempt as an executor reports it."""

    result: EpisodeResult
    # Why no further attempt may follow even if the policy asks for one (a borrowed sandbox whose
    # cleanup stays unconfirmed); None: the policy decides.
    blocked: str | None = None

    @classmethod
    async def of(
        cls, episode: Episode, result: EpisodeResult, config: AgentConfig, may_retry: bool, *, cancelled: bool
    ) -> Attempt:
        """The attempt ``episode`` ran, asked where it ran whether another may follow (admission)."""
        blocked = await next_attempt_blocked(
            episode.session,
            result.action,
            result.cleanup_confirmed,
            config,
            may_retry=may_retry,
            cancelled=cancelled,
        )
        return cls(result, blocked)


class Executor(abc.ABC):
    """Runs single attempts; ``run_batch`` and ``run_episode_with_retries`` own everything else."""

    name: str
    # Set by ``run_batch`` before ``start`` (the batch control's id); every attempt carries it.
    batch_id: str | None = None
    # Set by ``plan``: why the configured warm-ahead (``batch.warm``) is not used by this executor
    # (the summary line, the batch's record, a warning when the batch starts); None: nothing to say.
    warm_not_used: str | None = None

    @property
    def warm_depth(self) -> int:
        """How many sandboxes ``plan`` set out to keep prepared ahead (0: none)."""
        return 0

    async def start(self, runs_dir: Path, tasks: list[Task], config: AgentConfig) -> None:
        """Checks before any episode starts (the runs directory exists); raises ExecutorError."""
        return

    @abc.abstractmethod
    async def attempt(
        self,
        task: Task,
        config: AgentConfig,
        *,
        attempt: int,
        runs_dir: Path,
        may_retry: bool,
        control: BatchControl,
    ) -> Attempt:
        """Run attempt number ``attempt`` to its end (cleanup confirmed, record written).

        ``may_retry``: the retry bound leaves room for another attempt (only then is a borrowed
        sandbox's unconfirmed cleanup retried to let the next attempt in)."""

    async def cancel(self, by: str) -> None:
        """The batch was cancelled (``by``: a signal name); a second call hurries. The local
        executor's episodes hear it through ``BatchControl.running``."""
        return

    def plan(self, tasks: list[Task], config: AgentConfig, jobs: int) -> None:
        """The tasks the batch will start, in order (after resume): what to prepare ahead."""
        return

    def stop_preparing(self) -> None:
        """The batch starts nothing more (halted): prepare nothing more ahead."""
        return

    async def release_prepared(self) -> WarmCounts | None:
        """Every way a batch ends: release what was prepared ahead and not used (confirmed)."""
        return None

    async def close(self) -> None:
        """After the batch: release what ``start`` acquired."""
        return


class ExecutorError(Exception):
    """The executor cannot run this batch (its cluster is unreachable, storage is not shared):
    one line for the user, exit 2, no episode started."""


def may_prepare_ahead(config: AgentConfig) -> bool:
    """Sandboxes of this configuration can be prepared ahead: owned ones, of a provider that declares
    the ``warm`` capability (OpenSandbox: not yet)."""
    return config.sandbox.mode == "owned" and provider_registry.get(config.sandbox.provider).capabilities.warm


class LocalExecutor(Executor):
    """Episodes in this process (the default; needs nothing beyond the package)."""

    name = "local"

    def __init__(self, on_episode: Callable[[Episode], None] | None = None) -> None:
        self.on_episode = on_episode
        self.pool: WarmPool | None = None  # batch.warm: sandboxes prepared ahead (core/episode/pool.py)

    @property
    def warm_depth(self) -> int:
        return self.pool.depth if self.pool is not None else 0

    def plan(self, tasks: list[Task], config: AgentConfig, jobs: int) -> None:
        depth = warm_depth(config.batch, jobs, os.cpu_count())
        if depth <= 0 or not may_prepare_ahead(config) or len(tasks) <= max(1, jobs):
            return  # off, not this provider or mode, or every task starts at once: nothing ahead
        self.pool = WarmPool(config, depth=depth, batch_id=self.batch_id)
        self.pool.plan(tasks, starting=max(1, jobs))

    async def cancel(self, by: str) -> None:
        self.stop_preparing()

    def stop_preparing(self) -> None:
        if self.pool is not None:
            self.pool.stop()

    async def release_prepared(self) -> WarmCounts | None:
        if self.pool is None:
            return None
        pool, self.pool = self.pool, None
        return await pool.close()

    async def attempt(
        self,
        task: Task,
        config: AgentConfig,
        *,
        attempt: int,
        runs_dir: Path,
        may_retry: bool,
        control: BatchControl,
    ) -> Attempt:
        episode = Episode(
            task,
            config,
            attempt=attempt,
            runs_dir=runs_dir,
            bus=EventBus(attempt=attempt),
            batch_id=control.batch_id,
            pool=self.pool,
        )
        # The runs directory stopped taking writes: no further episode starts from this moment (the
        # running ones, this one included, finish and close as usual).
        episode.bus.subscribe(
            lambda event: (
                control.halt(event.failure.message)
                if isinstance(event, FailureRecorded) and event.failure.kind == "artifacts_write_failed"
                else None
            )
        )
        if self.on_episode is not None:
            self.on_episode(episode)
        control.running.add(episode)
        try:
            result = await episode.run()
        finally:
            control.running.discard(episode)
        return await Attempt.of(
            episode, result, config, may_retry, cancelled=control.cancelled_by is not None
        )


async def run_episode_with_retries(
    task: Task,
    config: AgentConfig,
    *,
    runs_dir: Path,
    max_attempts: int,
    first_attempt: int = 1,
    on_episode: Callable[[Episode], None] | None = None,
    control: BatchControl | None = None,
    executor: Executor | None = None,
) -> EpisodeResult:
    """Attempts until the policy stops asking for ``retry`` (bounded by ``max_attempts``)."""
    control = control or BatchControl()
    executor = executor or LocalExecutor(on_episode)
    previous: list[str] = []
    attempt = first_attempt
    while True:
        may_retry = attempt - first_attempt + 1 < max_attempts
        done = await executor.attempt(
            task, config, attempt=attempt, runs_dir=runs_dir, may_retry=may_retry, control=control
        )
        result = done.result
        result.previous_attempts = list(previous)
        if (
            result.action is not Outcome.RETRY
            or not may_retry
            or control.cancelled_by is not None
            or control.halted is not None
        ):
            return result
        if done.blocked is not None:
            result.summary += f"; {done.blocked}"
            return result
        previous.append(result.run_dir)
        attempt += 1


async def run_batch(
    tasks: list[Task],
    config: AgentConfig,
    *,
    runs_dir: Path,
    jobs: int = 1,
    max_attempts: int | None = None,
    on_result: Callable[[EpisodeResult], None] | None = None,
    on_episode: Callable[[Episode], None] | None = None,
    control: BatchControl | None = None,
    on_orphan: Callable[[RunInfo], None] | None = None,
    force: bool = False,
    executor: Executor | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> BatchSummary:
    """Runs the tasks; a task already scored with the same content and configuration in ``runs_dir``
    is not run again (its result comes back with ``resumed=True``) unless ``force``. ``on_warning``
    hears what the user must know as the batch starts (the executor cannot use the warm pool).

    The batch's record (``batches.jsonl``, core/batch_record.py) gets a line when its episodes are
    about to start and one when it has ended (the warm pool's counts)."""
    control = control or BatchControl()
    executor = executor or LocalExecutor(on_episode)
    try:
        runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # noqa: ASYNC240 (once, before any episode)
    except OSError as exc:
        raise RunsDirError(runs_dir, exc) from exc
    executor.batch_id = control.batch_id
    await executor.start(runs_dir, tasks, config)  # ExecutorError: nothing started, nothing recorded
    if executor.cancel not in control.cancellers:
        control.cancellers.append(executor.cancel)
    try:
        results_file = (runs_dir / RESULTS_FILE).open("a", encoding="utf-8")
    except OSError as exc:
        raise RunsDirError(runs_dir, exc) from exc
    for info in mark_orphans(runs_dir):
        if on_orphan is not None:
            on_orphan(info)
    previous = {} if force else load_previous(runs_dir)
    keys = {id(t): resume_key(t, config) for t in tasks}
    attempts = max_attempts or config.policy.max_attempts or 3
    sem = asyncio.Semaphore(max(1, jobs))
    results: list[EpisodeResult] = []

    reclaimer = Reclaimer()

    def record(task: Task, result: EpisodeResult) -> None:
        results.append(result)
        if result.artifacts_error is not None:
            control.halt(result.artifacts_error)
        if not result.resumed:
            try:
                results_file.write(results_line(keys[id(task)], result))
                results_file.flush()
            except OSError as exc:
                control.halt(f"cannot write {runs_dir / RESULTS_FILE}: {exc.strerror or exc}")
        if on_result is not None:
            on_result(result)
        if not result.resumed:  # (after its line is written: a reclaim takes tens of milliseconds)
            reclaimer.episode_ended()

    async def one(task: Task) -> None:
        resumption = Resumption(previous.get(keys[id(task)]))
        if resumption.skip:
            record(task, resumption.skipped())
            return
        first = resumption.first_attempt
        async with sem:
            if control.cancelled_by is not None:
                record(
                    task,
                    not_started(
                        task, config, first, cancelled_by=control.cancelled_by, batch_id=control.batch_id
                    ),
                )
                return
            if control.halted is not None:
                record(
                    task, not_started(task, config, first, halted=control.halted, batch_id=control.batch_id)
                )
                return
            result = await run_episode_with_retries(
                task,
                config,
                runs_dir=runs_dir,
                max_attempts=attempts,
                first_attempt=first,
                control=control,
                executor=executor,
            )
        if resumption.prior is not None:
            result.previous_attempts = [*resumption.earlier_attempts(), *result.previous_attempts]
        record(task, result)

    executor.plan([t for t in tasks if not Resumption(previous.get(keys[id(t)])).skip], config, jobs)
    if executor.stop_preparing not in control.on_halt:
        control.on_halt.append(executor.stop_preparing)
    if executor.warm_not_used is not None and on_warning is not None:
        on_warning(f"warm-ahead not used: {executor.warm_not_used}")
    record_line = BatchRecord(
        batch_id=control.batch_id,
        executor=executor.name,
        provider=config.sandbox.provider,
        started_at=utcnow(),
        controller=invocation_id(),
        total=len(tasks),
        warm_depth=executor.warm_depth,
        warm_not_used=executor.warm_not_used,
    )
    with contextlib.suppress(OSError):  # the record is for `doctor`: a batch runs without it
        append_record(runs_dir, record_line)
    cancelled = False
    warm: WarmCounts | None = None
    try:
        await asyncio.gather(*(one(t) for t in tasks))
    except asyncio.CancelledError:
        cancelled = True
    finally:
        with contextlib.suppress(OSError):
            results_file.close()
        # The warm pool's unused sandboxes, on every way out (a cancel of this task included: the
        # release is shielded and bounded by the pool's own deadlines).
        releasing = asyncio.ensure_future(executor.release_prepared())
        while True:
            try:
                warm = await asyncio.shield(releasing)
                break
            except asyncio.CancelledError:
                cancelled = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                if releasing.done():
                    warm = releasing.result()
                    break
    scored = sum(1 for r in results if r.action.is_sample)
    cancelled_by = control.cancelled_by
    with contextlib.suppress(OSError):
        append_record(
            runs_dir,
            record_line.model_copy(
                update={"ended_at": utcnow(), "scored": scored, "cancelled_by": cancelled_by, "warm": warm}
            ),
        )
    failures = Counter(r.failure_kind for r in results if r.failure_kind)
    health: Counter[str] = Counter()
    unenforced: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    for r in results:
        health.update(r.health)
        unenforced.update(r.unenforced_limits)
        kept.update(r.warnings)
    return BatchSummary(
        total=len(tasks),
        batch_id=control.batch_id,
        scored=scored,
        results=results,
        failures_by_kind=dict(failures),
        health_by_kind=dict(health),
        unenforced_by_limit=dict(unenforced),
        warnings_by_kind=dict(kept),
        cancelled=cancelled or cancelled_by is not None,
        cancelled_by=cancelled_by,
        warm=warm,
        warm_not_used=executor.warm_not_used,
    )


def not_started(
    task: Task,
    config: AgentConfig,
    attempt: int,
    *,
    cancelled_by: str | None = None,
    halted: str | None = None,
    batch_id: str | None = None,
) -> EpisodeResult:
    """The record of a queued episode the batch never started (a resume runs it): the batch was
    cancelled, or halted because its runs directory stopped taking writes."""
    if cancelled_by is not None:
        action, kind, code = Outcome.STOP, "run_cancelled", ExitCode.for_cancel(cancelled_by)
        summary = f"not started: the batch was cancelled by {cancelled_by}"
    else:
        action, kind, code = Outcome.MARK_EVALUATION_ERROR, "artifacts_write_failed", ExitCode.INFRA
        summary = f"not started: {halted}"
    return EpisodeResult(
        run_id="",
        task_id=task.id,
        attempt=attempt,
        batch_id=batch_id,
        provider=config.sandbox.provider,
        action=action,
        failure_kind=kind,
        failure_stage=FailureStage.ADMISSION.value,
        cancelled_by=cancelled_by,
        exit_code=code,
        run_dir="",
        started=False,
        summary=summary,
    )


class _LocalExecutorPlugin(ExecutorPlugin):
    name = "local"
    summary = "the episodes run in this process (the default)"

    def executor(self, config: AgentConfig, hooks: ExecutorHooks) -> Executor:
        return LocalExecutor(hooks.on_episode)


LOCAL = _LocalExecutorPlugin()  # the entry point (pyproject.toml: opencode_tui.executors)
