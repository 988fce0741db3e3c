"""Reruns and forks (issue 28) on real episodes: real OpenCode, the scripted model, Docker and bubblewrap
sandboxes. The parent is a recorded run of ``fix-bug`` with workspace digests; its children are
answered from its ``model_calls.jsonl`` through the recording proxy. A SIGTERM during a fork's replay
goes to a real ``opencode-tui fork`` process.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode, child_inputs, load_parent
from opencode_tui_core.episode.digests import recorded_digests
from opencode_tui_core.events import ToolCall
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.tasks import load_task
from tests.core.conftest import require_docker_image
from tests.leftovers import left_by

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_tasks"
# fix-bug's trajectory with a file written at step 2: the workspace at step 3 differs from step 1's.
NOTES = {
    "tool_calls": [
        {"name": "write", "arguments": {"filePath": "{workdir}/NOTES.md", "content": "bug in add\n"}}
    ]
}


def _steps_with_notes() -> list:
    steps = yaml.safe_load((SAMPLES / "fix-bug" / "trajectory.yaml").read_text())["steps"]
    return [steps[0], NOTES, *steps[1:]]


def _copy_task(dest: Path, steps: list | None = None) -> Path:
    shutil.copytree(SAMPLES / "fix-bug", dest)
    if steps is not None:
        (dest / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    return dest


def _parent_run(task_dir: Path, provider: str, runs_dir: Path) -> Path:
    config = AgentConfig.model_validate(
        {
            "sandbox": {"provider": provider},
            "policy": {"max_attempts": 1},
            "debug": {"workspace_digests": True},
        }
    )
    result = asyncio.run(Episode(load_task(task_dir), config, runs_dir=runs_dir).run())
    assert result.reward == 1.0, result.summary
    return Path(result.run_dir)


def _child(parent_dir: Path, lineage: str, **kw):
    parent = load_parent(parent_dir)
    config, task, plan = child_inputs(parent, lineage=lineage, **kw)
    episode = Episode(task, config, runs_dir=parent_dir.parent, child_of=(plan, parent))
    return asyncio.run(episode.run())


def _tool_calls(run_dir: Path) -> list[tuple[str, str]]:
    return [
        (e.tool, json.dumps(e.input, sort_keys=True))
        for e in RunDirReader(run_dir).events()
        if isinstance(e, ToolCall) and e.status == "completed"
    ]


def _agent_calls(run_dir: Path):
    calls = [c for c in RunDirReader(run_dir).model_calls() if c.kind == "agent"]
    return sorted(calls, key=lambda c: c.started_at)


def _digests(run_dir: Path) -> dict[int, str]:
    return recorded_digests((run_dir / RunFiles.WORKSPACE_DIGESTS).read_text().splitlines())


@pytest.fixture(
    scope="module",
    params=[pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)],
)
def parent(request, tmp_path_factory) -> tuple[str, Path]:
    """One recorded fix-bug run per provider (workspace digests on), shared by the tests below."""
    if request.param == "docker":
        require_docker_image()
    base = tmp_path_factory.mktemp(f"lineage-{request.param}")
    task = _copy_task(base / "task", _steps_with_notes())
    return request.param, _parent_run(task, request.param, base / "runs")


def test_rerun_reproduces_the_tool_calls_and_the_reward(parent):
    provider, parent_dir = parent
    result = _child(parent_dir, "rerun")
    child_dir = Path(result.run_dir)
    assert (result.reward, result.action.value, result.cleanup_confirmed) == (1.0, "scored", True)
    assert _tool_calls(child_dir) == _tool_calls(parent_dir) and len(_tool_calls(child_dir)) == 5
    info = RunDirReader(child_dir).info()
    assert info.lineage == "rerun" and info.parent.run_id == parent_dir.name and info.fork_step is None
    assert info.replay.reproduced is True and info.replay.divergence_step is None, info.replay
    assert info.replay.workspace_check == "matches at every step"
    assert info.config["sandbox"]["provider"] == provider
    # every call was answered from the record (none went to the scripted model), in the recorded order
    calls = sorted(RunDirReader(child_dir).model_calls(), key=lambda c: c.started_at)
    recorded = {c.call_id: c for c in RunDirReader(parent_dir).model_calls()}
    assert calls and all(c.replayed_from in recorded for c in calls)
    assert [recorded[c.replayed_from].kind for c in calls if c.kind == "agent"] == ["agent"] * 6
    assert _digests(child_dir) == _digests(parent_dir)
    # the run that is no replay keeps its records as they were: no lineage keys, no replayed_from
    parent_json = json.loads((parent_dir / RunFiles.RUN_INFO).read_text())
    assert "lineage" not in parent_json and "replay" not in parent_json
    assert "replayed_from" not in (parent_dir / RunFiles.MODEL_CALLS).read_text()


def test_fork_at_step_2_has_the_files_of_step_2_and_goes_live_after_the_replayed_calls(parent):
    _, parent_dir = parent
    result = _child(parent_dir, "fork", fork_step=2)
    child_dir = Path(result.run_dir)
    assert (result.reward, result.cleanup_confirmed) == (1.0, True), result.summary
    info = RunDirReader(child_dir).info()
    assert (info.lineage, info.fork_step, info.parent.run_dir) == ("fork", 2, str(parent_dir.resolve()))
    assert info.replay.live_from == 3 and info.replay.workspace_check == "matches at step 3", info.replay
    # the workspace before the first live call is the parent's after step 2's tools ran
    child_digests, parent_digests = _digests(child_dir), _digests(parent_dir)
    assert child_digests[3] == parent_digests[3] and child_digests[1] == parent_digests[1]
    assert parent_digests[3] != parent_digests[2] == parent_digests[1]  # NOTES.md, written at step 2
    calls = _agent_calls(child_dir)
    assert [c.replayed_from is not None for c in calls] == [True, True, False, False, False, False]
    first_live = calls[2]
    last_replayed_end = max(c.started_at.timestamp() + (c.latency_s or 0) for c in calls[:2])
    assert first_live.started_at.timestamp() >= last_replayed_end
    # the live part was the scripted model's (its tool-call ids), the replayed part the record's
    assert "call_s2_0" in str(first_live.response_body)
    warnings = [e.code for e in RunDirReader(child_dir).events() if e.type == "warning"]
    assert {"replay_started", "replay_live", "replay_workspace_matched"} <= set(warnings)  # notes, not risks
    assert "replay_workspace" not in warnings  # the warning is kept for a workspace that differs


def test_fork_say_puts_the_text_into_the_first_live_request(parent):
    _, parent_dir = parent
    said = "Also mention PELICAN-7 when you are done."
    result = _child(parent_dir, "fork", fork_step=2, say=said)
    child_dir = Path(result.run_dir)
    info = RunDirReader(child_dir).info()
    assert info.replay.said == said and result.reward is not None, (info.replay, result.summary)
    calls = _agent_calls(child_dir)
    assert all(said not in json.dumps(c.request_body) for c in calls[:2])  # the replayed ones: as recorded
    assert said in json.dumps(calls[2].request_body)  # the first live request carries it
    assert result.human_intervened is False  # a planned input, recorded in run.json, not a person's act


def test_rerun_of_a_changed_task_stops_at_the_step_whose_tool_result_changed(parent, tmp_path):
    _, parent_dir = parent
    info = RunDirReader(parent_dir).info()
    calc = Path(info.task_dir) / "files" / "calc.py"
    original = calc.read_text()
    try:
        # the bug fixed in the task itself: step 1's test run now passes, so step 2's request differs
        calc.write_text(original.replace("return a - b", "return a + b"))
        refused = subprocess.run(
            [sys.executable, "-m", "opencode_tui.cli", "rerun", str(parent_dir), "--batch"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=60,
        )
        assert refused.returncode == ExitCode.USAGE and "changed since" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and refused.stdout == ""
        result = _child(parent_dir, "rerun", allow_changed_task=True)
    finally:
        calc.write_text(original)
    child = RunDirReader(Path(result.run_dir)).info()
    assert child.replay.divergence_step == 2 and child.replay.reproduced is False, child.replay
    assert "(a tool result)" in child.replay.divergence and child.replay.divergence_diff
    assert (result.failure_kind, result.cleanup_confirmed) == ("replay_diverged", True)
    assert result.reward is None  # a stopped rerun is no sample


# The replayed step 1 runs for a while: a signal during the fork's replay finds a command running.
SLOW = [
    {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 8", "description": "Wait"}}]},
    NOTES,
    {"text": "done"},
]


def _replaying_child(runs_dir: Path, parent_dir: Path) -> Path | None:
    """The fork's run directory once its replayed step 1 (the sleep) is running."""
    for d in runs_dir.iterdir():
        events = d / RunFiles.EVENTS
        if d == parent_dir or not events.is_file():
            continue
        for line in events.read_text().splitlines():
            e = json.loads(line)
            if e.get("type") == "tool_call" and e.get("tool") == "bash" and e.get("status") == "running":
                return d
    return None


