"""The opencode-tui agent server under a real NeMo Gym (nemo-gym 0.7.0 from its wheel, scripts/install-gym):
Gym's ``ng_run`` starts it with Gym's ``legacy_agent`` environment server in front, and Gym's own
collector (``ng_collect_rollouts``) sends it rows. Episodes are real: OpenCode, the tasks' scripted
model, bubblewrap (and Docker for the OOM, a real kernel OOM kill in a 1 GiB container). The run
directories the rollouts point at open in the TUI. A request that goes away mid-episode (its socket
closed) ends with the episode's cleanup confirmed and nothing left behind."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from tests.gym_stack import GymStack
from tests.leftovers import left_by

pytestmark = [pytest.mark.slow, pytest.mark.bwrap, pytest.mark.gym, pytest.mark.xdist_group("gym")]

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "sample_tasks"


def _task(root: Path, name: str, verify: dict[str, Any] | None = None, steps: list | None = None) -> None:
    task = root / name
    shutil.copytree(SAMPLES / "hello-file", task)
    data = yaml.safe_load((task / "task.yaml").read_text())
    data["id"] = name
    if verify:
        data["verify"] = verify
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    if steps:
        (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))


@pytest.fixture(scope="module")
def gym(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GymStack]:
    work = tmp_path_factory.mktemp("gym")
    tasks = work / "tasks"
    tasks.mkdir()
    # Three rewards a collector must tell apart: the verifier passes (1), writes 0.5, fails (0).
    _task(tasks, "half", verify={"command": "echo 0.5 > reward.txt", "reward_file": "reward.txt"})
    _task(tasks, "wrong", verify={"command": 'test "$(cat hello.txt)" = "something else"'})
    _task(
        tasks,
        "slow",
        steps=[
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 120", "description": "Wait"}}]},
            {"text": "done"},
        ],
    )
    agent = {
        "concurrency": 2,
        "opencode_tui": {"provider": "local", "runs_dir": str(work / "runs"), "tasks_root": str(tasks)},
    }
    stack = GymStack(work, agent)
    try:
        yield stack
    finally:
        stack.stop()


def _row(**block: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": []}, "opencode_tui": block}


def _by_task(rollouts: list[dict]) -> dict[str, dict]:
    return {r["opencode_tui"]["task_id"]: r for r in rollouts}


async def _opens_in_the_tui(run_dir: Path) -> str:
    """The run directory opened as `opencode-tui open` opens it; the header once the replay loaded."""
    from opencode_tui.app import OpenCodeTUI
    from opencode_tui.screens.run import RunScreen
    from opencode_tui.widgets.header import RunHeader

    app = OpenCodeTUI(run_dir=run_dir)
    async with app.run_test(size=(160, 45)) as pilot:
        deadline = time.monotonic() + 30
        while not (isinstance(app.screen, RunScreen) and not app.screen.replay_loading):
            assert time.monotonic() < deadline, "the replay did not load"
            await pilot.pause(0.05)
        await pilot.pause()
        return app.screen.query_one(RunHeader).render().plain


def test_gym_collects_three_rollouts_with_their_rewards_and_each_opens_in_the_tui(gym: GymStack) -> None:
    rows = [_row(task="hello-file"), _row(task="half"), _row(task="wrong")]
    rollouts, failures, printed = gym.collect(rows, "three")
    assert failures == [] and len(rollouts) == 3, printed[-3000:]
    got = _by_task(rollouts)
    assert {t: r["reward"] for t, r in got.items()} == {"hello-file": 1.0, "half": 0.5, "wrong": 0.0}
    assert all(r["mask_sample"] is False and r["failure_kind"] is None for r in rollouts)
    assert {r["opencode_tui"]["action"] for r in rollouts} == {"scored"}
    # What the collector kept is the Responses API output of the agent's turns.
    output = got["hello-file"]["response"]["output"]
    calls = [i for i in output if i["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["write", "bash"]
    assert json.loads(calls[0]["arguments"])["filePath"] == "/app/hello.txt"
    assert [i["output"] for i in output if i["type"] == "function_call_output"][1] == "Hello from OpenCode\n"
    assert output[-1]["type"] == "message" and "Hello from OpenCode" in output[-1]["content"][0]["text"]
    assert got["hello-file"]["response"]["usage"]["input_tokens"] > 0
    for task, r in got.items():
        run_dir = Path(r["opencode_tui"]["run_dir"])
        assert run_dir.parent == gym.work / "runs" and r["opencode_tui"]["cleanup_confirmed"] is True
        info = RunDirReader(run_dir).info()
        assert info is not None and info.outcome is not None and info.outcome.reward == r["reward"]
        header = asyncio.run(_opens_in_the_tui(run_dir))
        assert task in header and "scored" in header, header


@pytest.mark.docker
def test_an_oom_rollout_carries_its_kind_class_and_action_to_gym(gym: GymStack) -> None:
    [rollout], failures, printed = gym.collect([_row(task="oom", provider="docker")], "oom")
    assert failures == [], printed[-3000:]
    # Gym's vocabulary has this kind under the same name; the engine's own words ride along.
    assert rollout["failure_kind"] == "provider_oom_killed"
    assert rollout["reward"] == 0.0 and rollout["mask_sample"] is False  # the model's doing: a sample
    mine = rollout["opencode_tui"]
    assert (mine["failure_kind"], mine["failure_class"], mine["action"]) == (
        "provider_oom_killed",
        "model",
        "count_as_zero",
    )
    assert mine["provider"] == "docker" and mine["cleanup_confirmed"] is True
    assert "provider_oom_killed" in rollout["failure_reason"] or "OOM" in rollout["failure_reason"]
    assert left_by("docker", mine["run_id"], None) == []


def test_what_the_engine_refuses_comes_back_as_a_clear_error_and_runs_nothing(gym: GymStack) -> None:
    """Each refused row is a failure row of Gym's (HTTP 422, our words in its body); the one good row
    among them is still collected, and it is the only one that made a run directory."""
    before = set((gym.work / "runs").iterdir()) if (gym.work / "runs").exists() else set()
    rows = [
        _row(task="hello-file", command="opencode run"),
        _row(task="hello-file", env={"FOO": "1"}),
        _row(task="hello-file", extra_args=["--thinking"]),
        _row(task="hello-file", modle="qwen"),
        _row(task="no-such-task"),
        {
            "responses_create_params": {"input": "Write a poem instead."},
            "opencode_tui": {"task": "hello-file"},
        },
        {"responses_create_params": {"input": []}},
        _row(task="hello-file", settings={"budgets": {"runs_s": 5}}),
    ]
    good = _row(task="hello-file")
    rollouts, failures, printed = gym.collect([*rows, good], "refused", "+route_failures_to_sidecar=true")
    assert len(rollouts) == 1 and len(failures) == len(rows), printed[-3000:]
    assert rollouts[0]["reward"] == 1.0
    said = {f["_ng_task_index"]: f for f in failures}
    assert {f["_ng_failure_http_status"] for f in failures} == {422}
    words = [json.loads(said[i]["_ng_failure_response_body"])["detail"]["error"] for i in range(len(rows))]
    expected = [
        "`command` is refused",
        "`env` is refused",
        "`extra_args` is refused",
        "modle",
        "task no-such-task does not exist",
        "differs from the task's prompt",
        "has no `opencode_tui` block",
        "budgets.runs_s",
    ]
    for text, want in zip(words, expected, strict=True):
        assert want in text, (want, text)
    after = set((gym.work / "runs").iterdir()) if (gym.work / "runs").exists() else set()
    assert after - before == {Path(rollouts[0]["opencode_tui"]["run_dir"])}  # the refused started nothing


async def _post_run(port: int, body: dict[str, Any]) -> asyncio.StreamWriter:
    data = json.dumps(body).encode()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /run HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    return writer


def _running_run(runs: Path, task: str, before: set[Path]) -> Path | None:
    for run in set(runs.glob(f"{task}-*")) - before:
        events = run / RunFiles.EVENTS
        if events.exists() and any(
            '"tool_call"' in line and '"running"' in line and '"bash"' in line
            for line in events.read_text().splitlines()
        ):
            return run
    return None


def test_a_gym_request_that_goes_away_closes_its_episode_with_cleanup_confirmed(gym: GymStack) -> None:
    runs = gym.work / "runs"
    before = set(runs.glob("slow-*"))

    async def main() -> Path:
        writer = await _post_run(gym.agent_port, _row(task="slow"))
        deadline = time.monotonic() + 120
        while (run := _running_run(runs, "slow", before)) is None:
            assert time.monotonic() < deadline, f"the episode never ran its command:\n{gym.tail()}"
            await asyncio.sleep(0.2)
        writer.close()  # the client goes away while `sleep 120` runs in the sandbox
        await writer.wait_closed()
        return run

    run = asyncio.run(main())
    deadline = time.monotonic() + 90
    while (info := RunDirReader(run).info()) is None or info.outcome is None:
        assert time.monotonic() < deadline, f"the cancelled episode did not end:\n{gym.tail()}"
        time.sleep(0.5)
    result = json.loads((run / RunFiles.RUN_INFO).read_text())
    assert result["outcome"]["failure_kind"] == "run_cancelled", result["outcome"]
    assert result["counts"]["cleanup_confirmed"] is True
    assert result["phase_durations_s"]["agent"] < 60  # stopped, not run to the end of its sleep
    released = [e for e in RunDirReader(run).events() if getattr(e, "step", None) == "sandbox_released"]
    assert released and released[0].state == "ok"
    assert left_by("local", result["run_id"], result.get("sandbox_id")) == []


def test_a_server_config_asking_for_env_or_a_command_is_refused_with_what_to_do() -> None:
    """Gym's own config classes ignore unknown keys; the agent's refuses these three by name (checked
    in Gym's environment, against the real base class)."""
    from tests.gym_stack import gym_venv

    probe = (
        "import sys\n"
        "from opencode_tui_core.gym.agent import OpenCodeTuiAgentConfig as C\n"
        "base = dict(name='a', entrypoint='app.py', host='127.0.0.1', port=1, opencode_tui={'runs_dir': '/tmp/r'})\n"
        "for key, value in (('env', {'A': '1'}), ('command', 'opencode'), ('extra_args', ['-x'])):\n"
        "    try:\n"
        "        C.model_validate(base | {key: value})\n"
        "    except ValueError as exc:\n"
        "        print(str(exc).replace(chr(10), ' '))\n"
        "    else:\n"
        "        print('accepted', key)\n"
        "C.model_validate(base)\n"
        "print('plain ok')\n"
    )
    done = subprocess.run(
        [gym_venv() / "bin" / "python", "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[-1] == "plain ok", done.stdout
    for line, key in zip(lines, ("env", "command", "extra_args"), strict=False):
        assert f"`{key}` is refused" in line, line
