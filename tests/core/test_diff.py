"""core/diff.py on real run directories: the recorded ``oom`` and ``exit-137`` episodes (Docker, the
pinned OpenCode, the scripted model; scripts/record-fixture-runs) and the ``compaction-storm`` one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.diff import diff_runs, episode_steps
from opencode_tui_core.events import ModelCall, ToolCall

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OOM = FIXTURES / "runs" / "oom"
EXIT_137 = FIXTURES / "more-runs" / "exit-137"
STORM = FIXTURES / "more-runs" / "compaction-storm"


def test_steps_follow_cause_not_arrival():
    """Each tool call comes right after the model call that asked for it (same message id), though
    its event reached the engine after the next call had begun."""
    events = list(RunDirReader(STORM).events())
    steps = episode_steps(events)
    calls = [e for e in events if isinstance(e, ModelCall) and e.kind != "title"]
    tools = {e.call_id for e in events if isinstance(e, ToolCall)}
    assert len(steps) == len(calls) + len(tools)
    for i, step in enumerate(steps):
        if step.kind == "tool_call":
            asking = next(s for s in reversed(steps[:i]) if s.kind == "model_call")
            assert asking.message_id == step.message_id
    assert [s.name for s in steps if s.kind == "tool_call"] == ["read", "bash", "bash", "bash", "write"]


def test_oom_against_exit_137():
    d = diff_runs(OOM, EXIT_137)
    drift = {(x.area, x.key): (x.a, x.b) for x in d.drift}
    assert drift[("task", "task_id")] == ("oom", "exit-137")
    # Same shape (agent, bash, agent, write, agent); the bash commands differ first.
    assert [(r.a.name, r.b.name) for r in d.steps] == [
        ("agent", "agent"),
        ("bash", "bash"),
        ("agent", "agent"),
        ("write", "write"),
        ("agent", "agent"),
    ]
    assert d.first_divergence == 1
    assert "bytearray" in d.steps[1].a.args["command"] and "kill -9" in d.steps[1].b.args["command"]
    assert not d.steps[3].same  # same file, other content
    deltas = {x.key: x for x in d.deltas}
    oom_info, e137_info = RunDirReader(OOM).info(), RunDirReader(EXIT_137).info()
    assert (deltas["outcome"].a, deltas["outcome"].b) == ("count_as_zero", "scored")
    assert (deltas["failure_kind"].a, deltas["failure_kind"].b) == ("provider_oom_killed", None)
    assert deltas["reward"].delta == 1.0
    assert deltas["duration_s"].delta == pytest.approx(e137_info.duration_s - oom_info.duration_s)
    assert deltas["phase.agent_s"].a == oom_info.phase_durations_s["agent"]
    for run, side in ((OOM, "a"), (EXIT_137, "b")):
        calls = [e for e in RunDirReader(run).events() if isinstance(e, ModelCall)]
        assert getattr(deltas["tokens_in"], side) == sum(c.tokens_in for c in calls)
    assert deltas["tokens_in"].b == e137_info.counts["tokens_in"]  # the engine's own count agrees


def test_a_run_against_itself_has_no_drift_and_no_divergence(tmp_path):
    copy = tmp_path / "again"
    shutil.copytree(EXIT_137, copy)
    d = diff_runs(EXIT_137, copy)
    assert d.drift == []
    assert d.first_divergence is None and all(r.same for r in d.steps)
    assert all(not x.changed for x in d.deltas)


def test_config_and_version_drift(tmp_path):
    """A changed setting and another OpenCode version show as drift, the version first."""
    copy = tmp_path / "changed"
    shutil.copytree(EXIT_137, copy)
    info = RunDirReader(copy).info()
    info.config["model"]["context_window"] = 128000
    info.versions["opencode"] = "1.0.0"
    (copy / "run.json").write_text(info.model_dump_json())
    d = diff_runs(EXIT_137, copy)
    assert [(x.area, x.key, x.b) for x in d.drift] == [
        ("version", "opencode", "1.0.0"),
        ("config", "model.context_window", 128000),
    ]


def test_not_a_run_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        diff_runs(tmp_path, EXIT_137)


def test_what_the_agent_was_given_is_task_drift(tmp_path):
    """The task file and the prompt as recorded in the run directory (input/): a changed line is drift."""
    from opencode_tui_core.artifacts import RunFiles

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(EXIT_137, a)
    shutil.copytree(EXIT_137, b)
    for run, limit in ((a, "1g"), (b, "2g")):
        (run / RunFiles.TASK_YAML).parent.mkdir(parents=True, exist_ok=True)
        (run / RunFiles.TASK_YAML).write_text(f"id: exit-137\nlimits:\n  memory: {limit}\n")
        (run / RunFiles.PROMPT).write_text("## Problem statement\nRun a command.\n")
    d = diff_runs(a, b)
    assert [(x.area, x.key, x.a, x.b) for x in d.drift] == [
        ("task", RunFiles.TASK_YAML, "line 3:   memory: 1g", "line 3:   memory: 2g")
    ]
