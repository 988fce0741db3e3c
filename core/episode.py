"""One episode end to end: seed → install → agent → close (confirmed cleanup) → transcript → verify
→ release → outcome. Every step emits events; every failure becomes a FailureEvent with its stage and
evidence; the outcome policy decides what it means.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.artifacts import OutcomeSummary, RunDir, RunInfo, cap_diagnostics, versions
from core.config import AgentConfig
from core.control import EpisodeControl
from core.events import (
    CleanupObserved,
    CleanupStep,
    Compaction,
    EpisodeStarted,
    Event,
    EventBus,
    FailureRecorded,
    ModelCall,
    OutcomeDecided,
    Phase,
    PhaseChanged,
    SandboxReady,
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
    Action,
    CleanupDetails,
    DeadlineDetails,
    Decision,
    Evidence,
    FailureEvent,
    FailureStage,
    OomDetails,
    VerificationDetails,
    decide,
    merged,
    merged_classification,
)
from core.sandbox.base import (
    LABEL_OWNER,
    LABEL_RUN,
    ExpectedRefusal,
    PtyHandle,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    SandboxProvider,
    SandboxSpec,
    default_owner,
    describe_exit,
)
from core.session import CleanupUnconfirmed, SandboxSession
from core.tasks import Task


class EpisodeResult(BaseModel):
    """One episode's result; also the batch JSON line."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    task_id: str
    attempt: int
    provider: str
    sandbox_id: str | None = None
    reward: float | None = None
    action: str
    failure_kind: str | None = None
    failure_stage: str | None = None
    failure_class: str | None = None
    cleanup_confirmed: bool | None = None
    model_calls: int = 0
    tool_calls: int = 0
    compactions: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    durations_s: dict[str, float] = Field(default_factory=dict)
    run_dir: str
    summary: str = ""
    previous_attempts: list[str] = Field(default_factory=list)
    resumed: bool = False
    sandbox_kept: bool = False

    @property
    def scored(self) -> bool:
        return self.action in ("scored", Action.COUNT_AS_ZERO.value)


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
        self.failures: list[tuple[FailureEvent, Decision]] = []
        self._keep = config.sandbox.keep_sandbox
        self._cancel_requested = False
        self._agent_task: asyncio.Task[Any] | None = None
        self._verify_task: asyncio.Task[Any] | None = None
        self._done = asyncio.Event()
        self._result: EpisodeResult | None = None
        self._phase_started: dict[str, float] = {}
        self.durations: dict[str, float] = {}
        self.counts: dict[str, Any] = {"model_calls": 0, "tool_calls": {}, "compactions": 0}
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

    async def cancel(self) -> None:
        self._cancel_requested = True
        for task in (self._agent_task, self._verify_task):
            if task is not None and not task.done():
                task.cancel()

    def keep_sandbox(self, keep: bool = True) -> None:
        self._keep = keep

    async def open_shell(self, cols: int = 80, rows: int = 24) -> PtyHandle:
        if self.sandbox is None or (self.session is not None and self.session.released):
            raise SandboxClosedError("the sandbox is not available (not created yet, or already released)")
        return await self.sandbox.pty(["/bin/bash", "-l"], cols=cols, rows=rows, cwd=self.task.workdir)

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
        decision = decide(
            failure, attempt=self.attempt, policy=self.policy, classification=self.classification
        )
        self.failures.append((failure, decision))
        self.emit(FailureRecorded(failure=failure, decision=decision))
        return decision

    def _cleanup_step_failed(self, step: CleanupStep, exc: BaseException, kind: str, operation: str) -> None:
        """A cleanup-side step failed: show it in the cleanup panel and record it as a failure."""
        self.emit(CleanupObserved(step=step, state=StepState.FAILED, reason=str(exc)))
        self.record_failure(
            FailureEvent.from_exception(exc, kind=kind, stage=FailureStage.CLEANUP, operation=operation)
        )

    def _count(self, event: Event) -> None:
        if isinstance(event, ModelCall):
            self.counts["model_calls"] += 1
        elif isinstance(event, ToolCall) and event.status != "running":
            tools = self.counts["tool_calls"]
            tools[event.tool] = tools.get(event.tool, 0) + 1
        elif isinstance(event, Compaction):
            self.counts["compactions"] = max(self.counts["compactions"], event.count)
        elif isinstance(event, TranscriptStats):
            # The transcript snapshot is the source of truth for counts.
            self.counts["tool_calls"] = dict(event.tool_calls)
            self.counts["compactions"] = event.compactions
            self.counts["tokens_in"] = event.tokens_in
            self.counts["tokens_out"] = event.tokens_out

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
            provider=self.config.sandbox.provider.value,
            config=self.config.model_dump(mode="json"),
            versions=versions(self.config.runtime.opencode_version),
        )
        self.run_dir.write_run_info(self.info)

    @property
    def run_budget_s(self) -> float:
        cap = self.task.limits.run_s
        return min(self.config.budgets.run_s, cap) if cap else self.config.budgets.run_s

    async def _run(self) -> EpisodeResult:
        self._start_run_dir()
        self.emit(
            EpisodeStarted(
                run_id=self.run_id,
                task_id=self.task.id,
                provider=self.config.sandbox.provider.value,
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
            self._cancel_requested = True
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self.record_failure(
                FailureEvent(
                    kind="run_cancelled",
                    stage=self._stage_of(self._phase),
                    operation=f"{self._phase.value} phase",
                    message=f"cancelled by the user during {self._phase.value}",
                )
            )
        except StageFailure as sf:
            self.record_failure(sf.failure)
        except ExpectedRefusal as exc:
            # A provider-confirmed refusal before anything ran is control flow, not a failure.
            self.refusal = str(exc)
            self.emit(Warning_(code="provider_refused", message=f"the provider refused before launch: {exc}"))
        except Exception as exc:  # a provider's typed failure, or an unexpected bug: still close and release
            failure = getattr(exc, "failure", None)
            if isinstance(failure, FailureEvent):
                self.record_failure(failure)
            else:
                self.record_failure(
                    FailureEvent.from_exception(
                        exc,
                        kind=_UNEXPECTED_KIND.get(self._phase, "agent_bootstrap_failed"),
                        stage=self._stage_of(self._phase),
                        operation=f"{self._phase.value} phase",
                    )
                )
        # Closing must finish even if the caller is cancelled again (a second Ctrl-C): every step
        # below has its own deadline, so this loop is bounded.
        finish = asyncio.ensure_future(self._finish(stack))
        while True:
            try:
                return await asyncio.shield(finish)
            except asyncio.CancelledError:
                self._cancel_requested = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                # Verification is the one step after the agent worth abandoning on a cancel.
                if self._verify_task is not None and not self._verify_task.done():
                    self._verify_task.cancel()
                if finish.done():
                    return finish.result()

    @staticmethod
    def _stage_of(phase: Phase) -> FailureStage:
        return {
            Phase.ADMISSION: FailureStage.ADMISSION,
            Phase.SEED: FailureStage.SEED,
            Phase.INSTALL: FailureStage.INSTALL,
            Phase.AGENT: FailureStage.AGENT,
            Phase.VERIFICATION: FailureStage.VERIFICATION,
        }.get(phase, FailureStage.CLEANUP)

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
            raise StageFailure(exc.failure) from exc

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

    def _failure_from(
        self, exc: BaseException, kind: str, stage: FailureStage, operation: str
    ) -> FailureEvent:
        failure = getattr(exc, "failure", None)
        if isinstance(failure, FailureEvent):
            return failure
        return FailureEvent.from_exception(exc, kind=kind, stage=stage, operation=operation)

    # ---- closing, transcript, verification, release, outcome -------------------------------------

    async def _finish(self, stack: contextlib.AsyncExitStack) -> EpisodeResult:
        confirmed: bool | None = None
        if self.session is not None:
            self._enter(Phase.CLOSING)
            receipt = None
            try:
                receipt = await self.session.finalize()
                confirmed = True
            except CleanupUnconfirmed as exc:
                confirmed = False
                owned = self.sandbox is not None and self.sandbox.owned
                self.record_failure(
                    FailureEvent.from_exception(
                        exc,
                        kind="cleanup_unconfirmed",
                        stage=FailureStage.CLEANUP,
                        operation="stop and confirm",
                        details=CleanupDetails(
                            receipt=None, fallback="destroy the sandbox" if owned else None
                        ),
                    )
                )
            if self.session.launch_started:
                await self._analyse_agent(receipt)
            if self.session.collect_error is not None:
                self.record_failure(
                    FailureEvent.from_exception(
                        self.session.collect_error,
                        kind="transcript_export_failed",
                        stage=FailureStage.CLEANUP,
                        operation="collect OpenCode database and logs",
                    )
                )
        self.receipt_confirmed = confirmed
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
        if confirmed and self.sandbox is not None and not self._cancel_requested:
            self._enter(Phase.VERIFICATION)
            self._verify_task = asyncio.ensure_future(self._verify())
            try:
                await self._verify_task
            except asyncio.CancelledError:
                self.record_failure(
                    FailureEvent(
                        kind="run_cancelled",
                        stage=FailureStage.VERIFICATION,
                        operation="verification phase",
                        message="cancelled by the user during verification",
                    )
                )
        self._enter(Phase.RELEASE)
        await self._release()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(stack.aclose(), 10)
        self._enter(Phase.DONE, state=StepState.OK)
        return self._outcome()

    async def _analyse_agent(self, receipt: Any) -> None:
        """Turn provider evidence, the receipt and the model calls into at most one agent failure.

        Order matters: authoritative OOM evidence first (exit 137 alone is never evidence), then the
        observed deadline, then a failing model endpoint, then the harness's own exit.
        """
        from core.sandbox.oom import oom_evidence

        evidence = []
        if self.sandbox is not None:
            try:
                evidence = await asyncio.wait_for(self.sandbox.inspect(), 15)
            except Exception as exc:  # diagnosis is best effort and bounded
                self.emit(Warning_(code="inspect_failed", message=f"could not inspect the sandbox: {exc}"))
        confirming = oom_evidence(evidence, scope=evidence[0].scope if evidence else None)
        if confirming:
            oom = confirming[0]
            self.record_failure(
                FailureEvent(
                    kind="provider_oom_killed",
                    stage=FailureStage.AGENT,
                    operation="run opencode",
                    message=f"the kernel OOM-killed a process in this sandbox (confirmed by {oom.source})",
                    evidence=confirming,
                    details=OomDetails(
                        container_id=oom.scope,
                        memory_limit_bytes=self.task.limits.memory_bytes,
                        exit_code=getattr(receipt, "return_code", None),
                    ),
                )
            )
            return
        if receipt is None:
            return
        if receipt.timed_out:
            self.record_failure(
                FailureEvent(
                    kind="agent_timeout",
                    stage=FailureStage.AGENT,
                    operation="run opencode",
                    message=f"the run deadline of {self.run_budget_s:g}s fired; the supervisor stopped the agent "
                    f"and drained {receipt.descendants_killed} descendant process(es)",
                    details=DeadlineDetails(
                        budget_s=self.run_budget_s,
                        elapsed_s=self.durations.get("agent"),
                        timed_out_observed=True,
                    ),
                    evidence=[
                        Evidence(source="supervisor.receipt", scope=self.run_id, data=receipt.model_dump())
                    ],
                )
            )
            return
        finished = self.harness.finished_cleanly
        if receipt.return_code == 0 and finished and receipt.error is None:
            return
        failed_call = self.endpoint.last_failed_call()
        if failed_call is not None and (not finished or receipt.return_code != 0):
            self.record_failure(failed_call.to_failure(FailureStage.AGENT))
        elif receipt.error:
            self.record_failure(
                FailureEvent(
                    kind="agent_bootstrap_failed",
                    stage=FailureStage.AGENT,
                    operation="launch opencode",
                    message=receipt.error,
                    evidence=[
                        Evidence(source="supervisor.receipt", scope=self.run_id, data=receipt.model_dump())
                    ],
                )
            )
        elif receipt.return_code != 0:
            self.record_failure(
                FailureEvent(
                    kind="agent_nonzero_exit",
                    stage=FailureStage.AGENT,
                    operation="run opencode",
                    # An exit never observed is said in words, never "exited with None" (issue 17).
                    message=describe_exit(receipt.return_code, receipt.signal, subject="OpenCode")
                    + (f": {self.harness.last_error}" if self.harness.last_error else ""),
                    evidence=[
                        Evidence(source="supervisor.receipt", scope=self.run_id, data=receipt.model_dump())
                    ],
                )
            )
        elif not finished:
            self.record_failure(
                FailureEvent(
                    kind="agent_did_not_finish",
                    stage=FailureStage.AGENT,
                    operation="run opencode",
                    message="OpenCode exited 0 without a finished assistant turn"
                    + (f": {self.harness.last_error}" if self.harness.last_error else ""),
                )
            )

    async def _transcript(self) -> None:
        assert self.run_dir is not None
        try:
            stats = await asyncio.to_thread(self.harness.export_transcript, self.run_dir)
        except Exception as exc:
            self._cleanup_step_failed(
                CleanupStep.TRANSCRIPT_SNAPSHOT, exc, "transcript_export_failed", "export transcript"
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
                ["/bin/sh", "-c", v.command], cwd=self.task.workdir, timeout=v.timeout, user=v.user
            )
        except SandboxError as exc:
            self.record_failure(
                self._failure_from(exc, "verifier_error", FailureStage.VERIFICATION, "run verifier")
            )
            return
        out = result.stdout.decode("utf-8", "replace")
        err = result.stderr.decode("utf-8", "replace")
        self.run_dir.write_text("verify/stdout.log", out)
        self.run_dir.write_text("verify/stderr.log", err)
        duration = round(time.monotonic() - started, 3)
        if not result.observed:
            self.emit(
                VerificationFinished(
                    exit_code=None,
                    reward=None,
                    passed=None,
                    duration_s=duration,
                    output_excerpt=(out + err)[-2000:],
                    user=verifier,
                )
            )
            self.record_failure(
                FailureEvent(
                    kind="verifier_timeout",
                    stage=FailureStage.VERIFICATION,
                    operation="run verifier",
                    message=f"the verifier did not finish within {v.timeout:g}s",
                    details=DeadlineDetails(budget_s=v.timeout, elapsed_s=duration),
                )
            )
            return
        reward: float | None = 1.0 if result.exit_code == 0 else 0.0
        if v.reward_file:
            try:
                raw = await self.sandbox.download_file(
                    v.reward_file if v.reward_file.startswith("/") else f"{self.task.workdir}/{v.reward_file}"
                )
                reward = float(raw.decode().strip())
            except Exception as exc:
                reward = None
                self.record_failure(
                    FailureEvent.from_exception(
                        exc,
                        kind="verification_inconclusive",
                        stage=FailureStage.VERIFICATION,
                        operation=f"read reward file {v.reward_file}",
                        details=VerificationDetails(
                            exit_code=result.exit_code, output_excerpt=(out + err)[-2000:]
                        ),
                    )
                )
        self.reward = reward
        self.emit(
            VerificationFinished(
                exit_code=result.exit_code,
                reward=reward,
                passed=result.exit_code == 0,
                duration_s=duration,
                output_excerpt=(out + err)[-2000:],
                user=verifier,
            )
        )

    async def _release(self) -> None:
        if self.sandbox is None:
            return
        if self._keep:
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
                await asyncio.wait_for(self.session.release(), self.config.budgets.close_s)
            else:
                await asyncio.wait_for(self.sandbox.release(), self.config.budgets.close_s)
                self.emit(
                    CleanupObserved(
                        step=CleanupStep.SANDBOX_RELEASED,
                        state=StepState.OK,
                        data={"owned": self.sandbox.owned},
                    )
                )
        except Exception as exc:
            self._cleanup_step_failed(
                CleanupStep.SANDBOX_RELEASED, exc, "sandbox_release_failed", "release sandbox"
            )

    def _primary(self) -> tuple[FailureEvent, Decision] | None:
        """The failure that decides the outcome: the first one that is not about cleanup."""
        if not self.failures:
            return None
        for item in self.failures:
            if item[0].stage is not FailureStage.CLEANUP:
                return item
        return self.failures[0]

    def _outcome(self) -> EpisodeResult:
        assert self.run_dir is not None and self.info is not None
        primary = self._primary()
        if primary is None and self.refusal is not None:
            action, reward, summary = (
                "refused",
                None,
                f"refused by the provider before launch: {self.refusal}",
            )
            failure = decision = None
        elif primary is None:
            action, reward, summary = "scored", self.reward, f"scored: reward {self.reward}"
            failure = decision = None
        else:
            failure, decision = primary
            action = decision.action.value
            reward = 0.0 if decision.action is Action.COUNT_AS_ZERO else None
            summary = (
                f"{failure.kind} ({failure.stage.value}, class {decision.failure_class.value}) → {action}"
            )
        self.emit(
            OutcomeDecided(
                action=Action(action) if action not in ("scored", "refused") else action,
                reward=reward,
                failure_kind=failure.kind if failure else None,
                failure_class=decision.failure_class if decision else None,
                summary=summary,
                evidence=list(failure.evidence) if failure else [],
            )
        )
        tools = self.counts.get("tool_calls", {})
        result = EpisodeResult(
            run_id=self.run_id,
            task_id=self.task.id,
            attempt=self.attempt,
            provider=self.config.sandbox.provider.value,
            sandbox_id=self.sandbox.sandbox_id if self.sandbox else None,
            reward=reward,
            action=action,
            failure_kind=failure.kind if failure else None,
            failure_stage=failure.stage.value if failure else None,
            failure_class=decision.failure_class.value if decision else None,
            cleanup_confirmed=self.receipt_confirmed,
            model_calls=self.counts.get("model_calls", 0),
            tool_calls=sum(tools.values()),
            compactions=self.counts.get("compactions", 0),
            tokens_in=self.counts.get("tokens_in"),
            tokens_out=self.counts.get("tokens_out"),
            durations_s=dict(self.durations),
            sandbox_kept=self._keep and self.sandbox is not None,
            run_dir=str(self.run_dir.path),
            summary=summary,
        )
        self.info.ended_at = datetime.now(UTC)
        self.info.phase_durations_s = dict(self.durations)
        self.info.outcome = OutcomeSummary(
            action=action,
            reward=reward,
            failure_kind=result.failure_kind,
            failure_stage=result.failure_stage,
            failure_class=result.failure_class,
            summary=summary,
        )
        self.info.counts = {
            "model_calls": result.model_calls,
            "tool_calls": tools,
            "compactions": result.compactions,
            "cleanup_confirmed": self.receipt_confirmed,
        }
        self.run_dir.write_run_info(self.info)
        self._write_diagnostics()
        self.run_dir.close()
        return result

    def _write_diagnostics(self) -> None:
        assert self.run_dir is not None
        parts = []
        for failure, decision in self.failures:
            parts.append(
                (
                    f"failure {failure.kind}",
                    f"{failure.message}\nstage={failure.stage.value} "
                    f"class={decision.failure_class.value} action={decision.action.value}\n",
                )
            )
        for name in ("opencode/output.log", "stderr.log", "verify/stdout.log", "verify/stderr.log"):
            text = self.run_dir.path / name
            if text.exists():
                parts.append((name, text.read_text(errors="replace")))
        self.run_dir.write_text("diagnostics.txt", cap_diagnostics(parts))


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
