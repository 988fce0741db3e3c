"""Progress for headless batches: a rich live display on stderr when it is a terminal, else
one plain line per finished episode. Data never goes to stderr; diagnostics never to stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from core.episode import Episode, EpisodeResult
from core.events import Event, InstallProgress, PhaseChanged


class BatchProgress:
    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.done = 0
        self.tty = stream.isatty()
        self._progress: Any = None
        self._overall: Any = None
        self._rows: dict[str, Any] = {}

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

        def on_event(event: Event) -> None:
            if isinstance(event, PhaseChanged):
                self._progress.update(
                    row, description=f"{episode.task.id} a{episode.attempt}: {event.phase.value}"
                )
            elif isinstance(event, InstallProgress) and event.bytes_total:
                self._progress.update(row, completed=event.bytes_done, total=event.bytes_total)

        episode.bus.subscribe(on_event)

    def started(self, task_id: str, attempt: int, run_id: str) -> None:
        """An attempt submitted to another process (a Ray worker): one row until it finishes."""
        if self._progress is None:
            return
        self._rows[run_id] = self._progress.add_task(f"{task_id} a{attempt}: on Ray", total=None)

    def finished(self, result: EpisodeResult) -> None:
        self.done += 1
        if self._progress is not None:
            # The rows of this episode's earlier attempts too (a retry is a new row).
            for run_id in [result.run_id, *(Path(p).name for p in result.previous_attempts)]:
                row = self._rows.pop(run_id, None)
                if row is not None:
                    self._progress.remove_task(row)
            self._progress.update(
                self._overall, completed=self.done, description=f"episodes {self.done}/{self.total}"
            )
            self._progress.console.print(f"{result.task_id}: {result.summary}")
        else:
            print(
                f"[{self.done}/{self.total}] {result.task_id} (attempt {result.attempt}): {result.summary}",
                file=self.stream,
                flush=True,
            )
