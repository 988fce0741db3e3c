"""Resume: what a recorded result is the result of (its key), the record of finished episodes
(``results.jsonl`` in the runs directory), and what a re-run does with a task already recorded.

A task already scored with the same content and configuration is skipped (its result comes back with
``resumed=True``); any other recorded task runs again with the next attempt number, its earlier
attempts' run directories left in place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import EpisodeResult
from opencode_tui_core.tasks import Task, task_content_hash

RESULTS_FILE = "results.jsonl"


def config_hash(config: AgentConfig) -> str:
    """The effective configuration, hashed: everything that can change an episode's result (where
    run directories go, the TUI's theme and the executor that runs the episodes cannot: a batch
    started here resumes on a Ray cluster; nor can the debugger's breaks, whose acts mark a run, nor
    the batch's warm pool: a warm sandbox is the same sandbox, prepared earlier)."""
    data = config.model_dump(mode="json", exclude={"runs_dir", "theme", "executor", "debug", "batch"})
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def resume_key(task: Task, config: AgentConfig) -> str:
    """What a recorded result is the result of: the task's content and the effective configuration.

    Not the task id: a task edited in place (its verify command, a file) or run with another model
    is another experiment and runs again.
    """
    return f"{task.id}:task={task_content_hash(task)[:20]}:config={config_hash(config)[:20]}"


def results_line(key: str, result: EpisodeResult) -> str:
    """One line of ``results.jsonl`` (``load_previous`` reads it back)."""
    return json.dumps({"task_key": key, **result.model_dump(mode="json")}) + "\n"


def recorded_results(runs_dir: Path) -> Iterator[tuple[str, EpisodeResult]]:
    """Every line of ``results.jsonl`` in order: (task key, result)."""
    path = runs_dir / RESULTS_FILE
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            key = rec.pop("task_key")
            result = EpisodeResult.model_validate(rec)
        except (ValueError, KeyError):
            continue  # a torn last line from an interrupted run is not fatal
        yield key, result


def load_previous(runs_dir: Path) -> dict[str, EpisodeResult]:
    """The last recorded result per task key (resume)."""
    return {key: result for key, result in recorded_results(runs_dir) if result.started}


@dataclass
class Resumption:
    """What a batch does with one task given its recorded result (``prior``, None: never recorded)."""

    prior: EpisodeResult | None

    @property
    def skip(self) -> bool:
        """Already scored: not run again."""
        return self.prior is not None and self.prior.action.is_sample

    def skipped(self) -> EpisodeResult:
        assert self.prior is not None
        return self.prior.model_copy(update={"resumed": True})

    @property
    def first_attempt(self) -> int:
        return self.prior.attempt + 1 if self.prior is not None else 1

    def earlier_attempts(self) -> list[str]:
        """The run directories of the recorded attempts, oldest last (they come before this run's)."""
        if self.prior is None:
            return []
        return [self.prior.run_dir, *self.prior.previous_attempts]


def load_batch(runs_dir: Path, batch_id: str) -> list[EpisodeResult]:
    """Every result ``results.jsonl`` records for batch ``batch_id``, in the order recorded."""
    path = runs_dir / RESULTS_FILE
    if not path.exists():
        return []
    out: list[EpisodeResult] = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            rec.pop("task_key", None)
            result = EpisodeResult.model_validate(rec)
        except ValueError:
            continue  # a torn last line from an interrupted run is not fatal
        if result.batch_id == batch_id:
            out.append(result)
    return out
