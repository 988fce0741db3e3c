"""The transcript phase, only after confirmed cleanup: OpenCode's database exported, its counts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.episode.common import PhaseIO, failure_from
from opencode_tui_core.events import CleanupObserved, CleanupStep, StepState, TranscriptStats
from opencode_tui_core.failures import Evidence, FailureEvent, FailureStage
from opencode_tui_core.session import CloseDeadline

if TYPE_CHECKING:
    from opencode_tui_core.runtime.opencode import OpenCodeHarness


@dataclass(frozen=True)
class Transcribed:
    """The transcript's counts (the source of truth for tool calls and agent tokens), or its failure."""

    stats: TranscriptStats | None
    failures: tuple[FailureEvent, ...]


def snapshot_evidence(io: PhaseIO, exc: BaseException) -> Evidence:
    """What the controller saw of OpenCode's data when its snapshot failed: the copy it read from
    (the files it holds, their sizes) and the error. The transcript is an optional artifact: this
    failure is a warning that never costs a graded reward (``opencode_tui_core.failures.policy.WARNING_KINDS``)."""
    copy = io.run_dir.path / RunFiles.OPENCODE_DATA
    files = sorted(copy.rglob("*")) if copy.is_dir() else []
    return Evidence(
        source="transcript.snapshot",
        scope=str(copy),
        data={
            "copy_exists": copy.is_dir(),
            "files": {str(f.relative_to(copy)): f.stat().st_size for f in files[:50] if f.is_file()},
            "error": f"{type(exc).__name__}: {exc}"[:500],
        },
    )


async def export_transcript(harness: OpenCodeHarness, *, deadline: CloseDeadline, io: PhaseIO) -> Transcribed:
    """Export within what the close budget has left; the stats are emitted as an event too."""
    try:
        stats = await deadline.run(  # [close budget]
            asyncio.to_thread(harness.export_transcript, io.run_dir), step="export the transcript"
        )
    except Exception as exc:
        io.emit(
            CleanupObserved(step=CleanupStep.TRANSCRIPT_SNAPSHOT, state=StepState.FAILED, reason=str(exc))
        )
        if not io.disk_full(exc):
            failure = failure_from(
                exc, "transcript_export_failed", FailureStage.TRANSCRIPT, "export transcript"
            )
            io.fail(failure.model_copy(update={"evidence": [*failure.evidence, snapshot_evidence(io, exc)]}))
        return Transcribed(stats=None, failures=tuple(io.recorded))
    io.emit(
        CleanupObserved(
            step=CleanupStep.TRANSCRIPT_SNAPSHOT, state=StepState.OK, data={"messages": stats.messages}
        )
    )
    io.emit(stats)
    return Transcribed(stats=stats, failures=())
