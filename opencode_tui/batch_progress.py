"""Progress for headless batches, on stderr: a rich live display when it is a terminal, and in both
cases one line when an attempt starts (a retry says why: the previous attempt's outcome), one when it
ends, one per finished episode with the count. Data never goes to stderr; diagnostics never to stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from opencode_tui_core.episode import Episode, EpisodeResult
from opencode_tui_core.events import Event, HealthWarning, InstallProgress, OutcomeDecided, PhaseChanged


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
        self._ended: dict[str, str] = {}  # task id → how its last attempt ended (a retry's reason)

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

    def say(self, line: str) -> None:
        """One line on stderr (above the live display, when there is one)."""
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def _start(self, task_id: str, attempt: int, run_id: str, where: str = "") -> None:
        before = self._ended.pop(task_id, None)
        if attempt > 1 and before is not None:
            self.say(f"{task_id} a{attempt}: retrying{where} after {before} in a{attempt - 1}, as {run_id}")
        elif attempt > 1:
            self.say(f"{task_id} a{attempt}: retrying{where} as {run_id}")
        else:
            self.say(f"{task_id} a{attempt}: started{where} as {run_id}")

    def _end(self, task_id: str, attempt: int, outcome: OutcomeDecided) -> None:
        self._ended[task_id] = outcome.failure_kind or str(outcome.action)
        why = f" ({outcome.failure_kind})" if outcome.failure_kind else ""
        reward = "" if outcome.reward is None else f", reward {outcome.reward:g}"
        self.say(f"{task_id} a{attempt}: ended: {outcome.action}{why}{reward}")

    def attach(self, episode: Episode) -> None:
        task_id, attempt = episode.task.id, episode.attempt
        self._start(task_id, attempt, episode.run_id)
        if self._progress is None:
            episode.bus.subscribe(
                lambda event: (
                    self._end(task_id, attempt, event) if isinstance(event, OutcomeDecided) else None
                )
            )
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
            elif isinstance(event, OutcomeDecided):
                self._end(task_id, attempt, event)

        episode.bus.subscribe(on_event)

    def started(self, task_id: str, attempt: int, run_id: str) -> None:
        """An attempt submitted to another process (a Ray worker): one row until it finishes (how each
        attempt ended is not reported from there: the finished line says how the last one did)."""
        self._start(task_id, attempt, run_id, " on Ray")
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
        self._ended.pop(result.task_id, None)
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
    """Health warnings, and what a person did through the debugger (issue 27), in parentheses."""
    parts = [health_words(result.health)]
    if result.interventions:
        acts = f"debugger: {result.interventions} intervention" + ("s" if result.interventions != 1 else "")
        if result.model_calls_answered:
            acts += f", {result.model_calls_answered} answered by hand"
        if result.model_calls_edited:
            acts += f", {result.model_calls_edited} edited by hand"
        parts.append(acts)
    words = "; ".join(p for p in parts if p)
    return f" ({words})" if words else ""
