"""Episode-health warnings end to end: each kind triggered by a scripted trajectory against the real
OpenCode binary in a real bubblewrap sandbox (the local provider), through the recording proxy.

All trajectories run as one batch (jobs=2) with thresholds lowered in the config, so the whole file
takes about as long as a few short episodes. Each test then checks the warnings in the run directory
(events.jsonl), the batch JSON line (``health``) and run.json's counts, and that an episode doing
nothing odd gets no warning at all.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.events import HealthWarning
from opencode_tui_core.health import health_counts
from opencode_tui_core.tasks import load_task

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def _bash(command: str, **extra) -> dict:
    return {"name": "bash", "arguments": {"command": command, "description": command[:40], **extra}}


def _read(name: str) -> dict:
    return {"name": "read", "arguments": {"filePath": "{workdir}/" + name}}


def _write_done() -> dict:
    return {"name": "write", "arguments": {"filePath": "{workdir}/done.txt", "content": "done\n"}}


# task id -> (files in the workdir, trajectory steps)
TRAJECTORIES: dict[str, tuple[dict[str, str], list[dict]]] = {
    # Six distinct reads (a threshold of 5), no edit until the end.
    "health-reads": (
        {f"f{i}.txt": f"file {i}\n" for i in range(6)},
        [{"tool_calls": [_read(f"f{i}.txt")]} for i in range(6)]
        + [{"tool_calls": [_write_done()]}, {"text": "Read everything, then wrote done.txt."}],
    ),
    # One command silent for 20 s (a threshold of 8 s: well above how long a quick command takes on a
    # loaded machine, which would be silence too), then it prints.
    "health-silent": (
        {},
        [
            {"tool_calls": [_bash("sleep 20; echo awake")]},
            {"tool_calls": [_write_done()]},
            {"text": "done.txt is written."},
        ],
    ),
    # The same bash call three times, each its own tool call.
    "health-repeat": (
        {},
        [{"tool_calls": [_bash("ls -1")]} for _ in range(3)]
        + [{"tool_calls": [_write_done()]}, {"text": "done.txt is written."}],
    ),
    # The model answers 429 four times before serving the step (a threshold of 3 within 120 s).
    "health-retry": (
        {},
        [
            {"tool_calls": [_write_done()], "fault": {"status": 429, "times": 4, "retry_after": 0.5}},
            {"text": "done.txt is written."},
        ],
    ),
    # The control: an ordinary short episode.
    "health-clean": (
        {"a.txt": "a\n"},
        [
            {"tool_calls": [_read("a.txt")]},
            {"tool_calls": [_bash("cat a.txt")]},
            {"tool_calls": [_write_done()]},
            {"text": "done.txt is written."},
        ],
    ),
}

THRESHOLDS = {
    "reads_without_edits": 5,
    "command_silent_s": 8.0,
    "repeated_tool_call": 3,
    "retry_storm_count": 3,
    "retry_storm_window_s": 120.0,
}


def _make_task(root: Path, task_id: str, files: dict[str, str], steps: list[dict]) -> Path:
    d = root / task_id
    (d / "files").mkdir(parents=True)
    for name, text in files.items():
        (d / "files" / name).write_text(text)
    (d / "trajectory.yaml").write_text(yaml.safe_dump({"title": task_id, "steps": steps}))
    (d / "task.yaml").write_text(
        yaml.safe_dump(
            {
                "id": task_id,
                "problem_statement": "Look around, then write done.txt containing done.",
                "workdir": "/app",
                "files": "files",
                "verify": {"command": 'test "$(cat done.txt)" = done', "timeout": 30},
                "model": {"trajectory": "trajectory.yaml"},
            }
        )
    )
    return d


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("health-tasks")
    tasks = [load_task(_make_task(root, tid, files, steps)) for tid, (files, steps) in TRAJECTORIES.items()]
    tasks.append(load_task(SAMPLES / "compaction-storm"))
    runs = tmp_path_factory.mktemp("health-runs")
    config = AgentConfig.model_validate(
        {
            "sandbox": {"provider": "local"},
            # Nobody can answer OpenCode's own question about a thrice-repeated call (its doom-loop
            # check): allow-all lets the repeats run so the engine's warning is what is tested.
            "runtime": {"permissions": "allow-all"},
            "health": THRESHOLDS,
        }
    )
    summary = asyncio.run(run_batch(tasks, config, runs_dir=runs, jobs=2))
    return runs, summary, {r.task_id: r for r in summary.results}


def _warnings(result) -> list[HealthWarning]:
    return [e for e in RunDirReader(Path(result.run_dir)).events() if isinstance(e, HealthWarning)]


def test_every_episode_still_scores(batch):
    """Warnings never decide the outcome: every one of these episodes passes."""
    _, _, results = batch
    assert {t: (r.action, r.reward) for t, r in results.items()} == {
        t: ("scored", 1.0) for t in [*TRAJECTORIES, "compaction-storm"]
    }


@pytest.mark.parametrize(
    ("task_id", "kind"),
    [
        ("health-reads", "reads_without_edits"),
        ("health-silent", "command_silent"),
        ("health-repeat", "repeated_tool_call"),
        ("health-retry", "retry_storm"),
        ("compaction-storm", "compaction_storm"),
    ],
)
def test_each_trajectory_raises_its_warning_and_only_it(batch, task_id, kind):
    _, _, results = batch
    result = results[task_id]
    warnings = _warnings(result)
    assert {w.kind.value for w in warnings} == {kind}, [w.message for w in warnings]
    # One count, three places: the event stream, the batch line, run.json.
    assert result.health == health_counts(warnings)
    info = RunDirReader(Path(result.run_dir)).info()
    assert info.counts["health"] == result.health


def test_warning_details(batch):
    _, _, results = batch
    (reads,) = _warnings(results["health-reads"])
    assert reads.data["reads"] == 5
    (silent,) = _warnings(results["health-silent"])
    assert silent.data["command"] == "sleep 20; echo awake"
    assert 8.0 <= silent.data["silent_s"] < 20.0
    (repeat,) = _warnings(results["health-repeat"])
    assert repeat.data == {"tool": "bash", "input": {"command": "ls -1", "description": "ls -1"}, "times": 3}
    (retry,) = _warnings(results["health-retry"])
    assert retry.data["status"] == 429 and retry.data["calls"] == 3
    storm = _warnings(results["compaction-storm"])
    reasons = [w.data["reason"] for w in storm]
    # Four compactions in a row: the count crosses 3 once; three times the answer right after a
    # compaction still reports 250,000 tokens (the fourth is followed by a normal-sized step).
    assert reasons.count("count") == 1
    assert reasons.count("near_limit_after_compaction") == 3
    assert results["compaction-storm"].compactions == 4


def test_a_clean_episode_has_no_warning(batch):
    _, _, results = batch
    assert results["health-clean"].health == {}
    assert _warnings(results["health-clean"]) == []


def test_batch_summary_and_results_file_count_them(batch):
    runs, summary, results = batch
    lines = [json.loads(line) for line in (runs / "results.jsonl").read_text().splitlines()]
    assert {line["task_id"]: line["health"] for line in lines} == {t: r.health for t, r in results.items()}
    assert summary.health_by_kind["compaction_storm"] == 4
    assert "health warnings:" in summary.line()


def test_batch_progress_line_counts_them(batch):
    """The plain progress (stderr when it is not a terminal) names the warnings of each episode."""
    import io

    from opencode_tui.batch_progress import BatchProgress

    _, _, results = batch
    out = io.StringIO()
    progress = BatchProgress(2, out)
    progress.finished(results["compaction-storm"])
    progress.finished(results["health-clean"])
    first, second = out.getvalue().splitlines()
    assert first.endswith("scored: reward 1 (health: compaction_storm x4)")
    assert second.endswith("scored: reward 1")
