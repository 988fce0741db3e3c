"""One episode end to end: seed → install → agent → close (confirmed cleanup) → transcript → verify
→ release → outcome. Every step emits events; every failure becomes a FailureEvent with its stage and
evidence; the outcome policy decides what it means.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core import invocation
from core.artifacts import OutcomeSummary, RunDir, RunInfo, versions
from core.config import AgentConfig
from core.control import CANCELLED_BY_CALLER, CANCELLED_BY_USER, CancelRequest, EpisodeControl
from core.events import (
    CleanupObserved,
    CleanupProof,
    CleanupStep,
    Compaction,
    EpisodeStarted,
    Event,
    EventBus,
    FailureRecorded,
    FailureRecovered,
    ModelCall,
    OutcomeDecided,
    Phase,
    PhaseChanged,
    SandboxReady,
    ShellClosed,
    ShellOpened,
    StepState,
    TerminalOutput,
    ToolCall,
    TranscriptStats,
    VerificationFinished,
    Warning_,
)
from core.failures import (
    DEFAULT_CLASSIFICATION,
    DEFAULT_POLICY,
    CleanupDetails,
    DeadlineDetails,
    Decision,
    Evidence,
    FailureEvent,
    FailureStage,
    GenericDetails,
    decide,
    merged,
    merged_classification,
)
from core.outcome import (
    AgentFacts,
    EpisodeFacts,
    Outcome,
    RecordedFailure,
    VerifierRun,
    agent_failure,
    decide_outcome,
    verifier_verdict,
)
from core.runtime.verify_wrapper import VERIFY_WRAPPER_SOURCE, read_verify_status
from core.sandbox.base import (
    LABEL_OWNER,
    LABEL_RUN,
    ExpectedRefusal,
    PtyHandle,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    SandboxProbe,
    SandboxProvider,
    SandboxSpec,
    default_owner,
)
from core.session import CleanupUnconfirmed, CloseDeadline, SandboxSession
from core.shells import RecordedShell
from core.tasks import Task
from core.tokens import token_totals


class EpisodeResult(BaseModel):
    """One episode's result; also the batch JSON line."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    task_id: str
    attempt: int
    provider: str
    sandbox_id: str | None = None
    reward: float | None = None
    action: Outcome
    failure_kind: str | None = None
    failure_stage: str | None = None
    failure_class: str | None = None
    cleanup_confirmed: bool | None = None
    cleanup_proof: CleanupProof | None = None
    cancelled_by: str | None = None
    model_calls: int = 0
    tool_calls: int = 0
    compactions: int = 0
    # tokens: every model call the proxy recorded (title included); agent tokens: the transcript's.
    # Unknown is null, never 0.
    tokens_in: int | None = None
    tokens_out: int | None = None
    agent_tokens_in: int | None = None
    agent_tokens_out: int | None = None
    exit_code: int = 0
    durations_s: dict[str, float] = Field(default_factory=dict)
    run_dir: str
    summary: str = ""
    previous_attempts: list[str] = Field(default_factory=list)
    resumed: bool = False
    started: bool = True  # false: a queued episode a cancelled batch never started
    human_intervened: bool = False  # a person used a shell in the sandbox before verification finished
    artifacts_error: str | None = None  # the run directory stopped taking writes: what and why
    sandbox_kept: bool = False

    @property
    def scored(self) -> bool:
        return self.action.is_sample


def new_run_id(task_id: str, attempt: int = 1) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{task_id}-{stamp}-{uuid.uuid4().hex[:6]}-a{attempt}"