@pytest.mark.parametrize(
    ("provider", "sig"),
    [
        pytest.param("docker", signal.SIGTERM, marks=pytest.mark.docker),
        pytest.param("local", signal.SIGTERM, marks=pytest.mark.bwrap),
        pytest.param("local", signal.SIGHUP, marks=pytest.mark.bwrap),
    ],
)
def test_a_signal_during_a_fork_replay_closes_with_confirmed_cleanup(request, tmp_path, provider, sig):
    if provider == "docker":
        request.getfixturevalue("docker_base_image")
    task = _copy_task(tmp_path / "task", SLOW)
    config = AgentConfig.model_validate(
        {
            "sandbox": {"provider": provider},
            "policy": {"max_attempts": 1},
            "debug": {"workspace_digests": True},
        }
    )
    runs = tmp_path / "runs"
    parent_dir = Path(asyncio.run(Episode(load_task(task), config, runs_dir=runs).run()).run_dir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "opencode_tui.cli", "fork", str(parent_dir), "--at", "2", "--batch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 120
        child_dir = None
        while child_dir is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            child_dir = _replaying_child(runs, parent_dir)
        assert child_dir is not None, "the fork never reached its replayed command"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.for_cancel(sig.name), err
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["cleanup_confirmed"], result["cancelled_by"]) == (True, sig.name), err
    info = RunDirReader(child_dir).info()
    assert info.outcome is not None and info.lineage == "fork" and info.replay.live_from is None
    assert info.replay.replayed >= 1  # stopped inside the replay, before any live call
    assert left_by(provider, result["run_id"], result["sandbox_id"]) == []


