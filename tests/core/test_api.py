"""The Python API (opencode_tui_core.api) on real episodes: real OpenCode, the scripted model, bubblewrap
(and Docker for the cancels). One episode sync and async, its events streamed as they happen, a batch
of three, a cancel from code (the handle's, and the asyncio task's) that ends with cleanup confirmed
and nothing left behind, and bad input refused by name before anything starts."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from opencode_tui_core import api
from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.batch import BatchSummary
from opencode_tui_core.events import EpisodeStarted, ModelCall, OutcomeDecided, PhaseChanged, ToolCall
from opencode_tui_core.failures import Outcome
from tests.leftovers import left_behind

pytestmark = pytest.mark.slow

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
# An agent that is mid-command for a long while: a cancel lands while the supervisor owns a process tree.
SLOW_AGENT = [
    {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 120", "description": "Wait"}}]},
    {"text": "done"},
]


def _slow_task(root: Path, name: str = "slow") -> Path:
    task = root / name
    shutil.copytree(SAMPLES / "hello-file", task)
    data = yaml.safe_load((task / "task.yaml").read_text())
    data["id"] = name
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": SLOW_AGENT}))
    return task


def _hello(root: Path, i: int) -> Path:
    task = root / f"hello-{i}"
    shutil.copytree(SAMPLES / "hello-file", task)
    path = task / "task.yaml"
    path.write_text(path.read_text().replace("id: hello-file", f"id: hello-{i}"))
    return task


def _running_command(event: object) -> bool:
    return isinstance(event, ToolCall) and event.status == "running" and event.tool == "bash"


@pytest.mark.bwrap
def test_one_episode_from_sync_code(tmp_path: Path) -> None:
    result = api.run_episode_sync("hello-file", provider="local", runs_dir=tmp_path / "runs")
    assert (result.action, result.reward, result.exit_code) == (Outcome.SCORED, 1.0, 0)
    assert result.cleanup_confirmed and result.cleanup_proof == "receipt"
    assert Path(result.run_dir).parent == tmp_path / "runs"
    info = json.loads((Path(result.run_dir) / RunFiles.RUN_INFO).read_text())
    assert info["outcome"]["reward"] == 1.0 and info["config"]["sandbox"]["provider"] == "local"


@pytest.mark.bwrap
async def test_events_stream_as_the_episode_runs_and_match_its_record(tmp_path: Path) -> None:
    run = await api.start_episode(str(SAMPLES / "hello-file"), provider="local", runs_dir=tmp_path / "runs")
    seen = []
    running_when_first_call_seen = None
    async with run:
        async for event in run.events():
            if isinstance(event, ModelCall) and running_when_first_call_seen is None:
                running_when_first_call_seen = run.episode.running
            seen.append(event)
    result = await run.result()
    assert result.reward == 1.0 and result.run_dir == str(run.run_dir)
    assert running_when_first_call_seen is True  # streamed live, not handed over at the end
    assert isinstance(seen[0], EpisodeStarted)
    assert [e.seq for e in seen] == sorted(e.seq for e in seen)
    phases = [e.phase.value for e in seen if isinstance(e, PhaseChanged)]
    assert phases[:4] == ["seed", "install", "agent", "closing"]
    [decided] = [e for e in seen if isinstance(e, OutcomeDecided)]
    assert decided.reward == 1.0
    # The same stream the run directory recorded, event for event.
    recorded = (run.run_dir / RunFiles.EVENTS).read_text().splitlines()
    assert [json.loads(line)["seq"] for line in recorded] == [e.seq for e in seen]


@pytest.mark.bwrap
def test_a_batch_of_three_streams_each_attempt_and_resumes_like_the_cli(tmp_path: Path) -> None:
    tasks = [_hello(tmp_path, i) for i in range(3)]

    async def main() -> tuple[api.BatchRun, BatchSummary, list[api.BatchEvent], list[str]]:
        run = await api.start_batch(tasks, provider="local", runs_dir=tmp_path / "runs", jobs=2)
        events: list[api.BatchEvent] = []
        finished: list[str] = []

        async def results() -> None:
            async for r in run.results():
                finished.append(r.task_id)

        collector = asyncio.ensure_future(results())
        async for item in run.events():
            events.append(item)
        await collector
        return run, await run.summary(), events, finished

    run, summary, events, finished = asyncio.run(main())
    assert summary.total == 3 and summary.scored == 3
    assert sorted(r.task_id for r in summary.results) == ["hello-0", "hello-1", "hello-2"]
    assert sorted(finished) == ["hello-0", "hello-1", "hello-2"]
    assert all(r.batch_id == run.batch_id and r.cleanup_confirmed for r in summary.results)
    by_run = {e.run_id for e in events}
    assert by_run == {r.run_id for r in summary.results}
    for r in summary.results:
        mine = [e.event for e in events if e.run_id == r.run_id]
        assert isinstance(mine[0], EpisodeStarted) and any(isinstance(e, OutcomeDecided) for e in mine)
    lines = (tmp_path / "runs" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3
    # The same request again: every task is already scored there (as `run --batch` resumes).
    again = api.run_batch_sync(tasks, provider="local", runs_dir=tmp_path / "runs")
    assert all(r.resumed for r in again.results) and again.scored == 3


async def test_cancel_from_code_confirms_cleanup_and_leaves_nothing(
    tmp_path: Path, episode_provider: str
) -> None:
    run = await api.start_episode(_slow_task(tmp_path), provider=episode_provider, runs_dir=tmp_path / "runs")
    async with run:
        async for event in run.events():
            if _running_command(event):
                break  # the agent's `sleep 120` is running inside the sandbox
        result = await asyncio.wait_for(run.cancel(), 90)
    assert result.cancelled_by == "caller" and result.failure_kind == "run_cancelled"
    assert result.cleanup_confirmed and result.cleanup_proof == "receipt"
    assert result.durations_s["agent"] < 60  # stopped, not run to the end of its sleep
    assert left_behind(episode_provider, result) == []


@pytest.mark.bwrap
async def test_a_cancelled_asyncio_task_closes_its_episode_before_it_ends(tmp_path: Path) -> None:
    """The caller's task is cancelled (a request handler that went away): the episode is cancelled
    like any other and its cleanup confirmed before the cancellation reaches the caller."""
    run = await api.start_episode(_slow_task(tmp_path), provider="local", runs_dir=tmp_path / "runs")
    waiter = asyncio.ensure_future(run.result())
    async for event in run.events():
        if _running_command(event):
            break
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not run.episode.running  # closed already when the cancellation arrived
    result = await run.result()
    assert result.cancelled_by == "caller" and result.cleanup_confirmed
    assert left_behind("local", result) == []


@pytest.mark.bwrap
async def test_leaving_the_block_early_cancels_a_batch_and_starts_nothing_queued(tmp_path: Path) -> None:
    tasks = [_slow_task(tmp_path, f"slow-{i}") for i in range(3)]
    run = await api.start_batch(tasks, provider="local", runs_dir=tmp_path / "runs", jobs=1, attempts=1)
    async with run:
        async for item in run.events():
            if _running_command(item.event):
                break
    summary = await run.summary()
    started = [r for r in summary.results if r.started]
    assert len(started) == 1 and len(summary.results) == 3
    assert started[0].cleanup_confirmed and started[0].cancelled_by == "caller"
    assert all(
        r.summary == "not started: the batch was cancelled by caller"
        for r in summary.results
        if not r.started
    )
    assert left_behind("local", started[0]) == []


# ---- refused before anything starts -----------------------------------------------------------------


def test_an_unknown_option_is_refused_by_name_and_nothing_starts(tmp_path: Path) -> None:
    with pytest.raises(api.RunRefused) as refused:
        api.run_episode_sync("hello-file", modle="qwen", runs_dir=tmp_path / "runs")
    assert "modle" in str(refused.value) and refused.value.exit_code == 2
    assert not (tmp_path / "runs").exists()


async def test_an_unknown_configuration_field_is_refused_by_its_path(tmp_path: Path) -> None:
    with pytest.raises(api.RunRefused) as refused:
        await api.start_batch(["hello-file"], settings={"budgets": {"runs_s": 5}}, runs_dir=tmp_path / "runs")
    assert "budgets.runs_s" in str(refused.value)
    with pytest.raises(api.RunRefused, match="unknown_option"):
        await api.start_episode("hello-file", unknown_option=1)
    assert not (tmp_path / "runs").exists()


def test_what_the_cli_refuses_the_api_refuses_with_the_same_words(tmp_path: Path) -> None:
    with pytest.raises(api.RunRefused, match="does not exist"):
        api.run_episode_sync(tmp_path / "no-such-task")
    with pytest.raises(api.RunRefused, match="--attempts applies to batches only"):
        api.run_episode_sync("hello-file", attempts=2, runs_dir=tmp_path / "runs")
    with pytest.raises(api.RunRefused, match="jobs"):
        api.run_batch_sync(["hello-file"], jobs=0)
    with pytest.raises(api.RunRefused, match="no task given"):
        api.run_batch_sync([])
    assert not (tmp_path / "runs").exists()
