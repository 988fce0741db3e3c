"""Episodes on a Ray cluster: one Ray task per episode attempt (``executor.name: ray``).

The driver (``opencode-tui run --batch --executor ray``) keeps everything a batch decides: retries,
resume, ``results.jsonl``, the JSON lines and the exit code are core/batch.py's, shared with the local
executor. A worker runs the same ``Episode`` with its node's provider and writes the run directory
into the runs directory, which every node must see at the same path (shared storage): the driver
writes a probe file there and the first worker must read it back, or the batch does not start.

What only a cluster adds:

- A worker process or its node dies mid-episode (killed, OOM-killed by the node, node lost): Ray says
  so, the attempt becomes ``executor_worker_lost`` at the phase its run.json names, that node's
  sandboxes of the attempt are swept (a task pinned to the node removes what carries the batch's id
  and the attempt's run id and whose creating process is gone), and the policy retries it like any
  infrastructure failure. A node that cannot be swept now (it is gone) is swept when it comes back
  (same address): by the next episode task that lands on it, else by the driver's last pass over
  every live node at the end of the batch. Ray's own task retries are off: one attempt is one Ray
  task, and only the policy decides another.
- No warm pool (``batch.warm``): see ``WARM_NOT_USED``; a batch that asks for one says it is ignored.
- Cancelling (Ctrl-C, SIGTERM on the driver): a small coordinator actor tells every running worker,
  which cancels its episode exactly like the local executor does (graceful close, confirmed cleanup,
  the record written); queued tasks are cancelled in Ray and recorded as not started. A worker asks
  the coordinator before it starts an episode, so a task that was already dequeued starts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencode_tui_core import __version__
from opencode_tui_core.admission import admission_images, provider_refusals
from opencode_tui_core.artifacts import OutcomeSummary, RunDir, RunDirReader
from opencode_tui_core.batch import (
    Attempt,
    BatchControl,
    Executor,
    ExecutorError,
    may_prepare_ahead,
    new_batch_id,
    not_started,
)
from opencode_tui_core.config import AgentConfig, RaySettings
from opencode_tui_core.control import CANCELLED_BY_CALLER
from opencode_tui_core.episode import Episode, EpisodeResult, new_run_id
from opencode_tui_core.episode.common import stage_of
from opencode_tui_core.events import CleanupProof, EventBus, PhaseChanged
from opencode_tui_core.executor_registry import ExecutorHooks, ExecutorPlugin
from opencode_tui_core.failures import (
    DEFAULT_CLASSIFICATION,
    DEFAULT_POLICY,
    FailureEvent,
    decide,
    merged,
    merged_classification,
)
from opencode_tui_core.outcome import EpisodeFacts, RecordedFailure, decide_outcome
from opencode_tui_core.ray_coordinator import Begin, Coordinator
from opencode_tui_core.tasks import Task

log = logging.getLogger(__name__)

PROBE_PREFIX = ".ray-probe-"  # the shared-storage probe in the runs directory (removed at the end)
# Passed to every worker when set on the driver: the owner label of the batch's sandboxes (so the
# driver's `sweep` and a CI job's leak check find them) and where the OpenCode cache lives.
PASSED_ENV = ("OPENCODE_TUI_OWNER",)
PROBE_DEADLINE_S = 600.0  # the first worker may wait for a free CPU on a busy cluster
CONTROL_DEADLINE_S = 30.0  # one call to the coordinator actor
SWEEP_DEADLINE_S = 180.0  # the sweep task on a lost worker's node (listing + removing its sandboxes)
# Why a batch on Ray prepares no sandbox ahead (the batch summary, its record, a warning at its start):
# a prepared sandbox must be held by a process that outlives the attempts before the one it serves and
# releases it, confirmed, on every way out; a Ray task's worker process holds nothing between tasks.
WARM_NOT_USED = (
    "is ignored by the ray executor: each attempt runs as a Ray task of its own, and no process on a "
    "node outlives its task to hold a prepared sandbox and confirm its release, so every attempt "
    "creates its own sandbox (the local executor prepares ahead; batch.warm: 0 silences this)"
)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ExecutorError(
            "--executor ray needs Ray: pip install 'opencode-tui[ray]' (or pip install 'ray[default]')"
        ) from exc
    return ray


async def _get(ref: Any, timeout: float | None = None) -> Any:
    """Await a Ray ObjectRef from any event loop (the driver's or a worker's ``asyncio.run``)."""
    fut = asyncio.wrap_future(ref.future())
    return await (asyncio.wait_for(fut, timeout) if timeout is not None else fut)


def node_address(ray: Any, node_id: str) -> str:
    """The address a node registered with the cluster (``ray start --node-ip-address``), also for a
    node that has died; the same key ``ray.nodes()`` reports, so a node that comes back matches."""
    with contextlib.suppress(Exception):
        for node in ray.nodes():
            if node.get("NodeID") == node_id:
                return str(node.get("NodeManagerAddress") or node_id[:12])
    return node_id[:12]


# ---- the worker side ------------------------------------------------------------------------------


@dataclass
class WorkerReport:
    """What a worker sends back for one attempt."""

    result: EpisodeResult | None = None
    blocked: str | None = None
    cancelled_by: str | None = None  # the batch was cancelled before this attempt started
    unusable: str | None = None  # this node cannot run it (the runs directory is not shared)


@dataclass
class ProbeReport:
    node_ip: str
    storage: list[str] = field(default_factory=list)  # the runs directory is not shared
    problems: list[str] = field(default_factory=list)  # anything else (version, tasks, provider)


def probe_problems(
    runs_dir: str, probe: str, token: str, task_roots: list[str], version: str
) -> tuple[list[str], list[str]]:
    """What keeps this node from running the batch: (the probe file unseen, the rest: a task
    directory missing, another engine version)."""
    storage, problems = [], []
    path = Path(runs_dir) / probe
    try:
        seen = path.read_text().strip()
    except OSError as exc:
        seen = None
        storage.append(f"cannot read the probe file {path} ({exc.strerror or exc})")
    if seen is not None and seen != token:
        storage.append(f"the probe file {path} holds another batch's token")
    missing = sorted({r for r in task_roots if not Path(r).is_dir()})
    if missing:
        problems.append(f"task directories not found: {', '.join(missing[:3])}")
    if version != __version__:
        problems.append(f"opencode-tui {__version__} is installed here, the driver runs {version}")
    return storage, problems


def _probe_task(
    runs_dir: str,
    probe: str,
    token: str,
    task_roots: list[str],
    version: str,
    config: AgentConfig,
    images: list[str],
) -> ProbeReport:
    import ray

    storage, problems = probe_problems(runs_dir, probe, token, task_roots, version)
    if not storage and not problems and config.sandbox.mode == "owned":
        # The provider's own admission checks (its engine is up, the images exist), here on a node:
        # the driver's machine may have no Docker at all.
        problems += provider_refusals(config, images)
    node_id = ray.get_runtime_context().get_node_id()
    return ProbeReport(node_ip=node_address(ray, node_id), storage=storage, problems=problems)


def _episode_task(
    task: Task,
    config: AgentConfig,
    attempt: int,
    run_id: str,
    runs_dir: str,
    may_retry: bool,
    coordinator: Any,
    probe: tuple[str, str],
    batch_id: str,
    report_phases: bool = False,
) -> WorkerReport:
    return asyncio.run(
        _episode_in_worker(
            task,
            config,
            attempt,
            run_id,
            Path(runs_dir),
            may_retry,
            coordinator,
            probe,
            batch_id,
            report_phases,
        )
    )


async def _episode_in_worker(
    task: Task,
    config: AgentConfig,
    attempt: int,
    run_id: str,
    runs_dir: Path,
    may_retry: bool,
    coordinator: Any,
    probe: tuple[str, str],
    batch_id: str,
    report_phases: bool = False,
) -> WorkerReport:
    import ray

    from opencode_tui_core.invocation import invocation_id

    node_id = ray.get_runtime_context().get_node_id()
    # Every node checks, not only the first: a node that joined without the shared mount must not
    # write run directories nobody else sees.
    storage, problems = probe_problems(str(runs_dir), probe[0], probe[1], [str(task.root)], __version__)
    if storage or problems:
        node = node_address(ray, node_id)
        return WorkerReport(unusable=f"node {node} cannot run episodes: {'; '.join(storage + problems)}")
    where = {
        "node_id": node_id,
        # The node's address as registered (``ray.nodes()``'s NodeManagerAddress), without asking
        # the cluster: a lost node that comes back has a new id but this address.
        "ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "invocation": invocation_id(),
    }
    begin: Begin = await _get(coordinator.begin.remote(run_id, where), CONTROL_DEADLINE_S)
    if begin.cancelled_by is not None:
        return WorkerReport(cancelled_by=begin.cancelled_by)
    if begin.sweep:
        # This node was gone when attempts of this batch were lost on it: their sandboxes first.
        removed: list[str] | None = None
        try:
            removed = await asyncio.wait_for(sweep_run(config, batch_id, begin.sweep), SWEEP_DEADLINE_S)
        except Exception as exc:
            log.warning("sweeping the lost attempts %s failed here: %s", begin.sweep, exc)
        with contextlib.suppress(Exception):
            await _get(coordinator.swept.remote(where["ip"], begin.sweep, removed), CONTROL_DEADLINE_S)
    episode = Episode(
        task,
        config,
        attempt=attempt,
        run_id=run_id,
        runs_dir=runs_dir,
        bus=EventBus(attempt=attempt),
        batch_id=batch_id,
    )
    if report_phases:  # the driver shows each attempt's phase live (a fire-and-forget call each)
        episode.bus.subscribe(
            lambda event: (
                coordinator.phase.remote(run_id, event.phase.value)
                if isinstance(event, PhaseChanged)
                else None
            )
        )
    run = asyncio.ensure_future(episode.run())
    await asyncio.sleep(0)  # the episode's own task exists now: a cancel from here on reaches it
    watcher = asyncio.ensure_future(_forward_cancels(coordinator, run_id, episode))
    try:
        result = await run
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        with contextlib.suppress(Exception):  # ends the coordinator's long poll for this attempt
            await _get(coordinator.end.remote(run_id), CONTROL_DEADLINE_S)
    done = await Attempt.of(episode, result, config, may_retry, cancelled=result.cancelled_by is not None)
    return WorkerReport(result=done.result, blocked=done.blocked)


async def _forward_cancels(coordinator: Any, run_id: str, episode: Episode) -> None:
    """Each cancel of the batch cancels the episode once more (the second hurries its close)."""
    seen = 0
    while episode.running:
        try:
            names = await _get(coordinator.wait_cancel.remote(run_id, seen))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the coordinator is gone (its driver died): nothing more will come
            log.warning(
                "the batch coordinator is unreachable (%s); cancels no longer reach this episode", exc
            )
            return
        seen += len(names)
        for name in names:
            await episode.cancel(name)


def _sweep_task(config: AgentConfig, batch_id: str, run_ids: list[str]) -> list[str]:
    return asyncio.run(sweep_run(config, batch_id, run_ids))


async def sweep_run(config: AgentConfig, batch_id: str, run_ids: list[str]) -> list[str]:
    """Remove this node's sandboxes of the batch's attempts ``run_ids`` whose creating process is
    gone; their ids.

    Only what carries both the batch's id and one of the run ids: another batch's sandboxes (even one
    sharing the owner) are never touched; a sandbox whose creator still runs (a worker Ray wrongly
    thought lost) is left alone."""
    from opencode_tui_core import sweep_selection as sweeping

    found = await sweeping.list_ours([config.sandbox.provider], sweeping.default_owner(), config=config)
    removed = []
    for item in sweeping.leftovers(sweeping.of_batch(found, batch_id, run_ids)):
        await item.provider.remove(item.record.sandbox_id)
        removed.append(item.record.sandbox_id)
    return removed


# ---- the driver side -------------------------------------------------------------------------------


@dataclass
class PendingSweep:
    """A lost node's sandboxes of a run, to sweep when a node with its address is back."""

    run_id: str
    node_ip: str
    config: AgentConfig
    run_dir: Path | None = None  # the lost attempt's: its run.json says so once swept