# -- a fork at a step whose recorded stream was cut ----------------------------------------------------


@pytest.fixture(scope="module")
def cut_parent(tmp_path_factory) -> Path:
    """A fix-bug run (local provider) whose model dropped the connection mid-stream twice: at its first
    request and at its edit step's (the scripted model's ``drop``: the first chunk, then the connection
    closed). OpenCode asked again each time, so the run still scores; its agent calls are 1 (cut),
    2 (the tests), 3 (read), 4 (cut), 5 (the edit), 6 (the tests again), 7 (done)."""
    steps = yaml.safe_load((SAMPLES / "fix-bug" / "trajectory.yaml").read_text())["steps"]
    steps[0]["fault"] = {"drop": True}
    steps[2]["fault"] = {"drop": True}
    base = tmp_path_factory.mktemp("lineage-cut")
    return _parent_run(_copy_task(base / "task", steps), "local", base / "runs")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.bwrap
def test_fork_at_a_cut_step_says_so_and_starts_from_the_last_complete_step(cut_parent):
    from opencode_tui_core.model.replay import fork_point

    records = list(RunDirReader(cut_parent).model_calls())
    agent = _agent_calls(cut_parent)
    assert [c.error is not None and "upstream stream broken" in c.error for c in agent] == [
        True, False, False, True, False, False, False,
    ]  # fmt: skip
    assert fork_point(records, 3).why is None and fork_point(records, 3).step == 3
    runs_before = set(cut_parent.parent.iterdir())
    done = _cli("fork", str(cut_parent), "--at", "4", "--batch")
    assert done.returncode == ExitCode.OK, done.stderr
    said = [ln for ln in done.stderr.splitlines() if "--at 4" in ln]
    assert len(said) == 1, done.stderr
    assert said[0].startswith(f"opencode-tui fork: {cut_parent.name}: --at 4: step 4's recorded answer was ")
    assert "cut mid-stream (upstream stream broken" in said[0]
    assert said[0].endswith("the fork starts from step 3, the last complete step")
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert (line["fork_step"], line["asked_step"], line["reward"]) == (3, 4, 1.0)
    child = Path(line["run_dir"])
    assert child not in runs_before
    info = RunDirReader(child).info()
    assert info is not None and info.fork_step == 3 and info.replay is not None
    assert info.replay.fork_moved == said[0].split(": ", 2)[2] and info.replay.live_from == 4
    calls = _agent_calls(child)
    assert [c.replayed_from for c in calls[:3]] == [a.call_id for a in agent[:3]]
    assert all(c.replayed_from is None for c in calls[3:])
    warnings = [e for e in RunDirReader(child).events() if getattr(e, "code", None) == "replay_fork_moved"]
    assert len(warnings) == 1 and "step 4's recorded answer" in warnings[0].message


