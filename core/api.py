"""The engine as a library: run one episode or a batch from Python, watch its typed events, cancel it.

Everything here is what ``opencode-tui run`` does, reached from code: the same configuration (a
config file and/or settings in its shape, plus the command line's options as keywords), the same
admission checks before anything starts, the same episodes, outcome, run directories and exit
codes. The command line is a client of this module (opencode_tui/run_command.py).

- ``run_episode(task, **options)`` / ``run_episode_sync``: one attempt of one task (as the TUI's run
  screen runs it); returns its ``EpisodeResult``.
- ``await start_episode(task, **options)``: the same, started, as a handle: ``async for event in
  run.events()``, ``await run.cancel()``, ``await run.result()``; ``async with run:`` closes it when
  the block is left early (cancelled, cleanup confirmed).
- ``run_batch(tasks, **options)`` / ``run_batch_sync`` / ``await start_batch``: many tasks with the batch's
  queue, retries, resume and ``results.jsonl`` (as ``run --batch``); returns a ``BatchSummary``.
- ``captured_tokens(result)``: the token ids and logprobs of a run's model calls, when it ran with
  ``model.capture_tokens`` (``settings={"model": {"capture_tokens": True}}``).

Bad input never starts anything: an unknown option or configuration field, a task that does not
exist, a model URL that is not served, a provider this host lacks: ``RunRefused``, whose message says
what was wrong and what to do. Cancelling the asyncio task that awaits an episode or a batch is a
cancel like any other: the agent is stopped, cleanup is confirmed, the record is written.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from opencode_tui_core import executor_registry
from opencode_tui_core.admission import AdmissionError, admit_run
from opencode_tui_core.artifacts import RunDirReader, RunInfo
from opencode_tui_core.batch import BatchControl, BatchSummary, Executor, ExecutorError, RunsDirError
from opencode_tui_core.batch import run_batch as _run_batch
from opencode_tui_core.calls.token_capture import CapturedTokens
from opencode_tui_core.config import (
    AgentConfig,
    ConfigError,
    deep_merge,
    format_validation_error,
    load_config,
)
from opencode_tui_core.control import CANCELLED_BY_CALLER
from opencode_tui_core.episode import Episode, EpisodeResult
from opencode_tui_core.events import Event
from opencode_tui_core.executor_registry import ExecutorHooks
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.tasks import Task, load_task

T = TypeVar("T")
R = TypeVar("R")

__all__ = [
    "BatchEvent",
    "BatchRun",
    "CapturedTokens",
    "EpisodeRun",
    "Prepared",
    "RunOptions",
    "RunRefused",
    "captured_tokens",
    "prepare",
    "run_batch",
    "run_batch_sync",
    "run_episode",
    "run_episode_sync",
    "start_batch",
    "start_episode",
]


class RunRefused(Exception):
    """Nothing was started: the request was wrong (an unknown field, a missing task, a bad setting)
    or this host cannot run it (no such provider, the runs directory cannot be made). ``exit_code`` is
    what ``opencode-tui run`` exits with for the same refusal (2 for bad input)."""

    def __init__(self, message: str, *, exit_code: int = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class RunOptions(BaseModel):
    """What a run may be given besides its tasks: the command line's options, by their names.

    ``config`` is a configuration file (YAML or TOML, as ``--config``) or an ``AgentConfig``;
    ``settings`` are nested values in the configuration's own shape (``{"budgets": {"run_s": 600}}``),
    applied on top of it; the named options below are applied last, as their flags are."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    config: Path | AgentConfig | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    provider: str | None = None
    model_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    runs_dir: Path | None = None
    keep_sandbox: bool = False
    # Batches only: how many attempts a task may take (the policy's retries), how many run at once,
    # and whether tasks already scored in the runs directory run again.
    attempts: int | None = Field(default=None, ge=1)
    jobs: int | None = Field(default=None, ge=1)
    force: bool = False
    breaks: list[str] = Field(default_factory=list)  # the debugger's (``--break``): ``call:N``, ...
    executor: str | None = None  # ``local`` (default) or a plug-in (``ray``)

    def overrides(self) -> dict[str, Any]:
        """The named options as configuration values (what their flags set)."""
        o: dict[str, Any] = {}
        if self.provider:
            o.setdefault("sandbox", {})["provider"] = self.provider
        if self.keep_sandbox:
            o.setdefault("sandbox", {})["keep_sandbox"] = True
        for key, value in (("url", self.model_url), ("name", self.model), ("api_key_env", self.api_key_env)):
            if value:
                o.setdefault("model", {})[key] = value
        if self.attempts is not None:
            o["policy"] = {"max_attempts": self.attempts}
        if self.runs_dir is not None:
            o["runs_dir"] = str(self.runs_dir)
        if self.breaks:
            o["debug"] = {"breaks": list(self.breaks)}
        if self.executor:
            o.setdefault("executor", {})["name"] = self.executor
        return o


