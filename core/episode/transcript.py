"""The transcript phase, only after confirmed cleanup: OpenCode's database exported, its counts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.episode.common import PhaseIO
from core.events import CleanupObserved, CleanupStep, StepState, TranscriptStats
from core.failures import FailureEvent, FailureStage
from core.session import CloseDeadline

if TYPE_CHECKING:
    from core.runtime.opencode import OpenCodeHarness


@dataclass(frozen=True)
class Transcribed:
    """The transcript's counts (the source of truth for tool calls and agent tokens), or its failure."""

    stats: TranscriptStats | None
    failures: tuple[FailureEvent, ...]


async def export_transcript(harness: OpenCodeHarness, *, deadline: CloseDeadline, io: PhaseIO) -> Transcribed:
    """Export within what the close budget has left; the stats are emitted as an event too."""
    try:
        stats = await deadline.run(  # [close budget]
            asyncio.to_thread(harness.export_transcript, io.run_dir), step="export the transcript"
        )
    except Exception as exc:
        io.step_failed(
            CleanupStep.TRANSCRIPT_SNAPSHOT,
            exc,
            "transcript_export_failed",
            FailureStage.TRANSCRIPT,
            "export transcript",
        )
        return Transcribed(stats=None, failures=tuple(io.recorded))
    io.emit(
        CleanupObserved(
            step=CleanupStep.TRANSCRIPT_SNAPSHOT, state=StepState.OK, data={"messages": stats.messages}
        )
    )
    io.emit(stats)
    return Transcribed(stats=stats, failures=())