@pytest.mark.bwrap
def test_fork_where_no_complete_step_comes_before_the_cut_is_refused(cut_parent):
    runs_before = set(cut_parent.parent.iterdir())
    done = _cli("fork", str(cut_parent), "--at", "1", "--batch")
    assert done.returncode == ExitCode.USAGE and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--at 1: step 1's recorded answer was cut mid-stream" in lines[0]
    assert "no step before it is complete: nothing to fork from" in lines[0]
    assert set(cut_parent.parent.iterdir()) == runs_before  # nothing started


@pytest.mark.bwrap
def test_a_truncated_or_abandoned_record_before_the_fork_point_moves_it(cut_parent):
    """A record the proxy capped, or whose client hung up (a stalled stream), cannot be answered as it
    was: a fork past it starts before it (the parent's real records, one of them marked so)."""
    from opencode_tui_core.model.replay import fork_point

    records = sorted(RunDirReader(cut_parent).model_calls(), key=lambda r: r.started_at)
    agent = [r for r in records if r.kind == "agent"]
    for mark, words in (
        ({"truncated": True}, "was cut at the record's size limit"),
        ({"client_disconnected": True, "error": "client disconnected before the response completed"},
         "OpenCode hung up before it completed"),
    ):  # fmt: skip
        marked = [r.model_copy(update=mark) if r is agent[5] else r for r in records]
        point = fork_point(marked, 6)
        assert (point.asked, point.step) == (6, 5) and point.why is not None and words in point.why
        assert fork_point(marked, 5).why is None


@pytest.mark.parametrize(("recorded", "child"), [(None, None), (False, True), (True, True)])
def test_a_childs_digests_are_on_and_an_unset_parent_setting_stays_unset(tmp_path, recorded, child):
    """Digests are always on in a child. A parent that left the setting unset (which means on) keeps
    it unset in the child, so `diff` shows no configuration drift where there is none; a parent that
    turned them off is overridden. (The recorded fix-bug run of tests/fixtures/lineage-runs, its task
    copied to where its record says.)"""
    family = Path(__file__).resolve().parents[1] / "fixtures" / "lineage-runs"
    parent_dir = tmp_path / "runs" / "parent"
    shutil.copytree(family / "fix-bug-20261202-095618-65ebfb-a1", parent_dir)
    task = _copy_task(tmp_path / "task")
    info = json.loads((parent_dir / "run.json").read_text())
    info["task_dir"] = str(task)
    info["config"]["debug"]["workspace_digests"] = recorded
    (parent_dir / "run.json").write_text(json.dumps(info))
    config, _task, _plan = child_inputs(load_parent(parent_dir), lineage="rerun", allow_changed_task=True)
    assert config.debug.workspace_digests is child