class RayExecutor(Executor):
    name = "ray"

    def __init__(
        self,
        settings: RaySettings,
        *,
        on_started: Callable[[str, int, str], None] | None = None,
        on_phase: Callable[[str, str], None] | None = None,
        on_node: Callable[[str, str, str], None] | None = None,
    ):
        self.settings = settings
        # (run id, phase) as the workers report them; None: the workers report nothing.
        self.on_phase = on_phase
        # (run id, node id, node address) once a worker has started the attempt there.
        self.on_node = on_node
        self._phase_watch: asyncio.Future[None] | None = None
        self.batch_id = new_batch_id()  # run_batch sets the batch's own before start()
        self.on_started = on_started
        self._ray: Any = None
        self.probe_s: float | None = None  # how long the first worker took to answer the probe
        self._joined = False  # this executor called ray.init (and so leaves with ray.shutdown)
        self._coordinator: Any = None
        self._episode_fn: Any = None
        self._sweep_fn: Any = None
        self._probe_fn: Any = None
        self._probe: tuple[str, str] | None = None
        self._probe_path: Path | None = None
        self._inflight: dict[str, Any] = {}  # run id → its Ray task's ObjectRef
        self.cancelled_by: str | None = None
        self.pending_sweeps: list[PendingSweep] = []
        self.notes: list[str] = []  # what the driver must tell the user at the end

    # -- lifecycle --

    def plan(self, tasks: list[Task], config: AgentConfig, jobs: int) -> None:
        """No warm pool here (see ``WARM_NOT_USED``); said when ``batch.warm`` asks for one."""
        if config.batch.warm and tasks and may_prepare_ahead(config):
            self.warm_not_used = f"batch.warm: {config.batch.warm} {WARM_NOT_USED}"

    def connect(self) -> None:
        """Join the cluster (blocking; before the driver installs its signal handlers, which
        ``ray.init`` would otherwise replace). A process already connected to Ray (a training loop
        that runs its rollouts through ``run_batch``) keeps its connection."""
        ray = self._ray = _ray()
        if not ray.is_initialized():
            env = {k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)}
            try:
                ray.init(
                    address=self.settings.address,
                    runtime_env={"env_vars": env} if env else None,
                    log_to_driver=False,  # workers' diagnostics go to their run directories
                    logging_level=logging.WARNING,
                )
            except Exception as exc:
                where = self.settings.address or os.environ.get("RAY_ADDRESS") or "(Ray's default)"
                raise ExecutorError(f"cannot join the Ray cluster at {where}: {exc}") from exc
            self._joined = True
        remote = ray.remote
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # On the driver's own node: a lost worker node must not take the coordinator (the cancels,
        # the sweeps owed) with it, and that node lives as long as the driver does. Hard: Ray
        # spreads a soft affinity's 0-CPU actor to other nodes now and then.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._coordinator = remote(num_cpus=0, max_concurrency=100_000, scheduling_strategy=here)(
            Coordinator
        ).remote()
        # One Ray task per attempt, never retried by Ray: the outcome policy decides every retry.
        self._episode_fn = remote(max_retries=0, retry_exceptions=False)(_episode_task)
        self._sweep_fn = remote(num_cpus=0, max_retries=0)(_sweep_task)
        self._probe_fn = remote(max_retries=0)(_probe_task)

    async def start(self, runs_dir: Path, tasks: list[Task], config: AgentConfig) -> None:
        if self._coordinator is None:
            await asyncio.to_thread(self.connect)
        name, token = f"{PROBE_PREFIX}{self.batch_id}", secrets.token_hex(16)
        self._probe, self._probe_path = (name, token), runs_dir / name
        try:
            self._probe_path.write_text(token + "\n")
        except OSError as exc:
            raise ExecutorError(
                f"cannot write the probe file {self._probe_path}: {exc.strerror or exc}"
            ) from exc
        roots = sorted({str(t.root) for t in tasks})
        images = admission_images(config, tasks)
        started = time.monotonic()
        ref = self._probe_fn.options(num_cpus=self.settings.num_cpus_per_episode).remote(
            str(runs_dir), name, token, roots, __version__, config, images
        )
        try:
            report: ProbeReport = await _get(ref, PROBE_DEADLINE_S)
        except TimeoutError as exc:
            self._ray.cancel(ref)
            raise ExecutorError(
                f"no Ray worker with {self.settings.num_cpus_per_episode:g} free CPU(s) ran the "
                f"shared-storage probe within {PROBE_DEADLINE_S:.0f} s; check the cluster's resources"
            ) from exc
        except Exception as exc:  # the probe itself failed on the worker (a missing package, ...)
            raise ExecutorError(f"the probe failed on a Ray worker: {_words(exc)}") from exc
        self.probe_s = time.monotonic() - started
        if report.storage:
            raise ExecutorError(
                f"the runs directory {runs_dir} must be shared storage mounted at the same path on every "
                f"Ray node: node {report.node_ip}: {'; '.join(report.storage)}"
            )
        if report.problems:
            raise ExecutorError(
                f"Ray node {report.node_ip} cannot run this batch: {'; '.join(report.problems)}"
            )
        if self.on_phase is not None or self.on_node is not None:
            self._phase_watch = asyncio.ensure_future(self._watch_phases())

    async def _watch_phases(self) -> None:
        """Hands the workers' phase reports to ``on_phase``, and where each attempt started to
        ``on_node``, as they come (a long poll)."""
        seen, shown, placed = 0, dict[str, str](), set[str]()
        while True:
            try:
                seen, phases, nodes = await _get(
                    self._coordinator.wait_phases.remote(seen, 10.0), CONTROL_DEADLINE_S
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the progress stays as it is; the batch goes on
                log.warning("the workers' phases are no longer shown: %s", exc)
                return
            for run_id, (node_id, ip) in nodes.items():
                if run_id not in placed and self.on_node is not None:
                    placed.add(run_id)
                    self.on_node(run_id, node_id, ip)
            for run_id, phase in phases.items():
                if shown.get(run_id) != phase and self.on_phase is not None:
                    shown[run_id] = phase
                    self.on_phase(run_id, phase)

    async def close(self) -> None:
        """Sweep lost nodes that came back; remove the probe; leave the cluster."""
        if self._phase_watch is not None:
            self._phase_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._phase_watch
        if self._coordinator is not None:
            await self._retry_pending_sweeps()
        if self._probe_path is not None:
            with contextlib.suppress(OSError):
                self._probe_path.unlink()
        if self._joined and self._ray.is_initialized():
            await asyncio.to_thread(self._ray.shutdown)

    # -- one attempt --

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
        assert self._probe is not None and self.batch_id is not None, "start() first"
        run_id = new_run_id(task.id, attempt)
        ref = self._episode_fn.options(
            num_cpus=self.settings.num_cpus_per_episode, name=f"episode {run_id}"
        ).remote(
            task,
            config,
            attempt,
            run_id,
            str(runs_dir),
            may_retry,
            self._coordinator,
            self._probe,
            self.batch_id,
            self.on_phase is not None,
        )
        self._inflight[run_id] = ref
        if self.on_started is not None:
            self.on_started(task.id, attempt, run_id)
        exc_types = self._ray.exceptions
        lost = (
            exc_types.WorkerCrashedError,
            exc_types.NodeDiedError,
            exc_types.OutOfMemoryError,
            exc_types.LocalRayletDiedError,
            exc_types.ObjectLostError,
        )
        try:
            report: WorkerReport = await _get(ref)
        except exc_types.TaskCancelledError:
            by = self.cancelled_by or CANCELLED_BY_CALLER
            return Attempt(not_started(task, config, attempt, cancelled_by=by, batch_id=self.batch_id))
        except lost as exc:
            return Attempt(await self._lost(task, config, attempt, run_id, runs_dir, exc))
        finally:
            self._inflight.pop(run_id, None)
        if report.unusable is not None:
            control.halt(report.unusable)
            return Attempt(not_started(task, config, attempt, halted=report.unusable, batch_id=self.batch_id))
        if report.cancelled_by is not None:
            return Attempt(
                not_started(task, config, attempt, cancelled_by=report.cancelled_by, batch_id=self.batch_id)
            )
        assert report.result is not None
        return Attempt(report.result, report.blocked)

    # -- cancel --

    async def cancel(self, by: str) -> None:
        first = self.cancelled_by is None
        self.cancelled_by = self.cancelled_by or by
        try:
            started = set(await _get(self._coordinator.cancel.remote(by), CONTROL_DEADLINE_S))
        except Exception as exc:
            # Running episodes cannot be told; cancelling their Ray tasks would interrupt their close.
            self.notes.append(f"the cancel could not reach the Ray workers ({exc})")
            return
        if first:
            for run_id, ref in list(self._inflight.items()):
                if run_id not in started:  # queued (or dequeued before asking): it starts nothing
                    self._ray.cancel(ref, force=False)

    # -- a lost worker --

    async def _lost(
        self, task: Task, config: AgentConfig, attempt: int, run_id: str, runs_dir: Path, exc: BaseException
    ) -> EpisodeResult:
        run_path = runs_dir / run_id
        coordinator_error = None
        try:
            where = await _get(self._coordinator.where.remote(run_id), CONTROL_DEADLINE_S)
        except Exception as error:
            where, coordinator_error = None, error
        try:
            info = RunDirReader(run_path).info()
        except (OSError, ValueError):
            info = None
        phase = info.phase if info is not None else "admission"
        stage = stage_of(phase)
        reason = _words(exc)
        if where is None and (coordinator_error is None or info is None):
            # The worker died before asking to start (or before the episode wrote its run.json): no
            # sandbox of this attempt was ever created.
            confirmed, proof = True, CleanupProof.NOTHING_LAUNCHED
            place, note = "a Ray worker", "it had not started the episode"
        elif where is None:
            # The episode ran, but where is not known any more: nothing says its sandbox is gone.
            assert coordinator_error is not None  # (the branch above took an unknown place without one)
            confirmed, proof = None, None
            place = "a Ray worker"
            note = (
                f"the batch's coordinator is unreachable ({_words(coordinator_error)}), so its node is "
                f"unknown: cleanup unknown (`opencode-tui sweep --batch {self.batch_id} --run {run_id}` "
                "on its node)"
            )
        else:
            where.setdefault("ip", node_address(self._ray, where["node_id"]))
            place = f"the Ray worker (pid {where['pid']}) on node {where['ip']}"
            confirmed, proof, note = await self._sweep_after_loss(config, run_id, where, info, run_path)
        failure = FailureEvent(
            kind="executor_worker_lost",
            stage=stage,
            operation=f"{phase} phase on {place}",
            message=f"{place} running this attempt was lost during {phase} ({reason}); {note}",
        )
        policy = merged(DEFAULT_POLICY, config.policy)
        classification = merged_classification(DEFAULT_CLASSIFICATION, config.classification)
        decision = decide(failure, attempt=attempt, policy=policy, classification=classification)
        verdict = decide_outcome(
            EpisodeFacts(
                failures=[RecordedFailure(failure=failure, decision=decision)], cleanup_confirmed=confirmed
            )
        )
        result = EpisodeResult(
            run_id=run_id,
            task_id=task.id,
            attempt=attempt,
            batch_id=self.batch_id,
            provider=config.sandbox.provider,
            sandbox_id=info.sandbox_id if info is not None else None,
            action=verdict.outcome,
            failure_kind=failure.kind,
            failure_stage=failure.stage.value,
            failure_class=decision.failure_class.value,
            cleanup_confirmed=confirmed,
            cleanup_proof=proof,
            exit_code=verdict.exit_code,
            durations_s=dict(info.phase_durations_s) if info is not None else {},
            run_dir=str(run_path),
            summary=f"{verdict.summary}: {failure.message}",
        )
        if info is not None and info.outcome is None:
            # Said in run.json too, so `runs` and the next batch do not take it for a running episode.
            info.outcome = OutcomeSummary(
                action=result.action,
                failure_kind=result.failure_kind,
                failure_stage=result.failure_stage,
                failure_class=result.failure_class,
                summary=result.summary,
            )
            info.counts["cleanup_confirmed"] = confirmed
            info.counts["cleanup_proof"] = proof
            with contextlib.suppress(OSError):
                RunDir(run_path).write_run_info(info)
        return result

    async def _sweep_after_loss(
        self, config: AgentConfig, run_id: str, where: dict[str, Any], info: Any, run_path: Path
    ) -> tuple[bool | None, CleanupProof | None, str]:
        """(cleanup confirmed, proof, words) after sweeping the lost worker's node."""
        if config.sandbox.mode == "borrowed":
            return None, None, "the borrowed sandbox is never destroyed by us: its cleanup stays unknown"
        if config.sandbox.keep_sandbox:
            return None, None, f"its sandbox is kept (remove it with `opencode-tui sweep --run {run_id}`)"
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from opencode_tui_core import provider_registry as registry

        # A provider whose listing needs a configured server (OpenSandbox) keeps its sandboxes there,
        # reachable from any node: any node may sweep them. The others' live on the lost node.
        soft = not registry.get(config.sandbox.provider).capabilities.sweep_by_default
        strategy = NodeAffinitySchedulingStrategy(where["node_id"], soft=soft)
        try:
            removed = await _get(
                self._sweep_fn.options(scheduling_strategy=strategy).remote(config, self.batch_id, [run_id]),
                SWEEP_DEADLINE_S,
            )
        except Exception as exc:
            self.pending_sweeps.append(
                PendingSweep(run_id=run_id, node_ip=where["ip"], config=config, run_dir=run_path)
            )
            with contextlib.suppress(Exception):  # the next task on a node at this address sweeps it
                await _get(self._coordinator.pend.remote(where["ip"], run_id), CONTROL_DEADLINE_S)
            return (
                None,
                None,
                f"its node could not be swept ({_words(exc)}): cleanup unknown until the node is back "
                f"(this batch sweeps it then; else `opencode-tui sweep --batch {self.batch_id} "
                f"--run {run_id}` there)",
            )
        had_sandbox = bool(removed) or (info is not None and info.sandbox_id is not None)
        if removed:
            note = f"its sandbox {', '.join(removed)} was swept from the node"
        elif had_sandbox:
            note = "its sandbox was already gone from the node"
        else:
            note = "no sandbox of it was left on the node"
        return True, CleanupProof.DESTROYED if had_sandbox else CleanupProof.NOTHING_LAUNCHED, note

    async def _retry_pending_sweeps(self) -> None:
        """The lost nodes' sweeps that are still owed: first what the workers that landed on a node
        that came back swept, then one pass over every live node for what is left."""
        if not self.pending_sweeps:
            return
        try:
            done = await _get(self._coordinator.sweeps.remote(), CONTROL_DEADLINE_S)
        except Exception:
            done = []
        for ip, run_ids, removed in done:
            for pending in [p for p in self.pending_sweeps if p.node_ip == ip and p.run_id in run_ids]:
                self.pending_sweeps.remove(pending)
                words = f"the next episode there swept {len(removed)} sandbox(es)"
                self.notes.append(f"node {ip} is back: {words} of lost run {pending.run_id}")
                _swept_later(pending, removed, f"node {ip} came back: {words}")
        if not self.pending_sweeps:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [n for n in self._ray.nodes() if n.get("Alive")]
        run_ids = sorted({p.run_id for p in self.pending_sweeps})
        config = self.pending_sweeps[0].config  # one batch, one configuration
        swept: dict[str, list[str]] = {}  # node address → removed (every live node, each run id)
        for node in alive:
            ip = str(node.get("NodeManagerAddress"))
            strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            try:
                removed = await _get(
                    self._sweep_fn.options(scheduling_strategy=strategy).remote(
                        config, self.batch_id, run_ids
                    ),
                    SWEEP_DEADLINE_S,
                )
            except Exception as exc:
                self.notes.append(f"sweeping the lost runs on node {ip} failed: {_words(exc)}")
                continue
            swept.setdefault(ip, []).extend(removed)
        for pending in list(self.pending_sweeps):
            if pending.node_ip not in swept:
                self.notes.append(
                    f"node {pending.node_ip} is not back: sweep lost run {pending.run_id} there "
                    f"(`opencode-tui sweep --batch {self.batch_id} --run {pending.run_id}`)"
                )
                continue
            self.pending_sweeps.remove(pending)
            words = f"swept {len(swept[pending.node_ip])} sandbox(es)"
            self.notes.append(f"node {pending.node_ip} is back: {words} of lost run {pending.run_id}")
            _swept_later(pending, swept[pending.node_ip], f"node {pending.node_ip} came back: {words}")


def _swept_later(pending: PendingSweep, removed: list[str], words: str) -> None:
    """The lost attempt's run.json: its cleanup, unknown when it was lost, is confirmed now (the
    attempt's record in results.jsonl was the batch's word at the time and stays as it was)."""
    if pending.run_dir is None:
        return
    try:
        info = RunDirReader(pending.run_dir).info()
    except (OSError, ValueError):
        return
    if info is None:  # no run.json: nothing to update
        return
    had_sandbox = bool(removed) or info.sandbox_id is not None
    info.counts["cleanup_confirmed"] = True
    info.counts["cleanup_proof"] = CleanupProof.DESTROYED if had_sandbox else CleanupProof.NOTHING_LAUNCHED
    if info.outcome is not None:
        info.outcome.summary += f"; later, {words}"
    with contextlib.suppress(OSError):
        RunDir(pending.run_dir).write_run_info(info)


def _words(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    first = text.split(". ")[0][:300]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# Ray's loggers in the driver, and ours.
DRIVER_LOGGERS = ("ray", __name__)


@contextlib.contextmanager
def driver_output_to(path: Path) -> Iterator[None]:
    """Ray's driver messages go to ``path`` (appended; made at the first message) instead of this
    process's stdout and stderr, which a screen owns: its loggers' records, and the cluster's error
    messages (a worker died, a task failed) that Ray's listener thread prints to ``sys.stdout``
    whatever ``log_to_driver`` says (``ray._private.worker.print_to_stdstream``, looked up by name at
    each message; left alone if a Ray version has none). As they were after."""
    handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = []
    for name in DRIVER_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.propagate))
        for h in list(logger.handlers):
            logger.removeHandler(h)
        logger.addHandler(handler)
        logger.propagate = False
    # Looked up by name: an import statement would bind ``worker`` a second time, which the type
    # checker sees as a redefinition wherever ray is not installed (the extra is optional).
    worker: Any = None
    printer = None
    with contextlib.suppress(ImportError):
        worker = importlib.import_module("ray._private.worker")
        printer = getattr(worker, "print_to_stdstream", None)
    if printer is not None:
        to_file = logging.getLogger(f"{__name__}.cluster")  # (propagates to this module's: the file)

        def print_to_log(data: dict[str, Any], ignore_prefix: bool = False) -> None:
            where = data.get("pid", "")
            for line in data.get("lines", ()):
                to_file.warning("(%s) %s", where, line)

        worker.print_to_stdstream = print_to_log
    try:
        yield
    finally:
        if printer is not None:
            worker.print_to_stdstream = printer
        for logger, handlers, propagate in saved:
            logger.removeHandler(handler)
            for h in handlers:
                logger.addHandler(h)
            logger.propagate = propagate
        handler.close()


class _RayExecutorPlugin(ExecutorPlugin):
    name = "ray"
    summary = "the episodes run on a Ray cluster (pip install 'opencode-tui[ray]'); see docs/scaling.md"
    remote = True

    def output_to(self, path: Path) -> contextlib.AbstractContextManager[None]:
        return driver_output_to(path)

    def executor(self, config: AgentConfig, hooks: ExecutorHooks) -> Executor:
        executor = RayExecutor(
            config.executor.ray, on_started=hooks.on_started, on_phase=hooks.on_phase, on_node=hooks.on_node
        )
        executor.connect()
        return executor


PLUGIN = _RayExecutorPlugin()  # the entry point (pyproject.toml: opencode_tui.executors)
