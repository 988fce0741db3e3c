"""A human hand marks the sample: a real shell (the provider's PTY) opened in a real episode's sandbox.

The task's model never creates the verified file; a person does, through the shell, while the agent
runs. The verifier then passes, and the episode must say a human intervened instead of scoring it.
A shell opened after the run (a kept sandbox, post-mortem) marks nothing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.events import Event, ToolCall
from opencode_tui_core.failures import Outcome
from opencode_tui_core.tasks import load_task

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def _episode(tmp_path: Path, provider: str, keep: bool = False) -> Episode:
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "hello-file", task)
    data = yaml.safe_load((task / "task.yaml").read_text())
    data["verify"] = {"command": "test -f done.txt", "timeout": 30}
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    steps = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 6", "description": "Think"}}]},
        {"text": "I could not finish."},
    ]
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": provider, "keep_sandbox": keep}, "policy": {"max_attempts": 1}}
    )
    return Episode(load_task(task), config, runs_dir=tmp_path / "runs")


async def _type_in_shell(episode: Episode, line: str) -> None:
    shell = await episode.open_shell(100, 30)
    try:
        await shell.write(line.encode() + b"; echo DONE-$((40+2))\n")
        seen = b""
        async with asyncio.timeout(20):
            while b"DONE-42" not in seen:
                seen += await shell.read()
    finally:
        await shell.close()


def test_shell_during_the_agent_marks_the_sample(tmp_path, episode_provider):
    episode = _episode(tmp_path, episode_provider)

    async def main():
        busy = asyncio.Event()

        def on_event(event: Event) -> None:
            if isinstance(event, ToolCall) and event.status == "running":
                busy.set()

        episode.bus.subscribe(on_event)
        run = asyncio.ensure_future(episode.run())
        async with asyncio.timeout(120):
            await busy.wait()
        await _type_in_shell(episode, "touch done.txt")
        return await run

    result = asyncio.run(main())
    # The verifier did pass — because of the hand, not the agent — and the outcome says so.
    events = list(RunDirReader(Path(result.run_dir)).events())
    [verified] = [e for e in events if e.type == "verification"]
    assert verified.passed is True
    assert (result.action, result.reward, result.failure_kind) == (
        Outcome.KEEP_UNKNOWN,
        None,
        "human_intervened",
    )
    assert result.human_intervened is True and result.failure_stage == "agent"
    assert RunDirReader(Path(result.run_dir)).info().human_intervened is True
    [opened] = [e for e in events if e.type == "shell_opened"]
    [closed] = [e for e in events if e.type == "shell_closed"]
    assert (opened.phase, opened.marks_sample) == ("agent", True)
    assert closed.bytes_in > 0 and closed.duration_s > 0
    cast = (Path(result.run_dir) / opened.cast).read_text().splitlines()
    assert json.loads(cast[0])["version"] == 2
    typed = "".join(json.loads(line)[2] for line in cast[1:] if json.loads(line)[1] == "i")
    assert "touch done.txt" in typed


def test_post_mortem_shell_marks_nothing(tmp_path, episode_provider):
    episode = _episode(tmp_path, episode_provider, keep=True)

    async def main():
        result = await episode.run()
        try:
            await _type_in_shell(episode, "touch done.txt")
        finally:
            assert episode.sandbox is not None
            await episode.sandbox.release()
        return result

    result = asyncio.run(main())
    assert (result.action, result.reward, result.human_intervened) == (Outcome.SCORED, 0.0, False)
    info = RunDirReader(Path(result.run_dir)).info()
    assert info.human_intervened is False and info.outcome.action == Outcome.SCORED
    opened = [e for e in RunDirReader(Path(result.run_dir)).events() if e.type == "shell_opened"]
    assert [(e.phase, e.marks_sample) for e in opened] == [("done", False)]