class StageFailure(Exception):
    """A step failed in a way that ends the agent part of the episode; carries the FailureEvent."""

    def __init__(self, failure: FailureEvent) -> None:
        super().__init__(failure.message)
        self.failure = failure


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
        installer: Any = None,
        bus: EventBus | None = None,
    ) -> None:
        self.task = task
        self.config = config
        self.attempt = attempt
        self.run_id = run_id or new_run_id(task.id, attempt)
        self.runs_dir = Path(runs_dir or config.runs_dir)
        self.bus = bus or EventBus(attempt=attempt)
        self._provider = provider
        self._installer = installer
        self.policy = merged(DEFAULT_POLICY, config.policy)
        self.classification = merged_classification(DEFAULT_CLASSIFICATION, config.classification)
        self.run_dir: RunDir | None = None
        self.sandbox: Sandbox | None = None
        self.session: SandboxSession | None = None
        self.failures: list[RecordedFailure] = []
        self._keep = config.sandbox.keep_sandbox
        self._cancel: CancelRequest | None = None
        self._graceful_stop: asyncio.Future[Any] | None = None
        self._destroyed_in_hurry = False
        self.close_deadline: CloseDeadline | None = None  # [close budget] fixed when the close starts
        self.cleanup_proof: CleanupProof | None = None
        self._last_command: str | None = None  # the agent's last bash command (for the record)
        self._shells = 0
        self._release_started = False
        self.human_intervened = False
        self._agent_task: asyncio.Task[Any] | None = None
        self._verify_task: asyncio.Task[Any] | None = None
        self._done = asyncio.Event()
        self._result: EpisodeResult | None = None
        self._phase_started: dict[str, float] = {}
        self.durations: dict[str, float] = {}
        self.counts: dict[str, Any] = {"model_calls": 0, "tool_calls": {}, "compactions": 0}
        self.model_calls: list[ModelCall] = []
        self.runtime: Any = None  # PreparedRuntime, once the install phase placed it
        self._agent_oom: set[tuple[str, str]] = set()  # OOM evidence already seen after the agent
        self.receipt_confirmed: bool | None = None
        self.refusal: str | None = None  # set when the provider refused before launch (no failure)
        self.endpoint: Any = None  # ModelEndpoint, once the seed phase started it
        self.harness: Any = None  # OpenCodeHarness, once the install phase built it
        self.agent_result: Any = None  # the harness exec's ExecResult
        self.reward: float | None = None
        self.info: RunInfo | None = None
        self.sandbox_user: Any = None  # SandboxUser, decided once in the seed phase (core.runtime.access)
        self._phase: Phase = Phase.ADMISSION

    # ---- control API ---------------------------------------------------------------------------

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

    def _after_graceful_stop(self, stop: asyncio.Future[Any]) -> None:
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
                await asyncio.wait_for(self.sandbox.release(), self.config.budgets.close_s)
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

    def _human_intervened(self, phase: Phase) -> None:
        """Once per episode: the run.json flag, and a failure (or, if the policy scores such runs, a
        warning) so the outcome cannot be a clean sample without saying so."""
        if self.human_intervened:
            return
        self.human_intervened = True
        if self.info is not None and self.run_dir is not None:
            self.info.human_intervened = True
            self.run_dir.write_run_info(self.info)
        message = f"a person opened a shell in the sandbox during {phase.value}, before verification finished"
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
                stage=self._stage_of(phase),
                operation="interactive shell",
                message=message,
            )
        )

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
        self.emit(PhaseChanged(phase=phase, state=state, detail=detail))
        if self.info is not None and self.run_dir is not None:
            self.info.phase = phase.value
            self.info.phase_durations_s = dict(self.durations)
            self.run_dir.write_run_info(self.info)

    def record_failure(self, failure: FailureEvent) -> Decision:
        decision = self._decide(failure)
        self.failures.append(RecordedFailure(failure=failure, decision=decision))
        self.emit(FailureRecorded(failure=failure, decision=decision))
        return decision

    def _decide(self, failure: FailureEvent) -> Decision:
        return decide(failure, attempt=self.attempt, policy=self.policy, classification=self.classification)

    def _cleanup_step_failed(
        self, step: CleanupStep, exc: BaseException, kind: str, stage: FailureStage, operation: str
    ) -> None:
        """A cleanup-side step failed: show it in the cleanup panel and record it as a failure."""
        self.emit(CleanupObserved(step=step, state=StepState.FAILED, reason=str(exc)))
        if not self._run_dir_full(exc):
            self.record_failure(self._failure_from(exc, kind, stage, operation))

    def _run_dir_full(self, exc: BaseException) -> bool:
        """An error writing the run directory itself (disk full, read-only) is said as what it is."""
        if self.run_dir is None or not (isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS):
            return False
        self.run_dir.write_failed(exc.filename or self.run_dir.path, exc)
        return True

    def _count(self, event: Event) -> None:
        if isinstance(event, ModelCall):
            self.counts["model_calls"] += 1
            self.model_calls.append(event)
        elif isinstance(event, ToolCall) and event.status == "running":
            command = event.input.get("command")
            if isinstance(command, str):
                self._last_command = command[:200]
        elif isinstance(event, ToolCall):
            tools = self.counts["tool_calls"]
            tools[event.tool] = tools.get(event.tool, 0) + 1
        elif isinstance(event, Compaction):
            self.counts["compactions"] = max(self.counts["compactions"], event.count)
        elif isinstance(event, TranscriptStats):
            # The transcript snapshot is the source of truth for counts.
            self.counts["tool_calls"] = dict(event.tool_calls)
            self.counts["compactions"] = event.compactions
            self.counts["agent_tokens_in"] = event.tokens_in
            self.counts["agent_tokens_out"] = event.tokens_out

    # ---- the episode ---------------------------------------------------------------------------

    async def run(self) -> EpisodeResult:
        try:
            self._result = await self._run()
            return self._result
        finally:
            self._done.set()

    def _secrets(self) -> tuple[str, ...]:
        import os

        env = self.config.model.api_key_env
        value = os.environ.get(env) if env else None
        return (value,) if value else ()

    def _start_run_dir(self) -> None:
        self.run_dir = RunDir.create(self.runs_dir, self.run_id, secrets=self._secrets())
        self.run_dir.on_write_error = self._artifacts_failed
        self.bus.subscribe(self.run_dir.append_event)
        self.bus.subscribe(self._count)
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
            provider=self.config.sandbox.provider,
            config=self.config.model_dump(mode="json"),
            versions=versions(self.config.runtime.opencode_version),
            controller=invocation.invocation_id(),
        )
        self.run_dir.write_run_info(self.info)

    @property
    def run_budget_s(self) -> float:
        cap = self.task.limits.run_s
        return min(self.config.budgets.run_s, cap) if cap else self.config.budgets.run_s

    def _artifacts_failed(self, message: str) -> None:
        """The run directory stopped taking writes (a full or read-only disk): the episode goes on
        and closes its sandbox; the record it could not finish is not a trustworthy sample."""
        self.record_failure(
            FailureEvent(
                kind="artifacts_write_failed",
                stage=self._stage_of(self._phase),
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
        self.emit(
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
        )
        stack = contextlib.AsyncExitStack()
        self._agent_task = asyncio.ensure_future(self._work(stack))
        try:
            await self._agent_task
        except asyncio.CancelledError:
            if self._cancel is None:  # the caller's task was cancelled, not through cancel()
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
                self._failure_from(
                    exc,
                    _UNEXPECTED_KIND.get(self._phase, "agent_bootstrap_failed"),
                    self._stage_of(self._phase),
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
                stage=self._stage_of(c.phase),
                operation=f"{c.phase.value} phase",
                message=f"{c.words} during {c.phase.value}",
                details=GenericDetails(data={"by": c.by, "phase": c.phase.value}),
            )
        )

    @staticmethod
    def _stage_of(phase: Phase) -> FailureStage:
        """The failure stage of an episode phase (each phase is its own stage; done counts as release)."""
        return FailureStage.RELEASE if phase is Phase.DONE else FailureStage(phase.value)

    async def _work(self, stack: contextlib.AsyncExitStack) -> None:
        from core.model.endpoint import ModelEndpoint
        from core.runtime import access
        from core.runtime.opencode import OpenCodeHarness
        from core.runtime.prepare import RUNTIME_CACHE_MOUNT, RuntimeNotReady, prepare_runtime
        from core.sandbox.base import Mount
        from core.sandbox.providers import get_provider

        # ---- seed: model endpoint, sandbox, task files ----
        self._enter(Phase.SEED)
        self.endpoint = await stack.enter_async_context(
            ModelEndpoint(self.task, self.config.model, self.run_dir.path, on_call=self.emit)
        )
        provider = self._provider or get_provider(self.config.sandbox.provider, self.config)
        installer = self._installer or _default_installer(self.config)
        self._installer = installer
        sb = self.config.sandbox
        # ---- sandbox user (issue 17): asked for by the config or the task, else the image's ----
        requested, user_source = access.requested_user(sb.user, self.task.user)
        # The cache is bind-mounted read-only into owned sandboxes; it must exist before the mount.
        Path(installer.config.cache_dir).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
        try:
            if sb.mode == "borrowed":
                assert sb.sandbox_id is not None
                self.sandbox = await provider.connect(sb.sandbox_id)
            else:
                spec = SandboxSpec(
                    run_id=self.run_id,
                    image=sb.image or self.task.image,
                    workdir=self.task.workdir,
                    memory_bytes=self.task.limits.memory_bytes,
                    cpus=self.task.limits.cpus,
                    network=sb.network,
                    model_socket=self.endpoint.unix_path if sb.network == "model-only" else None,
                    mounts=[Mount(source=str(installer.config.cache_dir), target=RUNTIME_CACHE_MOUNT)],
                    user=requested,
                    labels={
                        LABEL_RUN: self.run_id,
                        LABEL_OWNER: default_owner(),
                        "opencode-tui.task": self.task.id,
                    },
                )
                self.sandbox = await provider.create(spec)
        except ExpectedRefusal:
            raise
        except SandboxError as exc:
            raise StageFailure(
                self._failure_from(exc, "sandbox_allocation_failed", FailureStage.SEED, "create sandbox")
            ) from exc
        # Failures the provider recovered from without raising go to the event stream (shown, never
        # the outcome).
        self.sandbox.on_recovered = lambda failure, how: self.emit(
            FailureRecovered(failure=failure, recovery=how)
        )
        status = await self.sandbox.status()
        assert self.info is not None and self.run_dir is not None
        # ---- sandbox user (issue 17): who it is, recorded in run.json and SandboxReady ----
        try:
            user = self.sandbox_user = await access.establish_user(
                self.sandbox, requested, user_source, borrowed=sb.mode == "borrowed", emit=self.emit
            )
        except SandboxError as exc:
            raise StageFailure(
                self._failure_from(exc, "command_failed", FailureStage.SEED, "identify the sandbox user")
            ) from exc
        self.info.sandbox_user = user.model_dump(mode="json")
        # ---- end sandbox user ----
        self.info.sandbox_id, self.info.sandbox_owned = self.sandbox.sandbox_id, self.sandbox.owned
        self.run_dir.write_run_info(self.info)
        self.emit(
            SandboxReady(
                sandbox_id=self.sandbox.sandbox_id,
                provider=self.sandbox.provider,
                owned=self.sandbox.owned,
                network=sb.network.value,
                memory_limit_enforced=status.memory_limit_enforced,
                notes=status.notes,
                user=user.label,
                uid=user.uid,
                gid=user.gid,
                user_source=user.source,
            )
        )
        # ---- sandbox user (issue 17): task files, workdir and model socket its own; preflight ----
        socket = self.endpoint.unix_path if sb.network == "model-only" and sb.mode == "owned" else None
        try:
            await access.stage_inputs(self.sandbox, self.task.files_dir, self.task.workdir, user, socket)
        except access.SandboxPermissionDenied as exc:
            raise StageFailure(exc.failure) from exc
        except SandboxError as exc:
            raise StageFailure(
                self._failure_from(exc, "sandbox_file_failed", FailureStage.SEED, "copy task files")
            ) from exc
        # ---- end sandbox user ----

        # ---- install: the pinned OpenCode, checked in the sandbox ----
        self._enter(Phase.INSTALL)
        harness = OpenCodeHarness(self.run_id, self.task, self.config, self.endpoint)
        harness.owner = user.ids  # sandbox user (issue 17)
        try:
            runtime = await asyncio.wait_for(
                prepare_runtime(
                    self.sandbox,
                    installer,
                    harness.layout,
                    emit=self.emit,
                    version=self.config.runtime.opencode_version,
                ),
                self.config.budgets.install_s,
            )
        except TimeoutError as exc:
            raise StageFailure(
                FailureEvent(
                    kind="install_timeout",
                    stage=FailureStage.INSTALL,
                    operation="install opencode",
                    message=f"installing OpenCode did not finish within {self.config.budgets.install_s:g}s",
                    details=DeadlineDetails(budget_s=self.config.budgets.install_s),
                )
            ) from exc
        except RuntimeNotReady as exc:
            # [install causes] a provider's failure keeps its kind, cause and evidence; stage: install.
            raise StageFailure(
                self._failure_from(exc, "install_failed", FailureStage.INSTALL, "install opencode")
            ) from exc
        self.runtime = runtime

        # ---- agent: OpenCode under the supervisor ----
        self._enter(Phase.AGENT)
        self.session = SandboxSession(
            self.sandbox,
            harness.layout.session_dir,
            run_timeout_s=self.run_budget_s,
            close_timeout_s=self.config.budgets.close_s,
            python=runtime.python,
            emit=self.emit,
            owner=user.ids,  # sandbox user (issue 17)
        )
        self.harness = harness
        argv, env = harness.command(runtime)
        self.agent_result = await self.session.execute(
            argv,
            stage=harness.stage,
            collect=self._collect,
            stdin=harness.prompt_bytes(),
            env=env,
            cwd=self.task.workdir,
            on_output=harness.on_output(self.emit, self.run_dir),
        )
        harness.flush(self.emit)

    async def _collect(self, sandbox: Sandbox, receipt: Any) -> None:
        """After confirmed cleanup only: bring OpenCode's database and logs into the run directory."""
        assert self.run_dir is not None
        await self.harness.collect(sandbox, self.run_dir)

    @staticmethod
    def _failure_from(exc: BaseException, kind: str, stage: FailureStage, operation: str) -> FailureEvent:
        """The exception's typed failure (a provider's), stamped with the stage the episode was in.

        A provider knows what failed, not what the episode was doing: an OOM or a lost sandbox during
        verification is a grading failure, not the agent's.
        """
        failure = getattr(exc, "failure", None)
        if isinstance(failure, FailureEvent):
            return failure if failure.stage is stage else failure.model_copy(update={"stage": stage})
        return FailureEvent.from_exception(exc, kind=kind, stage=stage, operation=operation)

    # ---- closing, transcript, verification, release, outcome -------------------------------------

    async def _finish(self, stack: contextlib.AsyncExitStack) -> EpisodeResult:
        # [close budget] one deadline for the whole close, shared with the session (which started it
        # already when a cancel asked the supervisor to stop); each step below gets what remains.
        self.close_deadline = (
            self.session.begin_close()
            if self.session is not None
            else CloseDeadline(self.config.budgets.close_s)
        )
        confirmed: bool | None = None
        if self.session is not None:
            self._enter(Phase.CLOSING)
            receipt = None
            try:
                receipt = await self.session.finalize()
                confirmed = True
                self.cleanup_proof = CleanupProof.RECEIPT
            except CleanupUnconfirmed as exc:
                confirmed = False
                await self._confirm_by_destruction(exc)
            cancelled_agent = self._cancel is not None and self._cancel.phase is Phase.AGENT
            # A run we stopped ourselves says nothing through its exit; its OOM evidence still counts.
            if self.session.launch_started and (not cancelled_agent or receipt is None):
                await self._analyse_agent(receipt)
            if self.session.collect_error is not None and not self._run_dir_full(self.session.collect_error):
                self.record_failure(
                    self._failure_from(
                        self.session.collect_error,
                        kind="transcript_export_failed",
                        stage=FailureStage.TRANSCRIPT,
                        operation="collect OpenCode database and logs",
                    )
                )
        if self.session is None:
            self.cleanup_proof = CleanupProof.NOTHING_LAUNCHED
        self.receipt_confirmed = self.cleanup_proof is not None
        if confirmed:
            self._enter(Phase.TRANSCRIPT)
            await self._transcript()
        else:
            self.emit(
                CleanupObserved(
                    step=CleanupStep.TRANSCRIPT_SNAPSHOT,
                    state=StepState.SKIPPED,
                    reason="cleanup was not confirmed" if confirmed is False else "OpenCode never ran",
                )
            )
        if confirmed and self.sandbox is not None and self._cancel is None:
            self._enter(Phase.VERIFICATION)
            self._verify_task = asyncio.ensure_future(self._verify())
            # [close budget] verification has its own deadline: the close budget's clock stops.
            with contextlib.suppress(asyncio.CancelledError), self.close_deadline.suspended():
                await self._verify_task
        self._enter(Phase.RELEASE)
        await self._release()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stack.aclose(), 10)
        if self._cancel is not None:
            self._record_cancel()
        self._enter(Phase.DONE, state=StepState.OK)
        return self._outcome()

    async def _confirm_by_destruction(self, exc: CleanupUnconfirmed) -> None:
        """No positive receipt: an owned sandbox is destroyed now, and its death is the proof (a
        destroyed container or PID namespace holds no process). A borrowed or kept one stays
        unconfirmed, and the record says so."""
        assert self.session is not None and self.sandbox is not None
        why = self._why_unconfirmed(exc)
        lost = None if self._destroyed_in_hurry else await self._engine_lost(exc)  # [engine lost]
        if self.sandbox.owned and not self._keep:
            try:
                await self.session.release()  # [close budget] bounded by the session's close deadline
            except Exception as release_exc:
                why = f"{why}; destroying the sandbox failed too: {release_exc}"
            else:
                self.cleanup_proof = (
                    self.cleanup_proof or CleanupProof.DESTROYED
                )  # [engine lost] found dead first
        if lost is not None:  # [engine lost]
            self._record_engine_lost(lost, why)
            if self.cleanup_proof is not None:
                return
        elif self.cleanup_proof is CleanupProof.DESTROYED:
            if not self._destroyed_in_hurry:
                self.record_failure(
                    FailureEvent.from_exception(
                        exc,
                        kind="supervisor_lost",
                        stage=FailureStage.CLOSING,
                        operation="stop and confirm",
                        message=f"{why}; cleanup was proven by destroying the sandbox",
                        details=CleanupDetails(receipt=None, fallback="sandbox destroyed"),
                    )
                )
            return
        self.record_failure(
            FailureEvent.from_exception(
                exc,
                kind="cleanup_unconfirmed",
                stage=FailureStage.CLOSING,
                operation="stop and confirm",
                message=why,
                details=CleanupDetails(
                    receipt=None, fallback=None if self.sandbox.owned else "borrowed: never destroyed"
                ),
            )
        )

    # ---- engine lost (issue 19): the engine under the sandbox went away mid-episode ----

    async def _engine_lost(self, exc: BaseException, *, for_release: bool = False) -> EngineLoss | None:
        """Whether the sandbox's engine went away: a request (the stop, the release) could not reach
        it, or (local) the keeper was killed from outside. An unreachable engine is waited for
        within the close budget (``for_release``: all that is left, else what remains before the
        release's reserve), so that what is owned can still be released; then it is asked whether
        the sandbox is dead: a dead container or namespace is the proof of cleanup."""
        assert self.sandbox is not None and self.close_deadline is not None
        deadline = self.close_deadline
        unreachable = _unreachable_cause(exc)
        probes: list[SandboxProbe] = []
        waited = time.monotonic()
        while True:
            left = deadline.remaining(for_release=for_release)
            try:
                probe = await self.sandbox.probe(timeout=max(min(5.0, left), 0.5))
            except Exception as probe_exc:  # a probe that fails says nothing: the old path decides
                self.emit(Warning_(code="probe_failed", message=f"could not probe the sandbox: {probe_exc}"))
                return None
            probes.append(probe)
            left = deadline.remaining(for_release=for_release)
            if probe.engine_reachable or left <= 0.0:
                break
            await asyncio.sleep(min(0.5, left))
        if unreachable is None and len(probes) == 1 and not probe.engine_lost:
            return None  # the engine answered all along: not an engine loss
        if probe.dead and self.cleanup_proof is None:
            self.cleanup_proof = CleanupProof.FOUND_DEAD
            self.emit(
                CleanupObserved(
                    step=CleanupStep.RECEIPT,
                    state=StepState.OK,
                    reason=f"no receipt, but the sandbox is dead: {probe.detail}",
                    data={"proof": CleanupProof.FOUND_DEAD.value},
                )
            )
        return EngineLoss(
            unreachable=unreachable,
            probes=probes,
            waited_s=round(time.monotonic() - waited, 3),
            back=probe.engine_reachable,
        )

    async def _release_after_engine(self, exc: BaseException) -> bool:
        """The release could not reach the engine: wait for it within the close budget and release
        again. True when the sandbox was released after all."""
        if self.sandbox is None or _unreachable_cause(exc) is None:
            return False
        lost = await self._engine_lost(exc, for_release=True)
        released = False
        if lost is not None and lost.back:
            try:
                if self.session is not None:
                    await self.session.release()  # [close budget] what the close deadline has left
                else:
                    assert self.close_deadline is not None
                    await self.close_deadline.run(self.sandbox.release(), step="release", for_release=True)
                    self.emit(
                        CleanupObserved(
                            step=CleanupStep.SANDBOX_RELEASED,
                            state=StepState.OK,
                            data={"owned": self.sandbox.owned, "after_engine_returned": True},
                        )
                    )
                released = True
            except Exception as again:
                exc = again
        if lost is not None and not any(r.failure.kind == "sandbox_engine_lost" for r in self.failures):
            released_said = (
                "the sandbox was released once it answered" if released else f"release failed: {exc}"
            )
            if self.cleanup_proof is CleanupProof.RECEIPT and released:
                # The run itself was unaffected (its receipt came, its grade stands): only the
                # release had to wait. Said, not a failure.
                self.emit(
                    Warning_(
                        code="engine_lost_at_release",
                        message=f"the {self.sandbox.provider} engine was away at release "
                        f"({lost.unreachable}); {released_said} after {lost.waited_s:g}s",
                    )
                )
            else:
                self._record_engine_lost(lost, released_said)
        return released

    def _lost_in(self) -> FailureStage:
        """The stage the episode was working in when its close began (the engine went away then)."""
        work = [p for p in self._phase_started if p in ("admission", "seed", "install", "agent")]
        return FailureStage(work[-1]) if work else FailureStage.SEED

    def _record_engine_lost(self, lost: EngineLoss, why: str) -> None:
        assert self.sandbox is not None
        last = lost.probes[-1]
        engine = f"the {self.sandbox.provider} engine"
        if lost.unreachable is None:
            said = last.detail  # a restart already over, or (local) the keeper killed
        elif lost.back:
            said = (
                f"{engine} went away ({lost.unreachable}); it answered again after {lost.waited_s:g}s: "
                f"{last.detail}"
            )
        else:
            said = (
                f"{engine} went away ({lost.unreachable}) and did not answer again within the close "
                f"budget ({lost.waited_s:g}s waited)"
            )
        fallback = (
            {
                CleanupProof.FOUND_DEAD: "sandbox found dead",
                CleanupProof.DESTROYED: "sandbox destroyed",
                CleanupProof.NOTHING_LAUNCHED: "nothing launched",
            }.get(self.cleanup_proof)
            if self.cleanup_proof is not None
            else None
        )
        proof = f"cleanup is proven ({fallback})" if fallback else "cleanup is not confirmed"
        # The first probe (the engine gone) and the last (what it said once back) are the evidence.
        shown = lost.probes if len(lost.probes) < 3 else [lost.probes[0], lost.probes[-1]]
        self.record_failure(
            FailureEvent(
                kind="sandbox_engine_lost",
                stage=self._lost_in(),
                operation="stop and confirm" if self.session is not None else "release",
                message=f"{said}; {proof} ({why})"[:2000],
                evidence=[e for p in shown for e in p.evidence],
                details=CleanupDetails(receipt=None, fallback=fallback),
            )
        )

    # ---- end engine lost ----

    def _why_unconfirmed(self, exc: CleanupUnconfirmed) -> str:
        """One line on why there is no receipt, naming the agent's last command when it ran one."""
        if self._destroyed_in_hurry:
            return "the close was hurried: the sandbox was destroyed before the receipt arrived"
        last = self._last_command or self._last_requested_command()
        return f"{exc} (while the agent ran `{last}`)" if last else str(exc)

    def _last_requested_command(self) -> str | None:
        """The last shell command the model asked for, as the proxy recorded it: when the agent kills
        its own supervisor, the live event for that command may never have left the sandbox."""
        import json

        from core.model.records import assembled_tool_calls

        records = self.endpoint.records if self.endpoint is not None else []
        for record in reversed(records):
            for name, args in reversed(assembled_tool_calls(record.response_body)):
                try:
                    command = json.loads(args).get("command") if name == "bash" else None
                except (ValueError, AttributeError):
                    command = None
                if isinstance(command, str):
                    return command[:200]
        return None

    async def _oom_evidence(self) -> list[Evidence]:
        """The provider's structured evidence about this sandbox (bounded; best effort)."""
        if self.sandbox is None:
            return []
        try:
            # [close budget] within what the close has left; not started once it is spent.
            deadline = self.close_deadline or CloseDeadline(self.config.budgets.close_s)
            return await deadline.run(self.sandbox.inspect(), step="inspect the sandbox", cap=15)
        except Exception as exc:  # diagnosis is best effort and bounded
            self.emit(Warning_(code="inspect_failed", message=f"could not inspect the sandbox: {exc}"))
            return []

    async def _analyse_agent(self, receipt: Any) -> None:
        """Turn provider evidence, the receipt and the model calls into at most one agent failure."""
        from core.sandbox.oom import oom_evidence

        evidence = await self._oom_evidence()
        # Remember what was already confirmed, so an OOM during verification is told apart.
        self._agent_oom = {_evidence_key(e) for e in oom_evidence(evidence)}
        failed_call = self.endpoint.last_failed_call()
        failure = agent_failure(
            AgentFacts(
                run_id=self.run_id,
                receipt=receipt,
                evidence=evidence,
                finished_cleanly=self.harness.finished_cleanly,
                last_error=self.harness.last_error,
                failed_model_call=failed_call.to_failure(FailureStage.AGENT) if failed_call else None,
                permission_rejected=self.harness.permission_failure(),
                run_budget_s=self.run_budget_s,
                elapsed_s=self.durations.get("agent"),
                memory_limit_bytes=self.task.limits.memory_bytes,
            )
        )
        if failure is not None:
            self.record_failure(failure)

    async def _transcript(self) -> None:
        assert self.run_dir is not None
        try:
            assert self.close_deadline is not None  # [close budget]
            stats = await self.close_deadline.run(
                asyncio.to_thread(self.harness.export_transcript, self.run_dir), step="export the transcript"
            )
        except Exception as exc:
            self._cleanup_step_failed(
                CleanupStep.TRANSCRIPT_SNAPSHOT,
                exc,
                "transcript_export_failed",
                FailureStage.TRANSCRIPT,
                "export transcript",
            )
            return
        self.emit(
            CleanupObserved(
                step=CleanupStep.TRANSCRIPT_SNAPSHOT, state=StepState.OK, data={"messages": stats.messages}
            )
        )
        self.emit(stats)

    async def _verify(self) -> None:
        from core.sandbox.tarsafe import directory_tar

        assert self.sandbox is not None and self.run_dir is not None
        v = self.task.verify
        started = time.monotonic()
        # The wrapper reports how the verifier ended (an exit code or a signal) in a status file: a
        # shell's 128+N cannot be told apart from `exit 128+N`, and a killed grader is no grade.
        status_path = f"/tmp/.opencode-tui-verify-{self.run_id}.json"
        python = self.runtime.python if self.runtime is not None else "python3"
        # sandbox user (issue 17): hidden tests are the user's; the verifier runs as it unless the
        # task says `verify.user` (e.g. root for Harbor tasks), and the record says who ran it.
        owner = self.sandbox_user.ids if self.sandbox_user is not None else None
        verifier = v.user or (self.sandbox_user.label if self.sandbox_user is not None else None)
        if self.info is not None and self.run_dir is not None:
            self.info.verifier_user = verifier
            self.run_dir.write_run_info(self.info)
        try:
            if self.task.verify_files_dir is not None:
                await self.sandbox.upload_tar(
                    self.task.workdir, directory_tar(self.task.verify_files_dir, owner=owner)
                )
            result = await self.sandbox.exec(
                [python, "-c", VERIFY_WRAPPER_SOURCE, v.command, status_path],
                cwd=self.task.workdir,
                timeout=v.timeout,
                user=v.user,
            )
        except Exception as exc:  # a lost sandbox, a failed upload, or a bug: the grade is inconclusive
            self.record_failure(
                self._failure_from(exc, "verifier_error", FailureStage.VERIFICATION, "run verifier")
            )
            return
        out = result.stdout.decode("utf-8", "replace")
        err = result.stderr.decode("utf-8", "replace")
        self.run_dir.write_text("verify/stdout.log", out)
        self.run_dir.write_text("verify/stderr.log", err)
        exit_code, signal = result.exit_code, result.signal
        if result.observed:
            exit_code, signal = await read_verify_status(self.sandbox, status_path, result)
        reward_text = reward_error = None
        if v.reward_file and result.observed and signal is None and exit_code is not None:
            path = v.reward_file if v.reward_file.startswith("/") else f"{self.task.workdir}/{v.reward_file}"
            try:
                reward_text = (await self.sandbox.download_file(path)).decode("utf-8", "replace")
            except Exception as exc:
                reward_error = f"{type(exc).__name__}: {exc}"
        run = VerifierRun(
            exit_code=exit_code,
            signal=signal,
            observed=result.observed,
            deadline_fired=result.deadline_expired,
            timeout_s=v.timeout,
            duration_s=round(time.monotonic() - started, 3),
            output_excerpt=(out + err)[-2000:],
            reward_file=v.reward_file,
            reward_text=reward_text,
            reward_error=reward_error,
        )
        verdict = verifier_verdict(run)
        self.reward = verdict.reward
        self.emit(
            VerificationFinished(
                exit_code=run.exit_code,
                reward=verdict.reward,
                passed=verdict.passed,
                duration_s=run.duration_s or 0.0,
                output_excerpt=run.output_excerpt,
                user=verifier,
            )
        )
        if verdict.failure is None:
            return
        # A grader that died may have been OOM-killed: say so when the provider confirms it.
        from core.sandbox.oom import oom_evidence

        fresh = [
            e for e in oom_evidence(await self._oom_evidence()) if _evidence_key(e) not in self._agent_oom
        ]
        if fresh:
            self.record_failure(
                FailureEvent(
                    kind="provider_oom_killed",
                    stage=FailureStage.VERIFICATION,
                    operation="run verifier",
                    message=f"the kernel OOM-killed the verifier (confirmed by {fresh[0].source}); "
                    "the grade is inconclusive",
                    evidence=fresh,
                )
            )
        else:
            self.record_failure(verdict.failure)

    async def _release(self) -> None:
        self._release_started = True
        if self.sandbox is None:
            return
        if self._keep:
            # ---- keep (issue 18): outlive this process, recorded for `attach` and `sweep` ----
            from core.sandbox.kept import keep_for_later

            try:
                await keep_for_later(self.sandbox, self.run_id, self.run_dir.path if self.run_dir else None)
                if self.info is not None:
                    self.info.sandbox_kept = True
            except Exception as exc:
                self.emit(Warning_(code="keep_failed", message=f"the sandbox could not be kept: {exc}"))
            self.emit(
                CleanupObserved(
                    step=CleanupStep.SANDBOX_RELEASED,
                    state=StepState.SKIPPED,
                    reason=f"kept for debugging: {self.sandbox.provider} {self.sandbox.sandbox_id}",
                )
            )
            return
        try:
            if self.session is not None:
                await self.session.release()  # [close budget] bounded by the session's close deadline
            else:
                assert self.close_deadline is not None  # [close budget]
                await self.close_deadline.run(self.sandbox.release(), step="release", for_release=True)
                self.emit(
                    CleanupObserved(
                        step=CleanupStep.SANDBOX_RELEASED,
                        state=StepState.OK,
                        data={"owned": self.sandbox.owned},
                    )
                )
        except Exception as exc:
            if await self._release_after_engine(exc):  # [engine lost]
                return
            self._cleanup_step_failed(
                CleanupStep.SANDBOX_RELEASED,
                exc,
                "sandbox_release_failed",
                FailureStage.RELEASE,
                "release sandbox",
            )

    def _outcome(self) -> EpisodeResult:
        assert self.run_dir is not None and self.info is not None
        proxy = getattr(self.endpoint, "proxy", None)
        if proxy is not None and proxy.write_error and self.run_dir.write_error is None:
            self.run_dir.note_write_error(proxy.write_error)
        verdict = decide_outcome(
            EpisodeFacts(
                failures=self.failures,
                refusal=self.refusal,
                reward=self.reward,
                cleanup_confirmed=self.receipt_confirmed,
                cancelled_by=self._cancel.by if self._cancel else None,
            )
        )
        deciding = verdict.deciding
        failure = deciding.failure if deciding else None
        decision = deciding.decision if deciding else None
        self.emit(
            OutcomeDecided(
                action=verdict.outcome,
                reward=verdict.reward,
                failure_kind=failure.kind if failure else None,
                failure_class=decision.failure_class if decision else None,
                summary=verdict.summary,
                evidence=list(failure.evidence) if failure else [],
            )
        )
        tools = self.counts.get("tool_calls", {})
        tokens = token_totals(self.model_calls)
        result = EpisodeResult(
            run_id=self.run_id,
            task_id=self.task.id,
            attempt=self.attempt,
            provider=self.config.sandbox.provider,
            sandbox_id=self.sandbox.sandbox_id if self.sandbox else None,
            reward=verdict.reward,
            action=verdict.outcome,
            failure_kind=failure.kind if failure else None,
            failure_stage=failure.stage.value if failure else None,
            failure_class=decision.failure_class.value if decision else None,
            cleanup_confirmed=self.receipt_confirmed,
            cleanup_proof=self.cleanup_proof,
            cancelled_by=self._cancel.by if self._cancel else None,
            model_calls=self.counts.get("model_calls", 0),
            tool_calls=sum(tools.values()),
            compactions=self.counts.get("compactions", 0),
            tokens_in=tokens.tokens_in,
            tokens_out=tokens.tokens_out,
            agent_tokens_in=self.counts.get("agent_tokens_in"),
            agent_tokens_out=self.counts.get("agent_tokens_out"),
            exit_code=verdict.exit_code,
            durations_s=dict(self.durations),
            sandbox_kept=self._keep and self.sandbox is not None,
            human_intervened=self.human_intervened,
            artifacts_error=self.run_dir.write_error,
            run_dir=str(self.run_dir.path),
            summary=verdict.summary,
        )
        self.info.ended_at = datetime.now(UTC)
        self.info.phase_durations_s = dict(self.durations)
        self.info.outcome = OutcomeSummary(
            action=verdict.outcome,
            reward=verdict.reward,
            failure_kind=result.failure_kind,
            failure_stage=result.failure_stage,
            failure_class=result.failure_class,
            summary=verdict.summary,
        )
        self.info.counts = {
            "model_calls": result.model_calls,
            "tool_calls": tools,
            "compactions": result.compactions,
            "cleanup_confirmed": self.receipt_confirmed,
            "cleanup_proof": self.cleanup_proof,
            "cancelled_by": result.cancelled_by,
            "tokens_in": result.tokens_in,
            "tokens_out": result.tokens_out,
            "agent_tokens_in": result.agent_tokens_in,
            "agent_tokens_out": result.agent_tokens_out,
        }
        self.run_dir.write_run_info(self.info)
        self._write_diagnostics()
        self.run_dir.close()
        return result

    def _write_diagnostics(self) -> None:
        assert self.run_dir is not None
        parts = []
        for recorded in self.failures:
            failure, decision = recorded.failure, recorded.decision
            parts.append(
                (
                    f"failure {failure.kind}",
                    f"{failure.message}\nstage={failure.stage.value} "
                    f"class={decision.failure_class.value} action={decision.action.value}\n",
                )
            )
        from core.runtime.opencode import OUTPUT_LOG_FILE, STDERR_FILE  # [streamed output]

        for name in (OUTPUT_LOG_FILE, STDERR_FILE, "verify/stdout.log", "verify/stderr.log"):
            text = self.run_dir.path / name
            if text.exists():
                parts.append((name, text.read_text(errors="replace")))
        self.run_dir.write_diagnostics(parts)