def options_of(given: dict[str, Any]) -> RunOptions:
    """``RunOptions`` from keyword arguments; an unknown or bad one is refused by its name."""
    try:
        return RunOptions.model_validate(given)
    except ValidationError as exc:
        raise RunRefused(format_validation_error(exc, "run options")) from None


@dataclass(frozen=True)
class Prepared:
    """A run that passed admission: its configuration, its tasks, and what the caller should be told
    (which bundled sample a name resolved to, fields of a Harbor task this version does not know)."""

    config: AgentConfig
    tasks: list[Task]
    options: RunOptions
    notes: list[str] = field(default_factory=list)

    @property
    def runs_dir(self) -> Path:
        return Path(self.config.runs_dir)


TaskRef = str | Path | Task


def _config(options: RunOptions) -> AgentConfig:
    top = deep_merge(options.settings, options.overrides())
    if isinstance(options.config, AgentConfig):
        data = deep_merge(options.config.model_dump(mode="json", exclude_unset=True), top)
        try:
            return AgentConfig.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, "settings")) from exc
    return load_config(options.config, top)


def _task(ref: TaskRef, notes: list[str]) -> Task:
    if isinstance(ref, Task):
        return ref
    from opencode_tui_core.samples import resolve_task_ref

    found = resolve_task_ref(str(ref))
    if found.sample is not None:
        notes.append(f"{ref}: the bundled sample ({found.path})")
    elif found.shadowed is not None:
        notes.append(f"{ref}: the directory here, not the bundled sample of that name")
    elif not found.path.exists():
        raise ConfigError(
            f"task {ref} does not exist: no such directory or file here, and no bundled sample of that "
            "name (list them with `opencode-tui samples`)"
        )
    task = load_task(found.path)
    notes.extend(f"warning: {task.root}: {w}" for w in task.load_warnings)
    return task


def prepare(tasks: Sequence[TaskRef], options: RunOptions, *, batch: bool) -> Prepared:
    """Everything that can be checked before any sandbox exists (``run``'s admission); raises
    ``RunRefused``. ``batch``: the tasks run as a batch (retries allowed), not as one episode."""
    if not tasks:
        raise RunRefused("no task given: name a task directory or a bundled sample")
    notes: list[str] = []
    try:
        if options.breaks:
            from opencode_tui_core.breaks import parse_break

            try:
                for b in options.breaks:
                    parse_break(b)
            except ValueError as exc:
                raise AdmissionError(f"--break: {exc}") from None
        config = _config(options)
        loaded = [_task(t, notes) for t in tasks]
        admit_run(config, loaded, batch=batch, attempts=options.attempts, jobs=options.jobs)
    except (AdmissionError, ConfigError) as exc:
        raise RunRefused(str(exc)) from exc
    return Prepared(config=config, tasks=loaded, options=options, notes=notes)


def runs_dir_refusal(exc: OSError) -> RunRefused:
    """The runs directory could not be created or written: the hint that fits the cause; a path that
    is not a directory is bad input (2), anything else the machine's (3)."""
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        hint, code = "choose another --runs-dir", ExitCode.USAGE
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint, code = "free space or choose another --runs-dir", ExitCode.INFRA
    else:
        hint, code = "choose another --runs-dir", ExitCode.INFRA
    return RunRefused(f"{exc.strerror}; {hint}", exit_code=code)


