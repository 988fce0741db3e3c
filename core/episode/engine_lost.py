"""The engine under the sandbox went away mid-episode (issue 19): the Docker daemon stopped or
restarted, the OpenSandbox server gone, the local keeper killed from outside.

An unreachable engine is waited for within the close budget, so that what is owned can still be
released; then ``Sandbox.probe`` asks it whether the sandbox is dead. A dead container or PID
namespace holds no process: that is proof of cleanup (``found_dead``), receipt or not. The failure
is ``sandbox_engine_lost``: the stage the episode was working in, the probes as evidence; the policy
retries it, and it explains the failed commands recorded around it (opencode_tui_core.outcome.ROOT_CAUSE_KINDS).
"""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.episode.common import PhaseIO
from opencode_tui_core.events import CleanupObserved, CleanupProof, CleanupStep, StepState, Warning_
from opencode_tui_core.failures import CleanupDetails, FailureEvent, FailureStage
from opencode_tui_core.sandbox.base import Sandbox, SandboxProbe
from opencode_tui_core.session import CloseDeadline, SandboxSession

KIND = "sandbox_engine_lost"
# Kinds a provider gives an engine it cannot talk to.
UNREACHABLE_KINDS = frozenset({"provider_unavailable", "provider_io_timeout"})
WORK_STAGES = ("admission", "seed", "install", "agent")


class EngineLoss(BaseModel):
    """What the close learned about an engine that went away."""

    model_config = ConfigDict(extra="forbid")

    unreachable: str | None  # the error that showed the engine unreachable, if one did
    probes: list[SandboxProbe]
    waited_s: float
    back: bool  # the engine answered again within the close budget

    @property
    def dead(self) -> bool:
        return self.probes[-1].dead is True


def unreachable_cause(exc: BaseException) -> str | None:
    """The message of a provider failure in ``exc``'s chain saying the engine could not be reached."""
    node: BaseException | None = exc
    for _ in range(10):
        if node is None:
            return None
        failure = getattr(node, "failure", None)
        if isinstance(failure, FailureEvent) and failure.kind in UNREACHABLE_KINDS:
            return failure.message[:300]
        node = node.__cause__ or node.__context__
    return None


def lost_in(phases_started: list[str]) -> FailureStage:
    """The stage the episode was working in when its close began (the engine went away then)."""
    work = [p for p in phases_started if p in WORK_STAGES]
    return FailureStage(work[-1]) if work else FailureStage.SEED


async def probe_engine(
    sandbox: Sandbox, exc: BaseException, deadline: CloseDeadline, io: PhaseIO, *, for_release: bool = False
) -> EngineLoss | None:
    """Whether the engine went away (``exc`` could not reach it, or the probe saw it go); an
    unreachable engine is waited for (``for_release``: all the close budget has left, else what
    remains before the release's reserve). None: the engine answered all along."""
    unreachable = unreachable_cause(exc)
    probes: list[SandboxProbe] = []
    started = time.monotonic()
    while True:
        left = deadline.remaining(for_release=for_release)
        try:
            probe = await sandbox.probe(timeout=max(min(5.0, left), 0.5))
        except Exception as probe_exc:  # a probe that fails says nothing: the usual path decides
            io.emit(Warning_(code="probe_failed", message=f"could not probe the sandbox: {probe_exc}"))
            return None
        probes.append(probe)
        left = deadline.remaining(for_release=for_release)
        if probe.engine_reachable or left <= 0.0:
            break
        await asyncio.sleep(min(0.5, left))
    if unreachable is None and len(probes) == 1 and not probe.engine_lost:
        return None
    return EngineLoss(
        unreachable=unreachable,
        probes=probes,
        waited_s=round(time.monotonic() - started, 3),
        back=probe.engine_reachable,
    )


def found_dead(lost: EngineLoss, io: PhaseIO) -> CleanupProof:
    """The engine reports the sandbox dead: that is the proof, and the cleanup panel says so."""
    io.emit(
        CleanupObserved(
            step=CleanupStep.RECEIPT,
            state=StepState.OK,
            reason=f"no receipt, but the sandbox is dead: {lost.probes[-1].detail}",
            data={"proof": CleanupProof.FOUND_DEAD.value},
        )
    )
    return CleanupProof.FOUND_DEAD


_FALLBACK = {
    CleanupProof.FOUND_DEAD: "sandbox found dead",
    CleanupProof.DESTROYED: "sandbox destroyed",
    CleanupProof.NOTHING_LAUNCHED: "nothing launched",
}


def failure(
    sandbox: Sandbox,
    lost: EngineLoss,
    why: str,
    proof: CleanupProof | None,
    stage: FailureStage,
    operation: str,
) -> FailureEvent:
    last = lost.probes[-1]
    engine = f"the {sandbox.provider} engine"
    if lost.unreachable is None:
        said = last.detail  # a restart already over, or the keeper killed
    elif lost.back:
        said = f"{engine} went away ({lost.unreachable}); it answered again after {lost.waited_s:g}s: {last.detail}"
    else:
        said = (
            f"{engine} went away ({lost.unreachable}) and did not answer again within the close budget "
            f"({lost.waited_s:g}s waited)"
        )
    fallback = _FALLBACK.get(proof) if proof is not None else None
    proven = f"cleanup is proven ({fallback})" if fallback else "cleanup is not confirmed"
    # The first probe (the engine gone) and the last (what it said once back) are the evidence.
    shown = lost.probes if len(lost.probes) < 3 else [lost.probes[0], lost.probes[-1]]
    return FailureEvent(
        kind=KIND,
        stage=stage,
        operation=operation,
        message=f"{said}; {proven} ({why})"[:2000],
        evidence=[e for p in shown for e in p.evidence],
        details=CleanupDetails(receipt=None, fallback=fallback),
    )


async def release_after_engine(
    sandbox: Sandbox,
    session: SandboxSession | None,
    exc: BaseException,
    *,
    deadline: CloseDeadline,
    io: PhaseIO,
    proof: CleanupProof | None,
    stage: FailureStage,
    already_recorded: bool,
) -> bool:
    """The release could not reach the engine: wait for it within the close budget and release
    again. True when the sandbox was released after all."""
    if unreachable_cause(exc) is None:
        return False
    lost = await probe_engine(sandbox, exc, deadline, io, for_release=True)
    released = False
    if lost is not None and lost.back:
        try:
            if session is not None:
                await session.release()  # [close budget] what the close deadline has left
            else:
                await deadline.run(sandbox.release(), step="release", for_release=True)
                io.emit(
                    CleanupObserved(
                        step=CleanupStep.SANDBOX_RELEASED,
                        state=StepState.OK,
                        data={"owned": sandbox.owned, "after_engine_returned": True},
                    )
                )
            released = True
        except Exception as again:
            exc = again
    if lost is not None and not already_recorded:
        said = "the sandbox was released once it answered" if released else f"release failed: {exc}"
        if proof is CleanupProof.RECEIPT and released:
            # The run itself was unaffected (its receipt came, its grade stands): only the release
            # had to wait. Said, not a failure.
            io.emit(
                Warning_(
                    code="engine_lost_at_release",
                    message=f"the {sandbox.provider} engine was away at release ({lost.unreachable}); "
                    f"{said} after {lost.waited_s:g}s",
                )
            )
        else:
            operation = "stop and confirm" if session is not None else "release"
            io.fail(failure(sandbox, lost, said, proof, stage, operation))
    return released