# errno values that mean "the run directory's disk does not take writes", not a bug of ours.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO, errno.EACCES, errno.EPERM})


class EngineLoss(BaseModel):
    """[engine lost] What the close learned about an engine that went away."""

    model_config = ConfigDict(extra="forbid")

    unreachable: str | None  # the error that showed the engine unreachable, if one did
    probes: list[SandboxProbe]
    waited_s: float
    back: bool  # the engine answered again within the close budget


# [engine lost] kinds a provider gives an engine it cannot talk to
_UNREACHABLE_KINDS = frozenset({"provider_unavailable", "provider_io_timeout"})


def _unreachable_cause(exc: BaseException) -> str | None:
    """[engine lost] The message of a provider failure in ``exc``'s chain saying the engine could not
    be reached, if there is one."""
    node: BaseException | None = exc
    for _ in range(10):
        if node is None:
            return None
        failure = getattr(node, "failure", None)
        if isinstance(failure, FailureEvent) and failure.kind in _UNREACHABLE_KINDS:
            return failure.message[:300]
        node = node.__cause__ or node.__context__
    return None


def _evidence_key(evidence: Evidence) -> tuple[str, str]:
    """What makes two evidence pieces the same observation (a risen counter is a new one)."""
    import json

    return evidence.source, json.dumps(evidence.data, sort_keys=True, default=str)


_UNEXPECTED_KIND = {
    Phase.SEED: "sandbox_allocation_failed",
    Phase.INSTALL: "install_failed",
    Phase.AGENT: "agent_bootstrap_failed",
}


def _default_installer(config: AgentConfig) -> Any:
    from core.runtime.installer import Installer, InstallerConfig

    fields: dict[str, Any] = {
        "version": config.runtime.opencode_version,
        "registry_url": config.runtime.registry_url,
        "timeout_s": config.budgets.install_s,
    }
    if config.runtime.cache_dir:
        fields["cache_dir"] = Path(config.runtime.cache_dir)
    return Installer(InstallerConfig(**fields))