# ---- what both handles share: a feed of items in order, and a wait that closes on cancel ---------


class _Feed(Generic[T]):
    """Items (events, results) in the order they came, each follower seeing all of them; items may
    come from any thread (they are handed to the loop the run belongs to)."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self._arrived = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    def put(self, item: T) -> None:
        loop = self.loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.items.append(item)
            self._arrived.set()
        else:
            loop.call_soon_threadsafe(self.put, item)

    async def follow(self, run: asyncio.Future[Any]) -> AsyncIterator[T]:
        """Every item, from the first, until ``run`` has ended and nothing more is on its way."""
        seen = 0
        while True:
            while seen < len(self.items):
                seen += 1
                yield self.items[seen - 1]
            if run.done():
                await asyncio.sleep(0)  # items handed over from threads just before the end
                if seen == len(self.items):
                    return
                continue
            self._arrived.clear()
            waiter = asyncio.ensure_future(self._arrived.wait())
            try:
                await asyncio.wait({waiter, run}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()


async def _awaited(run: asyncio.Future[R], cancel: Callable[[], Awaitable[object]]) -> R:
    """``run``'s value; when the caller awaiting it is cancelled, the run is cancelled like any other
    (the agent stopped, cleanup confirmed, the record written) before the cancellation goes on up. A
    further cancel while it closes hurries the close."""
    try:
        return await asyncio.shield(run)
    except asyncio.CancelledError:
        await cancel()
        while not run.done():
            try:
                await asyncio.shield(run)
            except asyncio.CancelledError:
                await cancel()  # a second request hurries
            except Exception:
                break
        raise


# ---- one episode --------------------------------------------------------------------------------


class _Handle(Generic[R]):
    """What both handles share: ``async with`` starts the run, and leaving the block before it ended
    (a break, an exception, a cancel) cancels it — a batch starts nothing more and closes what runs."""

    _task: asyncio.Task[R] | None

    def _started(self) -> asyncio.Task[R]:
        raise NotImplementedError

    async def cancel(self) -> R:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._started()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None and not self._task.done():
            await self.cancel()


class EpisodeRun(_Handle[EpisodeResult]):
    """One attempt of one task, as a handle: its events, its cancel, its result.

    Events are kept from the moment the episode starts, so an ``events()`` begun late still sees
    the whole stream from ``EpisodeStarted`` on. ``episode`` is the engine's control API (keep the
    sandbox, open a shell), as the TUI uses it."""

    def __init__(self, prepared: Prepared) -> None:
        [task] = prepared.tasks
        self.prepared = prepared
        self.episode = Episode(task, prepared.config, runs_dir=prepared.runs_dir)
        self._feed: _Feed[Event] = _Feed()
        self.episode.bus.subscribe(self._feed.put)
        self._task: asyncio.Task[EpisodeResult] | None = None

    @property
    def run_id(self) -> str:
        return self.episode.run_id

    @property
    def run_dir(self) -> Path:
        """Where the run is recorded (``opencode-tui open`` replays it)."""
        return self.prepared.runs_dir / self.episode.run_id

    def start(self) -> EpisodeRun:
        """Start the episode on the running loop (once); the handle."""
        self._started()
        return self

    def _started(self) -> asyncio.Task[EpisodeResult]:
        if self._task is None:
            self._feed.loop = asyncio.get_running_loop()
            self._task = asyncio.ensure_future(self._run())
        return self._task

    async def _run(self) -> EpisodeResult:
        try:
            self.prepared.runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise runs_dir_refusal(exc) from exc
        return await self.episode.run()

    def events(self) -> AsyncIterator[Event]:
        """Every event of the episode, in order, until it has ended (outcome decided, sandbox
        released or kept). Several iterators may run at once; each sees the whole stream."""
        return self._feed.follow(self._started())

    async def cancel(self) -> EpisodeResult:
        """Stop the agent, confirm cleanup, record; returns the result once the episode has ended. A
        second call hurries the close (an owned sandbox is destroyed)."""
        self._started()
        await self.episode.cancel(CANCELLED_BY_CALLER)
        return await self.result()

    async def result(self) -> EpisodeResult:
        """The episode's result once it has ended (starts it if need be). Cancelling the caller that
        awaits it cancels the episode, which closes with its cleanup confirmed first."""
        return await _awaited(self._started(), lambda: self.episode.cancel(CANCELLED_BY_CALLER))


async def start_episode(task: TaskRef, **options: Any) -> EpisodeRun:
    """One attempt of ``task``, started; its handle. Admission runs first, in a worker thread (the
    provider's checks block): ``RunRefused`` is raised before anything starts."""
    opts = options_of(options)
    prepared = await asyncio.to_thread(prepare, [task], opts, batch=False)
    return EpisodeRun(prepared).start()


async def run_episode(task: TaskRef, **options: Any) -> EpisodeResult:
    """Run one attempt of ``task`` to its end: cleanup confirmed, outcome decided, run recorded."""
    return await (await start_episode(task, **options)).result()


def run_episode_sync(task: TaskRef, **options: Any) -> EpisodeResult:
    """``run_episode`` for code without an event loop."""
    prepared = prepare([task], options_of(options), batch=False)  # refused here, before any loop starts
    return asyncio.run(EpisodeRun(prepared).result())


def captured_tokens(run: EpisodeResult | str | os.PathLike[str]) -> list[CapturedTokens]:
    """The token ids and logprobs of a finished run's model calls (its result, or its run directory),
    in the order the calls ended: one ``CapturedTokens`` per call that returned any, each attributed
    to the assistant message it answered (``message_id``). Empty when the run had no
    ``model.capture_tokens`` or its upstream sent no token data; run.json's ``token_capture`` tells
    the two apart. A path that is no run directory raises ``FileNotFoundError``."""
    path = Path(run.run_dir if isinstance(run, EpisodeResult) else run)
    return list(RunDirReader(path).captured_tokens())


# ---- a batch ------------------------------------------------------------------------------------


class BatchEvent(BaseModel):
    """An event of one attempt of a batch: which run it belongs to, and the event itself."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    task_id: str
    attempt: int
    event: Event


@dataclass
class BatchHooks:
    """What a front end hears while a batch runs, besides the events (each may be None)."""

    on_result: Callable[[EpisodeResult], None] | None = None  # each attempt's result, as it ends
    on_orphan: Callable[[RunInfo], None] | None = None  # a run an earlier, killed controller left
    on_warning: Callable[[str], None] | None = None  # what the user must know as the batch starts
    executor: ExecutorHooks | None = None  # started / phase / node, for a remote executor's rows


class BatchRun(_Handle[BatchSummary]):
    """A batch (queue, retries, resume, ``results.jsonl``), as a handle: ``events()`` (the local
    executor's episodes, each event with its run), ``results()`` (each attempt as it ends),
    ``cancel()``, ``summary()``. Cancelling starts no queued episode and closes the running ones
    with their cleanup confirmed."""

    def __init__(self, prepared: Prepared, hooks: BatchHooks | None = None) -> None:
        self.prepared = prepared
        self.hooks = hooks or BatchHooks()
        self.control = BatchControl()
        self._events: _Feed[BatchEvent] = _Feed()
        self._results: _Feed[EpisodeResult] = _Feed()
        self._task: asyncio.Task[BatchSummary] | None = None
        self.executor: Executor | None = None

    @property
    def batch_id(self) -> str:
        return self.control.batch_id

    def _attach(self, episode: Episode) -> None:
        def collect(event: Event) -> None:
            self._events.put(
                BatchEvent(
                    run_id=episode.run_id, task_id=episode.task.id, attempt=episode.attempt, event=event
                )
            )

        episode.bus.subscribe(collect)
        given = self.hooks.executor
        if given is not None and given.on_episode is not None:
            given.on_episode(episode)

    def _on_result(self, result: EpisodeResult) -> None:
        self._results.put(result)
        if self.hooks.on_result is not None:
            self.hooks.on_result(result)

    def make_executor(self) -> Executor:
        """The configured executor, ready (a remote one has joined its cluster); raises RunRefused.
        Made when the batch starts, or earlier by a caller that must have it first."""
        if self.executor is None:
            given = self.hooks.executor or ExecutorHooks()
            hooks = ExecutorHooks(
                on_episode=self._attach,
                on_started=given.on_started,
                on_phase=given.on_phase,
                on_node=given.on_node,
            )
            config = self.prepared.config
            try:
                self.executor = executor_registry.get(config.executor.name).executor(config, hooks)
            except ExecutorError as exc:
                raise RunRefused(str(exc)) from exc
        return self.executor

    def start(self) -> BatchRun:
        """Start the batch on the running loop (once); the handle."""
        self._started()
        return self

    def _started(self) -> asyncio.Task[BatchSummary]:
        if self._task is None:
            self._events.loop = self._results.loop = asyncio.get_running_loop()
            self._task = asyncio.ensure_future(self._run())
        return self._task

    async def _run(self) -> BatchSummary:
        p = self.prepared
        executor = self.make_executor()
        runs_dir, jobs = p.runs_dir, p.options.jobs
        if executor_registry.get(p.config.executor.name).remote:
            # Every node must see the same path; the cluster's queue bounds concurrency unless jobs does.
            runs_dir, jobs = runs_dir.resolve(), jobs or len(p.tasks)
        try:
            return await _run_batch(
                p.tasks,
                p.config,
                runs_dir=runs_dir,
                jobs=jobs or 1,
                max_attempts=p.options.attempts,
                on_result=self._on_result,
                control=self.control,
                on_orphan=self.hooks.on_orphan,
                executor=executor,
                force=p.options.force,
                on_warning=self.hooks.on_warning,
            )
        except RunsDirError as exc:
            raise runs_dir_refusal(exc) from exc
        except ExecutorError as exc:
            raise RunRefused(str(exc)) from exc
        finally:
            await executor.close()

    def events(self) -> AsyncIterator[BatchEvent]:
        """Every event of every in-process attempt, in the order they happened, until the batch ends
        (a remote executor's attempts run elsewhere: their results come, not their events)."""
        return self._events.follow(self._started())

    def results(self) -> AsyncIterator[EpisodeResult]:
        """Each attempt's result as it ends (a resumed task's at once), until the batch ends."""
        return self._results.follow(self._started())

    async def cancel(self, by: str = CANCELLED_BY_CALLER) -> BatchSummary:
        """Start nothing more and close every running episode (a second call hurries); returns the
        summary once the batch has ended."""
        self._started()
        await self.control.cancel(by)
        return await self.summary()

    async def summary(self) -> BatchSummary:
        """The batch's summary once it has ended (starts it if need be). Cancelling the caller that
        awaits it cancels the batch, which closes every running episode first."""
        return await _awaited(self._started(), lambda: self.control.cancel(CANCELLED_BY_CALLER))


async def start_batch(tasks: Sequence[TaskRef], **options: Any) -> BatchRun:
    """A batch of ``tasks``, started; its handle. Admission runs first, in a worker thread:
    ``RunRefused`` is raised before anything starts."""
    opts = options_of(options)
    prepared = await asyncio.to_thread(prepare, list(tasks), opts, batch=True)
    return BatchRun(prepared).start()


async def run_batch(tasks: Sequence[TaskRef], **options: Any) -> BatchSummary:
    """Run ``tasks`` as ``run --batch`` does; the summary holds every attempt's result."""
    return await (await start_batch(tasks, **options)).summary()


def run_batch_sync(tasks: Sequence[TaskRef], **options: Any) -> BatchSummary:
    """``run_batch`` for code without an event loop."""
    prepared = prepare(list(tasks), options_of(options), batch=True)
    return asyncio.run(BatchRun(prepared).summary())
