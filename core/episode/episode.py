"""One episode end to end: seed → install → agent → close (confirmed cleanup) → transcript → verify
→ release → outcome. Each phase is a function in its own module that returns a typed result; this
orchestrator holds what lives across phases: the events, the cancel and keep state, the close deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from opencode_tui_core import invocation
from opencode_tui_core.artifacts import RunDir, RunFiles, RunInfo, versions
from opencode_tui_core.calls.progress import ProgressWatch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.control import CANCELLED_BY_CALLER, CANCELLED_BY_USER, CancelRequest, EpisodeControl
from opencode_tui_core.episode import agent, close, engine_lost, install, release, seed, transcript, verify
from opencode_tui_core.episode.common import UNEXPECTED_KIND, PhaseIO, StageFailure, failure_from, stage_of
from opencode_tui_core.episode.record import (
    EpisodeResult,
    Tally,
    new_run_id,
    outcome_event,
    result_of,
    write_record,
)
from opencode_tui_core.events import (
    CleanupObserved,
    CleanupProof,
    CleanupStep,
    EpisodeStarted,
    Event,
    EventBus,
    FailureRecorded,
    FailureRecovered,
    Intervention,
    ModelCall,
    Phase,
    PhaseChanged,
    ShellClosed,
    ShellOpened,
    StepState,
    TerminalOutput,
    Warning_,
)
from opencode_tui_core.failures import (
    DEFAULT_CLASSIFICATION,
    DEFAULT_POLICY,
    Decision,
    FailureEvent,
    FailureStage,
    GenericDetails,
    Recovery,
    decide,
    merged,
    merged_classification,
)
from opencode_tui_core.health import HealthMonitor
from opencode_tui_core.image_build import ensure_task_image
from opencode_tui_core.inside.serve_runner import HANDOFF_PREFIX
from opencode_tui_core.model.hold import CallGate
from opencode_tui_core.outcome import EpisodeFacts, RecordedFailure, decide_outcome
from opencode_tui_core.runtime import access
from opencode_tui_core.sandbox.base import (
    ExpectedRefusal,
    PtyHandle,
    Sandbox,
    SandboxClosedError,
    SandboxProvider,
    SandboxUser,
)
from opencode_tui_core.session import CloseDeadline, SandboxSession
from opencode_tui_core.shells import RecordedShell
from opencode_tui_core.tasks import Task

if TYPE_CHECKING:
    from opencode_tui_core.debugger.debugger import Debugger
    from opencode_tui_core.episode.ahead import ServerAhead
    from opencode_tui_core.episode.digests import DigestGate
    from opencode_tui_core.episode.lineage import ChildRun, Parent
    from opencode_tui_core.episode.pool import Lease, WarmPool
    from opencode_tui_core.model.endpoint import ModelEndpoint
    from opencode_tui_core.model.proxy import ModelProxy
    from opencode_tui_core.model.replay import ReplayPlan
    from opencode_tui_core.runtime.installer import Installer
    from opencode_tui_core.runtime.supervisor_client import CleanupReceipt


class Episode(EpisodeControl):
    """Runs one attempt of one task. Use ``await Episode(...).run()``; front ends use the control API."""

    def __init__(
        self,
        task: Task,
        config: AgentConfig,
        *,
        attempt: int = 1,
        run_id: str | None = None,
        runs_dir: Path | None = None,
        provider: SandboxProvider | None = None,
        installer: Installer | None = None,
        bus: EventBus | None = None,
        batch_id: str | None = None,
        child_of: tuple[ReplayPlan, Parent] | None = None,
        pool: WarmPool | None = None,
    ) -> None:
        self.task = task
        self.config = config
        self.attempt = attempt
        self.batch_id = batch_id  # the batch this attempt belongs to (labels its sandbox, run.json)
        self.run_id = run_id or new_run_id(task.id, attempt)
        self.runs_dir = Path(runs_dir or config.runs_dir)
        self.bus = bus or EventBus(attempt=attempt)
        self._provider = provider
        self._installer = installer
        self.policy = merged(DEFAULT_POLICY, config.policy)
        self.classification = merged_classification(DEFAULT_CLASSIFICATION, config.classification)
        # What the phases hand on, set as each one returns.
        self.run_dir: RunDir | None = None
        self.info: RunInfo | None = None
        self.endpoint: ModelEndpoint | None = None  # once the seed phase started it
        self.sandbox: Sandbox | None = None
        self.sandbox_user: SandboxUser | None = (
            None  # decided once in the seed phase (opencode_tui_core.runtime.access)
        )
        self.installed: install.Installed | None = None
        self.session: SandboxSession | None = None
        self.agent_run: agent.AgentRun | None = None
        self.closed: close.Closed | None = None
        self.reward: float | None = None
        self.refusal: str | None = None  # set when the provider refused before launch (no failure)
        self.cleanup_proof: CleanupProof | None = None
        self.failures: list[RecordedFailure] = []
        self.tally = Tally()
        # The cancel and keep state, and the close deadline (fixed when the close starts).
        self._keep = config.sandbox.keep_sandbox
        self._cancel: CancelRequest | None = None
        self._graceful_stop: asyncio.Future[CleanupReceipt] | None = None
        self._destroyed_in_hurry = False
        self._release_started = False
        self.close_deadline: CloseDeadline | None = None  # [close budget]
        self._shells = 0
        self.human_intervened = False
        self._agent_task: asyncio.Task[None] | None = None
        self._verify_task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._result: EpisodeResult | None = None
        self._phase_started: dict[str, float] = {}
        self.durations: dict[str, float] = {}
        self.started_at: datetime | None = None  # the EpisodeStarted event's time (terminal offsets)
        self._phase: Phase = Phase.ADMISSION
        self.health: HealthMonitor | None = None  # [health] once the run directory exists
        self._health_watch: asyncio.Future[None] | None = None
        self._prewarming: asyncio.Future[None] | None = None  # the installer's digest check, early
        # [no progress] the failure that made the episode stop its own agent (core/calls/progress.py)
        self.stopped_for: FailureEvent | None = None
        self.debugger: Debugger | None = None  # once the run directory exists (issue 27)
        # issue 28: a rerun or fork of a recorded run, answered from its record (core/episode/lineage.py)
        self._child_of = child_of
        self.child: ChildRun | None = None  # once the run directory exists
        self.digests: DigestGate | None = None  # before each agent call (debug.workspace_digests: false: off)
        # issue 31: the batch's warm pool, and the prepared sandbox this attempt took from it
        self._pool = pool
        self.lease: Lease | None = None

    # ---- control API ---------------------------------------------------------------------------

    @property
    def replay_plan(self) -> ReplayPlan | None:
        """A rerun's or fork's plan (before it starts too); None for any other episode."""
        return self._child_of[0] if self._child_of is not None else None

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    async def cancel(self, by: str = CANCELLED_BY_USER) -> None:
        """A graceful close, whatever the phase; a second request hurries it (see ``_hurry``).

        During the agent the supervisor stops OpenCode, drains its descendants and writes the
        receipt: cancelling the exec instead would kill the supervisor with it and lose the receipt.
        Seed and install are simply interrupted (nothing runs yet); verification is abandoned (its
        grade would mean nothing); closing, transcript and release carry on to the end.
        """
        if self._cancel is not None:
            await self._hurry(by)
            return
        self._cancel = CancelRequest(by=by, phase=self._phase)
        self._release_held(self._cancel.words)
        self.emit(
            Warning_(
                code="cancel_requested",
                message=f"{self._cancel.words}: stopping the agent and closing the sandbox "
                "(cleanup is still confirmed; a second request hurries)",
            )
        )
        launched = self.session is not None and self.session.launch_started
        if self._phase is Phase.AGENT and launched:
            assert self.session is not None
            self._graceful_stop = asyncio.ensure_future(self.session.finalize())
            self._graceful_stop.add_done_callback(self._after_graceful_stop)
        elif self._phase in (Phase.ADMISSION, Phase.SEED, Phase.INSTALL, Phase.AGENT):
            if self._agent_task is not None and not self._agent_task.done():
                self._agent_task.cancel()
        elif self._verify_task is not None and not self._verify_task.done():
            self._verify_task.cancel()

    def _after_graceful_stop(self, stop: asyncio.Future[CleanupReceipt]) -> None:
        """The supervisor could not confirm the stop: stop waiting for the harness's exec (it may
        never end by itself); the close records the unconfirmed cleanup."""
        failed = stop.cancelled() or stop.exception() is not None
        if failed and self._agent_task is not None and not self._agent_task.done():
            self._agent_task.cancel()

    async def _hurry(self, by: str) -> None:
        """A second request: destroy an owned sandbox now (its death ends every process in it);
        a borrowed one is never destroyed: its harness is stopped by the close already under way."""
        assert self._cancel is not None
        if self._cancel.hurry:
            return
        self._cancel = self._cancel.model_copy(update={"hurry": True, "hurried_by": by})
        self.emit(Warning_(code="cancel_hurried", message=f"{by} again: hurrying the close"))
        for task in (self._agent_task, self._verify_task):
            if task is not None and not task.done():
                task.cancel()
        if self.sandbox is not None and self.sandbox.owned and not self._keep:
            # Said before the destruction starts: the close under way sees its receipt fail because of it.
            self._destroyed_in_hurry = True
            try:
                # [close budget] within what the close has left (everything, the release's reserve
                # included), never a fresh budget: a hurry shortens the close, it cannot lengthen it.
                await self._begin_close().run(
                    self.sandbox.release(), step="destroy the sandbox (hurried)", for_release=True
                )
            except Exception as exc:
                self._destroyed_in_hurry = False
                self.emit(
                    Warning_(code="hurry_release_failed", message=f"could not destroy the sandbox: {exc}")
                )

    @property
    def kept(self) -> bool:
        return self._keep

    @property
    def keep_changeable(self) -> bool:
        return not self._release_started

    def keep_sandbox(self, keep: bool = True) -> None:
        if self._release_started and keep != self._keep:
            state = "kept" if self._keep else "released"
            raise SandboxClosedError(f"the sandbox was already {state}; keep can no longer change")
        self._keep = keep

    async def open_shell(self, cols: int = 80, rows: int = 24) -> PtyHandle:
        """A recorded shell; opened before verification has finished, it marks the sample."""
        if self.sandbox is None or (self.session is not None and self.session.released):
            raise SandboxClosedError("the sandbox is not available (not created yet, or already released)")
        handle = await self.sandbox.pty(["/bin/bash", "-l"], cols=cols, rows=rows, cwd=self.task.workdir)
        assert self.run_dir is not None
        self._shells += 1
        n, phase = self._shells, self._phase
        marks = phase not in (Phase.RELEASE, Phase.DONE)
        cast_name, cast = self.run_dir.shell_cast(n, cols, rows)
        self.emit(ShellOpened(shell=n, phase=phase, marks_sample=marks, cast=cast_name))
        if marks:
            self._human_intervened(phase)

        def closed(duration_s: float, bytes_in: int, bytes_out: int) -> None:
            self.emit(ShellClosed(shell=n, duration_s=duration_s, bytes_in=bytes_in, bytes_out=bytes_out))

        return RecordedShell(handle, cast, closed)

    def _human_intervened(self, phase: Phase, message: str | None = None) -> None:
        """Once per episode: the run.json flag, and a failure (or, if the policy scores such runs, a
        warning) so the outcome cannot be a clean sample without saying so."""
        if self.human_intervened:
            return
        self.human_intervened = True
        if self.info is not None and self.run_dir is not None:
            self.info.human_intervened = True
            self.run_dir.write_run_info(self.info)
        message = message or (
            f"a person opened a shell in the sandbox during {phase.value}, before verification finished"
        )
        if self.policy.score_human_intervened:
            self.emit(
                Warning_(
                    code="human_intervened",
                    message=f"{message}; scored anyway (policy.score_human_intervened)",
                )
            )
            return
        self.record_failure(
            FailureEvent(
                kind="human_intervened",
                stage=stage_of(phase),
                operation="interactive shell" if message.startswith("a person opened") else "debugger",
                message=message,
            )
        )

    # ---- the debugger (issue 27) -----------------------------------------------------------------

    def _start_debugger(self) -> None:
        from opencode_tui_core.debugger.debugger import Debugger

        self.debugger = Debugger(
            self.config.debug.breaks,
            emit=self.emit,
            on_intervened=self._debugger_intervened,
            phase=lambda: self._phase.value,
        )
        self.bus.subscribe(self.debugger.observe)

        def to_run_info(event: Event) -> None:
            if isinstance(event, Intervention) and self.info is not None and self.run_dir is not None:
                self.info.interventions.append(event)
                self.run_dir.write_run_info(self.info)

        self.bus.subscribe(to_run_info)

    def _debugger_intervened(self, what: str) -> None:
        phase = self._phase
        self._human_intervened(
            phase, f"the debugger changed the run ({what}) during {phase.value}, before verification finished"
        )

    def _release_held(self, reason: str) -> None:
        if self.debugger is not None:
            self.debugger.release_all(reason)

    async def wait(self) -> EpisodeResult:
        await self._done.wait()
        assert self._result is not None
        return self._result

    # ---- events and bookkeeping -----------------------------------------------------------------

    def emit(self, event: Event) -> Event:
        return self.bus.emit(event)

    def _enter(self, phase: Phase, detail: str | None = None, state: StepState = StepState.RUNNING) -> None:
        now = time.monotonic()
        prev = self._phase
        if prev.value in self._phase_started:
            self.durations[prev.value] = round(now - self._phase_started[prev.value], 3)
        self._phase = phase
        self._phase_started[phase.value] = now
        # run.json first: whoever reads the new phase in events.jsonl (a test, the next run marking
        # an orphan after a SIGKILL) then finds run.json agreeing with it.
        self._write_info(phase=phase.value, phase_durations_s=dict(self.durations))
        self.emit(PhaseChanged(phase=phase, state=state, detail=detail))

    def _write_info(self, **fields: object) -> None:
        """Update run.json (once it exists) with what a phase learned."""
        if self.info is not None and self.run_dir is not None:
            for name, value in fields.items():
                setattr(self.info, name, value)
            self.run_dir.write_run_info(self.info)

    def record_failure(self, failure: FailureEvent) -> Decision:
        decision = self._decide(failure)
        self.failures.append(RecordedFailure(failure=failure, decision=decision))
        self.emit(FailureRecorded(failure=failure, decision=decision))
        return decision

    def _begin_close(self) -> CloseDeadline:
        """The close deadline, fixed by its first use (the close, or a hurry that came first)."""
        if self.close_deadline is None:
            self.close_deadline = (
                self.session.begin_close()
                if self.session is not None
                else CloseDeadline(self.config.budgets.close_s)
            )
        return self.close_deadline

    def _recovered(self, failure: FailureEvent, how: Recovery) -> None:
        stage = stage_of(self._phase)
        stamped = failure if failure.stage is stage else failure.model_copy(update={"stage": stage})
        self.emit(FailureRecovered(failure=stamped, recovery=how))

    def _decide(self, failure: FailureEvent) -> Decision:
        return decide(failure, attempt=self.attempt, policy=self.policy, classification=self.classification)

    def _io(self) -> PhaseIO:
        assert self.run_dir is not None
        return PhaseIO(self.emit, self.record_failure, self.run_dir)

    # ---- the episode ---------------------------------------------------------------------------

    async def run(self) -> EpisodeResult:
        try:
            self._result = await self._run()
            return self._result
        finally:
            if self._health_watch is not None:  # [health]
                self._health_watch.cancel()
            self._done.set()

    def _secrets(self) -> tuple[str, ...]:
        env = self.config.model.api_key_env
        value = os.environ.get(env) if env else None
        return (value,) if value else ()

    def _start_run_dir(self) -> None:
        self.run_dir = RunDir.create(self.runs_dir, self.run_id, secrets=self._secrets())
        self.run_dir.on_write_error = self._artifacts_failed
        self.bus.subscribe(self.run_dir.append_event)
        self.bus.subscribe(self.tally.count)
        # [health] warnings derived from the same stream (core/health.py); the clock part runs in _run
        self.health = HealthMonitor(self.config.health, self.config.model.context_window)
        self.health.attach(self.bus)
        self._watch_progress()
        cast = self.run_dir.cast()

        def to_cast(event: Event) -> None:
            if isinstance(event, TerminalOutput) and event.stream == "display":
                cast.output(event.data.replace("\r\n", "\n").replace("\n", "\r\n"))

        self.bus.subscribe(to_cast)
        self.info = RunInfo(
            run_id=self.run_id,
            task_id=self.task.id,
            task_dir=str(self.task.root),
            attempt=self.attempt,
            batch_id=self.batch_id,
            provider=self.config.sandbox.provider,
            config=self.config.model_dump(mode="json"),
            versions=versions(self.config.runtime.opencode_version),
            controller=invocation.invocation_id(),
        )
        self._start_lineage(self.info)
        self.run_dir.write_run_info(self.info)
        self._start_debugger()

    def _start_lineage(self, info: RunInfo) -> None:
        """A child run's lineage (issue 28)."""
        if self._child_of is None:
            return
        from opencode_tui_core.episode.lineage import ChildRun

        plan, parent = self._child_of
        self.child = ChildRun(plan, parent, emit=self.emit, stop_agent=self.stop_agent, save=self._save_info)
        self.child.stamp(info)

    async def _hash_task(self) -> None:
        """run.json's ``task_hash``: the task's content, what a rerun checks it against (off the loop:
        a large task takes a while to read, and other episodes share the loop)."""
        from opencode_tui_core.tasks import task_content_hash

        try:
            digest: str | None = await asyncio.to_thread(task_content_hash, self.task)
        except Exception:  # never a reason for the run not to go on; unknown, a rerun says so
            digest = None
        self._write_info(task_hash=digest)

    def _save_info(self) -> None:
        if self.info is not None and self.run_dir is not None:
            self.run_dir.write_run_info(self.info)

    def _watch_progress(self) -> None:
        """[no progress] model answers that give the agent nothing, call after call, stop the agent."""
        watch = ProgressWatch(
            self.config.model.empty_answers_limit, self.config.model.empty_answers_total_limit
        )
        loop = asyncio.get_running_loop()

        def observe(event: Event) -> list[Event]:
            found = watch.observe(event) if isinstance(event, ModelCall) else None
            if found is not None:  # acted on from the loop: the bus is mid-delivery here
                loop.call_soon_threadsafe(self.stop_agent, found.to_failure())
            return []

        self.bus.derive(observe)

    def stop_agent(self, failure: FailureEvent) -> None:
        """Record ``failure`` and stop the agent as a cancel would (the supervisor stops OpenCode and
        confirms cleanup), without calling it a cancel: the outcome is the failure's. Once."""
        if self.stopped_for is not None or self._cancel is not None:
            return
        self.stopped_for = failure
        self.record_failure(failure)
        self._release_held(f"the agent was stopped ({failure.kind})")
        proxy = self._proxy
        if proxy is not None:  # what it asks while it is being stopped never reaches the model
            proxy.refuse(f"the agent was stopped ({failure.kind})")
        launched = self.session is not None and self.session.launch_started
        if self._phase is not Phase.AGENT or not launched:
            return  # the agent is not running (any more): the close follows as usual
        assert self.session is not None
        self.emit(
            Warning_(
                code="agent_stopped",
                message=f"{failure.kind}: stopping the agent (cleanup is still confirmed)",
            )
        )
        self._graceful_stop = asyncio.ensure_future(self.session.finalize())
        self._graceful_stop.add_done_callback(self._after_graceful_stop)

    @property
    def run_budget_s(self) -> float:
        return agent.run_budget_of(self.task, self.config)

    def _artifacts_failed(self, message: str) -> None:
        """The run directory stopped taking writes (a full or read-only disk): the episode goes on
        and closes its sandbox; the record it could not finish is not a trustworthy sample."""
        self.record_failure(
            FailureEvent(
                kind="artifacts_write_failed",
                stage=stage_of(self._phase),
                operation="write the run directory",
                message=message,
            )
        )

    def _unrecorded(self, exc: OSError) -> EpisodeResult:
        """The run directory could not even be created: nothing started, nothing to release."""
        message = f"cannot create the run directory {self.runs_dir / self.run_id}: {exc.strerror or exc}"
        failure = FailureEvent(
            kind="artifacts_write_failed",
            stage=FailureStage.ADMISSION,
            operation="create run directory",
            message=message,
        )
        self.failures.append(RecordedFailure(failure=failure, decision=self._decide(failure)))
        verdict = decide_outcome(EpisodeFacts(failures=self.failures))
        return EpisodeResult(
            run_id=self.run_id,
            task_id=self.task.id,
            attempt=self.attempt,
            batch_id=self.batch_id,
            provider=self.config.sandbox.provider,
            action=verdict.outcome,
            failure_kind=failure.kind,
            failure_stage=failure.stage.value,
            failure_class=verdict.deciding.decision.failure_class.value if verdict.deciding else None,
            exit_code=verdict.exit_code,
            run_dir=str(self.runs_dir / self.run_id),
            summary=message,
            artifacts_error=message,
        )

    async def _run(self) -> EpisodeResult:
        try:
            self._start_run_dir()
        except OSError as exc:
            return self._unrecorded(exc)
        assert self.health is not None  # made with the run directory
        self.started_at = self.emit(
            EpisodeStarted(
                run_id=self.run_id,
                task_id=self.task.id,
                provider=self.config.sandbox.provider,
                opencode_version=self.config.runtime.opencode_version,
                run_budget_s=self.run_budget_s,
                close_budget_s=self.config.budgets.close_s,
                model=self.config.model.name,
                model_url=self.config.model.url,
            )
        ).ts
        if self.child is not None:
            self.child.started()
        # [health] silent commands are noticed on a clock; it ends with the episode or its run budget
        self._health_watch = asyncio.ensure_future(
            self.health.watch(self.bus, self.run_budget_s + self.config.budgets.close_s)
        )
        stack = contextlib.AsyncExitStack()
        self._agent_task = asyncio.ensure_future(self._work(stack))
        try:
            await self._agent_task
        except asyncio.CancelledError:
            # The caller's task was cancelled, not through cancel() (nor by the episode's own stop).
            if self._cancel is None and self.stopped_for is None:
                self._cancel = CancelRequest(by=CANCELLED_BY_CALLER, phase=self._phase)
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except StageFailure as sf:
            self.record_failure(sf.failure)
        except ExpectedRefusal as exc:
            # A provider-confirmed refusal before anything ran is control flow, not a failure.
            self.refusal = str(exc)
            self.emit(Warning_(code="provider_refused", message=f"the provider refused before launch: {exc}"))
        except Exception as exc:  # a provider's typed failure, or an unexpected bug: still close and release
            self.record_failure(
                failure_from(
                    exc,
                    UNEXPECTED_KIND.get(self._phase, "agent_bootstrap_failed"),
                    stage_of(self._phase),
                    f"{self._phase.value} phase",
                )
            )
        if self._cancel is not None and self._cancel.phase is not Phase.VERIFICATION:
            self._record_cancel()
        # Closing must finish even if the caller is cancelled again (a second Ctrl-C): every step
        # below has its own deadline, so this loop is bounded.
        finish = asyncio.ensure_future(self._finish(stack))
        while True:
            try:
                return await asyncio.shield(finish)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                # The caller was cancelled while closing: a cancel like any other (a second hurries).
                await self.cancel(self._cancel.by if self._cancel else CANCELLED_BY_CALLER)
                if finish.done():
                    return finish.result()

    def _record_cancel(self) -> None:
        """``run_cancelled``, naming the phase and what asked for it (once)."""
        assert self._cancel is not None
        if any(r.failure.kind == "run_cancelled" for r in self.failures):
            return
        c = self._cancel
        self.record_failure(
            FailureEvent(
                kind="run_cancelled",
                stage=stage_of(c.phase),
                operation=f"{c.phase.value} phase",
                message=f"{c.words} during {c.phase.value}",
                details=GenericDetails(data={"by": c.by, "phase": c.phase.value}),
            )
        )

    async def _work(self, stack: contextlib.AsyncExitStack) -> None:
        """Seed, install, agent: interrupted as a whole by a cancel before the agent launched."""
        from opencode_tui_core.model.endpoint import ModelEndpoint
        from opencode_tui_core.sandbox.providers import get_provider

        assert self.run_dir is not None and self.debugger is not None  # made with the run directory
        sb = self.config.sandbox
        self._enter(Phase.SEED)
        await self._hash_task()
        from opencode_tui_core.debugger.control_socket import ControlSocket

        await stack.enter_async_context(ControlSocket(self.run_dir.path, self.debugger))
        gate: CallGate = self.debugger
        if self.config.debug.workspace_digests is not False:  # issue 28: what a fork at a step reproduces
            from opencode_tui_core.episode.digests import DigestGate

            on_digest = self.child.on_digest if self.child is not None else None
            gate = self.digests = DigestGate(self.debugger, self.run_dir, on_digest=on_digest)
        if self._pool is not None and sb.mode == "owned":
            # issue 31: a sandbox prepared ahead (created, OpenCode installed); ours from here on, so a
            # failure below still releases it. Its model socket is served by this run's proxy.
            self.lease = await self._pool.take(self.task)
            if self.lease is not None:
                self.sandbox = self.lease.sandbox
                self.emit(self.lease.event)
        self.endpoint = await stack.enter_async_context(
            ModelEndpoint(
                self.task,
                self.config.model,
                self.run_dir.path,
                on_call=self.emit,
                gate=gate,
                replay=self.child.replayer if self.child is not None else None,
                listen=self.lease.listen if self.lease is not None else None,
                access_token=self._ahead.token if self._ahead is not None else None,
                side=(HANDOFF_PREFIX, self._ahead.handoff.serve) if self._ahead is not None else None,
            )
        )
        provider = self._provider or get_provider(sb.provider, self.config)
        installer = self._installer = self._installer or seed.default_installer(self.config)
        # The cached binary's digest, checked once per process, is computed while the sandbox is made
        # (best effort; the install phase's own check waits for it rather than hashing twice).
        prewarm = getattr(installer, "prewarm", None)
        if prewarm is not None:
            self._prewarming = asyncio.ensure_future(asyncio.to_thread(prewarm))
            self._prewarming.add_done_callback(lambda f: f.cancelled() or f.exception())
        # sandbox user (issue 17): asked for by the config or the task, else the image's.
        requested, user_source = access.requested_user(sb.user, self.task.user)
        if self.lease is None:
            if sb.mode == "owned":  # a task's image built from its Dockerfile (Harbor tasks)
                await ensure_task_image(self.task, self.config, self.run_dir, self.emit)
            self.sandbox = await seed.allocate(
                provider,
                self.config,
                self.task,
                self.run_id,
                endpoint=self.endpoint,
                cache_dir=installer.config.cache_dir,
                requested_user=requested,
                batch_id=self.batch_id,
            )
        assert self.sandbox is not None

        # Failures the provider recovered from without raising go to the event stream (shown, never
        # the outcome), stamped with the stage the episode is in (a provider only knows what failed).
        self.sandbox.on_recovered = self._recovered
        if self.lease is not None and self.lease.seeded is not None:  # decided by the pool, said now
            for event in self.lease.seed_events:
                self.emit(event)
            seeded = self.lease.seeded
        else:
            seeded = await seed.identify(
                self.sandbox, requested, user_source, borrowed=sb.mode == "borrowed", emit=self.emit
            )
        self.sandbox_user = seeded.user
        self._write_info(
            sandbox_user=seeded.user.model_dump(mode="json"),
            sandbox_id=self.sandbox.sandbox_id,
            sandbox_owned=self.sandbox.owned,
        )
        ready = seed.ready(self.sandbox, seeded, self.config)
        self.emit(ready)
        seed.refuse_unenforced(ready, self.config)  # limits.enforce: strict
        await seed.stage(self.sandbox, self.config, self.task, seeded.user, self.endpoint, self._ahead)

        self._enter(Phase.INSTALL)
        if self.lease is not None:
            for event in self.lease.events:  # what its preparation said (cached, ripgrep, ...)
                self.emit(event)
            self.installed = install.prepared(
                self.lease.runtime,
                # A server started ahead has its session directory under the pool's run label.
                run_id=self._ahead.run_id if self._ahead is not None else self.run_id,
                task=self.task,
                config=self.config,
                endpoint=self.endpoint,
                user=seeded.user,
            )
        else:
            self.installed = await install.install(
                self.sandbox,
                installer,
                run_id=self.run_id,
                task=self.task,
                config=self.config,
                endpoint=self.endpoint,
                user=seeded.user,
                emit=self.emit,
            )

        self._enter(Phase.AGENT)
        if self._ahead is not None:  # launched by the pool, waiting for this task: this run's from now
            self.session = self._ahead.session
        else:
            self.session = agent.open_session(
                self.sandbox,
                self.installed,
                run_budget_s=self.run_budget_s,
                close_budget_s=self.config.budgets.close_s,
                user=seeded.user,
                emit=self.emit,
            )
        from opencode_tui_core.debugger.serve_acts import serve_acts

        assert self.debugger is not None
        self.debugger.agent_started(self.run_budget_s, serve_acts(self.sandbox, self.installed))
        if self.child is not None:
            self.child.serve = serve_acts(self.sandbox, self.installed)
        if self.digests is not None:
            layout = self.installed.harness.layout
            self.digests.attach(
                self.sandbox, self.installed.runtime.python, self.task.workdir, layout.session_dir
            )
        await agent.run_agent(
            self.session,
            self.installed,
            task=self.task,
            run_dir=self.run_dir,
            emit=self.emit,
            started_at=self.started_at,
            ahead=self._ahead,
        )

    @property
    def _ahead(self) -> ServerAhead | None:
        return self.lease.server if self.lease is not None else None

    # ---- closing, transcript, verification, release, outcome -------------------------------------

    async def _finish(self, stack: contextlib.AsyncExitStack) -> EpisodeResult:
        # [close budget] one deadline for the whole close, shared with the session (which started it
        # already when a cancel asked the supervisor to stop); each step below gets what remains.
        deadline = self._begin_close()
        self._release_held("the agent phase is over")
        if self.digests is not None:  # its server's terminal goes before the sandbox's close
            await self.digests.close()
        confirmed: bool | None = None
        if self.session is not None:
            assert self.sandbox is not None and self.installed is not None and self.endpoint is not None
            self._enter(Phase.CLOSING)
            self.closed = await close.close(
                self.session,
                self.sandbox,
                deadline=deadline,
                check=close.AgentCheck(
                    run_id=self.run_id,
                    endpoint=self.endpoint,
                    harness=self.installed.harness,
                    run_budget_s=self.run_budget_s,
                    elapsed_s=self.durations.get("agent"),
                    memory_limit_bytes=self.task.limits.memory_bytes,
                    faults=tuple(self.tally.faults),
                ),
                cancelled_agent=(self._cancel is not None and self._cancel.phase is Phase.AGENT)
                or self.stopped_for is not None,
                keep=lambda: self._keep,
                hurried=lambda: self._destroyed_in_hurry,
                last_command=lambda: self.tally.last_command,
                io=self._io(),
            )
            confirmed, self.cleanup_proof = self.closed.confirmed, self.closed.proof
        else:
            self.cleanup_proof = CleanupProof.NOTHING_LAUNCHED
        if confirmed:
            assert self.installed is not None
            self._enter(Phase.TRANSCRIPT)
            await transcript.export_transcript(self.installed.harness, deadline=deadline, io=self._io())
        else:
            self.emit(
                CleanupObserved(
                    step=CleanupStep.TRANSCRIPT_SNAPSHOT,
                    state=StepState.SKIPPED,
                    reason="cleanup was not confirmed" if confirmed is False else "OpenCode never ran",
                )
            )
        # A stopped agent's work is not graded (its outcome is the failure that stopped it).
        if confirmed and self.sandbox is not None and self._cancel is None and self.stopped_for is None:
            self._enter(Phase.VERIFICATION)
            self._verify_task = asyncio.ensure_future(self._verify(deadline))
            # [close budget] verification has its own deadline: the close budget's clock stops.
            with contextlib.suppress(asyncio.CancelledError), deadline.suspended():
                await self._verify_task
        ahead = self._ahead
        if ahead is not None and self.session is not ahead.session and self.sandbox is not None:
            # Started ahead and never given its task (this run ended before its agent phase): its
            # supervisor stops it and confirms (its receipt is this run's record), within the close
            # budget, before the sandbox goes.
            ahead.session.handover(self.emit, None)
            await ahead.stop(max(deadline.remaining(), 1.0))
        self._enter(Phase.RELEASE)
        await self._release(deadline)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stack.aclose(), 10)
        if self.lease is not None:
            if ahead is not None:
                await ahead.joined(5.0)
            self.lease.finished()
        if self._cancel is not None:
            self._record_cancel()
        self._enter(Phase.DONE, state=StepState.OK)
        return self._outcome()

    async def _verify(self, deadline: CloseDeadline) -> None:
        assert self.sandbox is not None and self.installed is not None and self.closed is not None
        self._write_info(verifier_user=verify.verifier_user(self.task, self.sandbox_user))
        verified = await verify.verify(
            self.sandbox,
            task=self.task,
            run_id=self.run_id,
            python=self.installed.runtime.python,
            sandbox_user=self.sandbox_user,
            agent_oom=self.closed.agent_oom,
            deadline=deadline,
            io=self._io(),
        )
        self.reward = verified.reward

    async def _release(self, deadline: CloseDeadline) -> None:
        self._release_started = True
        if self.sandbox is None:
            return
        if self._keep:
            # keep (issue 18): outlive this process, recorded for `attach` and `sweep`.
            run_dir = self.run_dir.path if self.run_dir else None
            if (await release.keep(self.sandbox, self.run_id, run_dir, self._io())).kept and self.info:
                self.info.sandbox_kept = True
            return
        await release.release(
            self.sandbox,
            self.session,
            deadline=deadline,
            io=self._io(),
            # [engine lost] for the record of an engine that the release finds gone
            proof=self.cleanup_proof,
            lost_in=engine_lost.lost_in(list(self._phase_started)),
            engine_lost_recorded=any(r.failure.kind == engine_lost.KIND for r in self.failures),
        )

    @property
    def _proxy(self) -> ModelProxy | None:
        """The episode's recording proxy, once the seed phase started it."""
        return None if self.endpoint is None else self.endpoint.proxy

    def _outcome(self) -> EpisodeResult:
        assert self.run_dir is not None and self.info is not None
        if self.child is not None:
            self.child.finish(complete=self._cancel is None and self.stopped_for is None)
        proxy = self._proxy
        if proxy is not None and proxy.write_error and self.run_dir.write_error is None:
            self.run_dir.note_write_error(proxy.write_error)
        receipt_confirmed = self.cleanup_proof is not None
        cancelled_by = self._cancel.by if self._cancel else None
        verdict = decide_outcome(
            EpisodeFacts(
                failures=self.failures,
                refusal=self.refusal,
                reward=self.reward,
                cleanup_confirmed=receipt_confirmed,
                cancelled_by=cancelled_by,
            )
        )
        self.emit(outcome_event(verdict))
        result = result_of(
            verdict,
            self.tally,
            run_id=self.run_id,
            task_id=self.task.id,
            attempt=self.attempt,
            batch_id=self.batch_id,
            provider=self.config.sandbox.provider,
            sandbox_id=self.sandbox.sandbox_id if self.sandbox else None,
            cleanup_confirmed=receipt_confirmed,
            cleanup_proof=self.cleanup_proof,
            cancelled_by=cancelled_by,
            durations_s=dict(self.durations),
            sandbox_kept=self._keep and self.sandbox is not None,
            warm=self.lease is not None,
            health=self.health.summary() if self.health else {},
            human_intervened=self.human_intervened,
            interventions=len(self.debugger.interventions) if self.debugger else 0,
            artifacts_error=self.run_dir.write_error,
            run_dir=str(self.run_dir.path),
        )
        diagnostic_files = (
            RunFiles.OPENCODE_OUTPUT_LOG,
            RunFiles.OPENCODE_STDERR,
            RunFiles.VERIFY_STDOUT,
            RunFiles.VERIFY_STDERR,
        )
        if proxy is not None and proxy.token_capture is not None:  # model.capture_tokens
            self.info.token_capture = proxy.token_capture.model_copy()
        write_record(self.run_dir, self.info, result, self.tally, self.failures, diagnostic_files, self.emit)
        return result
