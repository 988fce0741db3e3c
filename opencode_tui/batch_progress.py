"""Progress for headless batches: a rich live display on stderr when it is a terminal, else
one plain line per finished episode. Data never goes to stderr; diagnostics never to stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from core.episode import Episode, EpisodeResult
from core.events import Event, HealthWarning, InstallProgress, PhaseChanged


def health_words(counts: dict[str, int]) -> str:
    """``health: compaction_storm x2, retry_storm x1`` (empty without warnings)."""
    if not counts:
        return ""
    return "health: " + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))


class BatchProgress:
    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.done = 0
        self.tty = stream.isatty()
        self._progress: Any = None
        self._overall: Any = None
        self._rows: dict[str, Any] = {}
        self._names: dict[str, str] = {}  # run id → "task aN" (an attempt on a Ray worker)

    def __enter__(self) -> BatchProgress:
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._progress.start()
            self._overall = self._progress.add_task(f"episodes 0/{self.total}", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def attach(self, episode: Episode) -> None:
        if self._progress is None:
            return
        row = self._progress.add_task(f"{episode.task.id} a{episode.attempt}: admission", total=None)
        self._rows[episode.run_id] = row
        phase = "admission"
        health = 0

        def describe() -> str:
            warned = f" ⚠ {health} health" if health else ""
            return f"{episode.task.id} a{episode.attempt}: {phase}{warned}"

        def on_event(event: Event) -> None:
            nonlocal phase, health
            if isinstance(event, PhaseChanged):
                phase = event.phase.value
                self._progress.update(row, description=describe())
            elif isinstance(event, HealthWarning):
                health += 1
                self._progress.update(row, description=describe())
            elif isinstance(event, InstallProgress) and event.bytes_total:
                self._progress.update(row, completed=event.bytes_done, total=event.bytes_total)

        episode.bus.subscribe(on_event)

    def started(self, task_id: str, attempt: int, run_id: str) -> None:
        """An attempt submitted to another process (a Ray worker): one row until it finishes."""
        if self._progress is None:
            return
        self._names[run_id] = f"{task_id} a{attempt}"
        self._rows[run_id] = self._progress.add_task(f"{task_id} a{attempt}: on Ray", total=None)

    def phase(self, run_id: str, phase: str) -> None:
        """The phase a Ray worker reports for an attempt (``started`` made its row)."""
        row = self._rows.get(run_id)
        if self._progress is None or row is None:
            return
        self._progress.update(row, description=f"{self._names[run_id]}: {phase} on Ray")

    def finished(self, result: EpisodeResult) -> None:
        self.done += 1
        if self._progress is not None:
            # The rows of this episode's earlier attempts too (a retry is a new row).
            for run_id in [result.run_id, *(Path(p).name for p in result.previous_attempts)]:
                row = self._rows.pop(run_id, None)
                self._names.pop(run_id, None)
                if row is not None:
                    self._progress.remove_task(row)
            self._progress.update(
                self._overall, completed=self.done, description=f"episodes {self.done}/{self.total}"
            )
            earlier = " (recorded earlier)" if result.resumed else ""
            self._progress.console.print(
                f"{result.task_id}{earlier}: {result.summary}{_health_suffix(result)}"
            )
        else:
            earlier = ", recorded earlier, not run again" if result.resumed else ""
            print(
                f"[{self.done}/{self.total}] {result.task_id} (attempt {result.attempt}{earlier}): "
                f"{result.summary}{_health_suffix(result)}",
                file=self.stream,
                flush=True,
            )


def _health_suffix(result: EpisodeResult) -> str:
    words = health_words(result.health)
    return f" ({words})" if words else ""
