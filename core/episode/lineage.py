"""Reruns and forks (issue 28): a child run answered from its parent's record.

``load_parent`` reads and checks what a child needs of its parent (run.json, the model calls, the
workspace digests) and ``child_inputs`` makes the child's task, configuration and ``ReplayPlan``; both
raise ``LineageError`` with one line for the user (exit 2, nothing started). ``ChildRun`` is what the
episode holds while the child runs: the ``Replayer`` the proxy asks, the lineage summary it keeps in
run.json, and the events that say what happened (the divergence, the first live call, the workspace
against the parent's digests).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from opencode_tui_core.admission import AdmissionError, rerun_inputs
from opencode_tui_core.artifacts import ReplaySummary, RunDirReader, RunFiles, RunInfo, RunParent, is_run_dir
from opencode_tui_core.calls.records import ModelCallRecord
from opencode_tui_core.config import AgentConfig, ConfigError
from opencode_tui_core.episode.digests import recorded_digests
from opencode_tui_core.events import Event, Warning_
from opencode_tui_core.failures import FailureEvent, FailureStage, GenericDetails
from opencode_tui_core.model.replay import (
    Divergence,
    OnDivergence,
    Replayer,
    ReplayPlan,
    agent_steps,
    fork_point,
)
from opencode_tui_core.tasks import Task, task_content_hash

REPLAY_DIVERGED = "replay_diverged"


class LineageError(ValueError):
    """A rerun or fork that cannot start as asked: one line saying what and what to do."""


@dataclass(frozen=True)
class Parent:
    path: Path
    info: RunInfo
    records: list[ModelCallRecord]
    steps: int  # agent model calls recorded
    digests: dict[int, str] = field(default_factory=dict)  # step → workspace digest


def load_parent(path: Path) -> Parent:
    """The parent run as recorded; LineageError when it cannot be replayed."""
    if not path.is_dir():
        raise LineageError(f"{path}: no such run directory")
    if not is_run_dir(path):
        raise LineageError(f"{path}: not a run directory (no {RunFiles.RUN_INFO})")
    reader = RunDirReader(path)
    try:
        info = reader.info()
    except ValueError as exc:
        raise LineageError(f"{path}: {RunFiles.RUN_INFO} is unreadable ({exc.__class__.__name__})") from None
    if info is None:
        raise LineageError(f"{path}: no {RunFiles.RUN_INFO}: the run's task and configuration are unknown")
    if not (path / RunFiles.MODEL_CALLS).is_file():
        raise LineageError(
            f"{path}: no {RunFiles.MODEL_CALLS}: the run recorded no model calls to answer from"
        )
    records = list(reader.model_calls())
    steps = agent_steps(records)
    if steps == 0:
        raise LineageError(f"{path}: {RunFiles.MODEL_CALLS} records no agent model call to answer from")
    digest_file = path / RunFiles.WORKSPACE_DIGESTS
    lines = digest_file.read_text(encoding="utf-8").splitlines() if digest_file.is_file() else []
    return Parent(path=path, info=info, records=records, steps=steps, digests=recorded_digests(lines))


def child_inputs(
    parent: Parent,
    *,
    lineage: str,
    fork_step: int | None = None,
    on_divergence: OnDivergence = "stop",
    allow_changed_task: bool = False,
    overrides: Callable[[AgentConfig], AgentConfig] | None = None,
    say: str | None = None,
) -> tuple[AgentConfig, Task, ReplayPlan]:
    """The child's configuration (the parent's, workspace digests on, then ``overrides``), its task
    (the parent's task directory, unchanged unless ``allow_changed_task``) and its plan."""
    name = parent.path.name
    if say is not None and (lineage != "fork" or not say.strip()):
        raise LineageError("--say needs a fork and a non-empty message")
    if fork_step is not None and not 1 <= fork_step < parent.steps:
        raise LineageError(
            f"--at {fork_step}: {name} recorded {parent.steps} agent model call(s); "
            f"fork at a step from 1 to {parent.steps - 1}"
        )
    point = fork_point(parent.records, fork_step) if fork_step is not None else None
    if point is not None and point.step == 0:
        raise LineageError(f"{point.why} (rerun {name} instead)")
    try:
        config, task = rerun_inputs(parent.info, parent.path)
    except (AdmissionError, ConfigError) as exc:
        raise LineageError(str(exc)) from None
    if parent.info.task_hash is not None and not allow_changed_task:
        if task_content_hash(task) != parent.info.task_hash:
            raise LineageError(
                f"the task in {task.root} changed since {name} ran; pass --allow-changed-task to "
                f"{lineage} it anyway and see where it diverges"
            )
    # Digests are always on in a child; the parent's unset value already means on, and is kept so
    # that `diff` shows no drift where there is none.
    digests = True if config.debug.workspace_digests is False else config.debug.workspace_digests
    config = config.model_copy(
        update={"debug": config.debug.model_copy(update={"workspace_digests": digests, "breaks": []})}
    )
    if overrides is not None:
        config = overrides(config)
    plan = ReplayPlan(
        lineage="fork" if lineage == "fork" else "rerun",
        parent_run_id=parent.info.run_id,
        parent_run_dir=str(parent.path.resolve()),
        fork_step=point.step if point is not None else None,
        on_divergence="live" if lineage == "fork" else on_divergence,
        say=say,
        asked_step=fork_step if point is not None and point.why else None,
        moved=point.why if point is not None else None,
    )
    return config, task, plan


class ChildRun:
    """A running rerun or fork: its replayer, summary and events. ``stop_agent`` stops the agent (a
    rerun's divergence under ``stop``); ``save`` writes the summary to run.json."""

    def __init__(
        self,
        plan: ReplayPlan,
        parent: Parent,
        *,
        emit: Callable[[Event], object],
        stop_agent: Callable[[FailureEvent], None],
        save: Callable[[], None],
    ) -> None:
        self.plan = plan
        self.parent = parent
        self._emit = emit
        self._stop_agent = stop_agent
        self._save = save
        self.summary = ReplaySummary(fork_moved=plan.moved)
        self.replayer = Replayer(
            plan,
            parent.records,
            on_diverged=self._diverged,
            on_live=self._live,
            at_fork_point=self._say if plan.say else None,
        )
        # say/abort through OpenCode's server (opencode_tui_core.debugger.serve_acts), once the agent runs
        self.serve: Callable[[str, str], Awaitable[None]] | None = None
        self._workspace_said = False

    def stamp(self, info: RunInfo) -> None:
        info.lineage = self.plan.lineage
        info.parent = RunParent(run_id=self.plan.parent_run_id, run_dir=self.plan.parent_run_dir)
        info.fork_step = self.plan.fork_step
        info.replay = self.summary

    def started(self) -> None:
        what = (
            f"fork of {self.plan.parent_run_id} at step {self.plan.fork_step}: its first "
            f"{self.plan.fork_step} agent call(s) are answered from the record, then the live model"
            if self.plan.lineage == "fork"
            else f"rerun of {self.plan.parent_run_id}: every model call is answered from the record "
            f"(on a divergence: {self.plan.on_divergence})"
        )
        self._emit(Warning_(code="replay_started", message=what))
        if self.plan.moved:
            self._emit(Warning_(code="replay_fork_moved", message=self.plan.moved))

    def _diverged(self, d: Divergence) -> None:
        self.summary.divergence_step = d.step
        self.summary.divergence = d.what + (f" (recorded call {d.call_id})" if d.call_id else "")
        self.summary.divergence_diff = d.diff or None
        self._emit(
            Warning_(code="replay_diverged", message=f"diverged at step {d.step}: {self.summary.divergence}")
        )
        self._save()
        if self.plan.lineage == "rerun" and self.plan.on_divergence == "stop":
            self._stop_agent(
                FailureEvent(
                    kind=REPLAY_DIVERGED,
                    stage=FailureStage.AGENT,
                    operation=f"rerun of {self.plan.parent_run_id}",
                    message=f"the rerun diverged at step {d.step}: {self.summary.divergence}",
                    details=GenericDetails(data={"step": d.step, "diff": d.diff}),
                )
            )

    async def _say(self) -> None:
        """fork --say: the message goes into OpenCode's session while the last replayed call is in
        flight, so the first live request carries it."""
        text = self.plan.say or ""
        try:
            if self.serve is None:
                raise RuntimeError("the harness has no server to post it to")
            await self.serve("say", text)
        except Exception as exc:
            self._emit(Warning_(code="replay_say_failed", message=f"--say was not delivered: {exc}"))
            return
        self.summary.said = text
        self._emit(Warning_(code="replay_said", message=f"at the fork point: {text}"))
        self._save()

    def _live(self, step: int) -> None:
        self.summary.live_from = step
        self._emit(Warning_(code="replay_live", message=f"step {step} onwards: the live model answers"))
        self._save()

    def on_digest(self, step: int, digest: str | None) -> None:
        """The child's workspace at ``step`` against the parent's digest of the same step."""
        recorded = self.parent.digests.get(step)
        fork_point = self.plan.fork_step is not None and step == self.plan.fork_step + 1
        if self._workspace_said or (self.plan.fork_step is not None and step > self.plan.fork_step + 1):
            return
        if recorded is None or digest is None:
            if fork_point:
                self.summary.workspace_check = "not checked: " + (
                    f"{self.parent.path.name} recorded no workspace digest"
                    if recorded is None
                    else "the workspace digest could not be taken"
                )
                self._workspace_said = True
                self._emit(Warning_(code="replay_workspace", message=self.summary.workspace_check))
                self._save()
            return
        if digest != recorded:
            self.summary.workspace_check = f"differs at step {step}"
            self._workspace_said = True
            self._emit(
                Warning_(
                    code="replay_workspace",
                    message=f"the workspace at step {step} differs from {self.parent.path.name}'s",
                )
            )
            self._save()
        elif fork_point:
            self.summary.workspace_check = f"matches at step {step}"
            self._workspace_said = True
            self._emit(
                Warning_(
                    code="replay_workspace_matched",
                    message=f"the workspace at the fork point (step {step}) matches the recorded digest",
                )
            )
            self._save()

    def finish(self, *, complete: bool) -> None:
        """At the end: the counts, and for a rerun whether it reproduced its parent (``complete``: the
        agent ran to its own end, neither cancelled nor stopped: fewer calls then is a divergence)."""
        self.summary.replayed = self.replayer.replayed
        ended = self.replayer.step
        short = complete and ended < self.parent.steps
        if self.plan.lineage == "rerun" and self.summary.divergence_step is None and short:
            self.summary.divergence_step = ended + 1
            self.summary.divergence = f"the rerun ended after {ended} agent call(s); {self.parent.path.name} made {self.parent.steps}"
            self._emit(Warning_(code="replay_diverged", message=f"diverged: {self.summary.divergence}"))
        if self.plan.lineage == "rerun":
            self.summary.reproduced = self.summary.divergence_step is None
            if self.summary.workspace_check is None and self.parent.digests:
                self.summary.workspace_check = "matches at every step"
