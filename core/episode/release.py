"""The release phase: destroy an owned sandbox, detach from a borrowed one, or keep it for ``attach``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opencode_tui_core.episode import engine_lost
from opencode_tui_core.episode.common import PhaseIO
from opencode_tui_core.events import CleanupObserved, CleanupProof, CleanupStep, StepState, Warning_
from opencode_tui_core.failures import FailureEvent, FailureStage
from opencode_tui_core.sandbox.base import Sandbox
from opencode_tui_core.session import CloseDeadline, SandboxSession


@dataclass(frozen=True)
class Released:
    """``kept``: the sandbox outlives this process, recorded for ``attach`` and ``sweep``."""

    kept: bool
    failures: tuple[FailureEvent, ...]


async def keep(sandbox: Sandbox, run_id: str, run_dir: Path | None, io: PhaseIO) -> Released:
    """Keep (issue 18): the sandbox outlives this process; a failure to record it is a warning."""
    from opencode_tui_core.sandbox.kept import keep_for_later

    kept = False
    try:
        await keep_for_later(sandbox, run_id, run_dir)
        kept = True
    except Exception as exc:
        io.emit(Warning_(code="keep_failed", message=f"the sandbox could not be kept: {exc}"))
    io.emit(
        CleanupObserved(
            step=CleanupStep.SANDBOX_RELEASED,
            state=StepState.SKIPPED,
            reason=f"kept for debugging: {sandbox.provider} {sandbox.sandbox_id}",
        )
    )
    return Released(kept=kept, failures=())


async def release(
    sandbox: Sandbox,
    session: SandboxSession | None,
    *,
    deadline: CloseDeadline,
    io: PhaseIO,
    proof: CleanupProof | None = None,
    lost_in: FailureStage = FailureStage.AGENT,
    engine_lost_recorded: bool = False,
) -> Released:
    """Release through the session when one ran (it emits its own cleanup events), else directly;
    either way within what the close budget has left (the release's reserve included). An engine
    that cannot be reached is waited for within that budget, and the release tried again
    (engine_lost.py; ``proof``, ``lost_in`` and ``engine_lost_recorded`` are for its record)."""
    try:
        if session is not None:
            await session.release()  # [close budget] bounded by the session's close deadline
        else:
            await deadline.run(sandbox.release(), step="release", for_release=True)  # [close budget]
            io.emit(
                CleanupObserved(
                    step=CleanupStep.SANDBOX_RELEASED, state=StepState.OK, data={"owned": sandbox.owned}
                )
            )
    except Exception as exc:
        if await engine_lost.release_after_engine(  # [engine lost]
            sandbox,
            session,
            exc,
            deadline=deadline,
            io=io,
            proof=proof,
            stage=lost_in,
            already_recorded=engine_lost_recorded,
        ):
            return Released(kept=False, failures=tuple(io.recorded))
        io.step_failed(
            CleanupStep.SANDBOX_RELEASED,
            exc,
            "sandbox_release_failed",
            FailureStage.RELEASE,
            "release sandbox",
        )
    return Released(kept=False, failures=tuple(io.recorded))
