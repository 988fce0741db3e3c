"""ATIF trajectories (core/export/atif.py): every run directory gets a ``trajectory.json`` that validates
against the JSON Schema written from the ATIF v1.8 specification (tests/schemas/), and reads back into
the project's own model with the same steps, tokens and outcome.

The end-to-end part runs every sample task (and one cancelled episode) for real on Docker: the real
OpenCode binary, the scripted model behind the recording proxy, real faults.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from opencode_tui.cli import main as cli
from opencode_tui_core.batch import BatchControl, run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.events import ToolCall
from opencode_tui_core.export.atif import (
    ATIF_VERSION,
    TRAJECTORY_FILE,
    AtifTrajectory,
    build_trajectory,
    to_messages,
)
from opencode_tui_core.tasks import load_task

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_tasks"
BASE_IMAGE = "opencode-tui/base:bookworm"
FIXTURE_RUNS = ROOT / "tests" / "fixtures" / "runs"
SCHEMA = json.loads((ROOT / "tests" / "schemas" / "atif-v1.8.schema.json").read_text())
# Every task directory under sample_tasks/ (Harbor task directories included).
SAMPLE_TASKS = sorted(p.parent for p in [*SAMPLES.glob("*/task.yaml"), *SAMPLES.glob("harbor/*/task.toml")])


def validate(doc: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(doc)


def test_schema_is_for_the_version_written():
    assert SCHEMA["x-spec-version"] == ATIF_VERSION == "ATIF-v1.8"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_schema_rejects_agent_fields_on_a_user_step():
    """The schema is not vacuous: an agent-only field on a user step, or a gap in the ids, fails."""
    doc = json.loads(build_trajectory(FIXTURE_RUNS / "hello-file").to_json())
    validate(doc)
    bad = json.loads(json.dumps(doc))
    bad["steps"][0]["metrics"] = {"prompt_tokens": 1}
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["steps"][1]["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["steps"][1]["step_id"] = 7
    with pytest.raises(ValueError, match="without gaps"):
        AtifTrajectory.model_validate(bad)


def round_trip(run_dir: Path) -> None:
    """Export → load with our own model → the same steps, tokens and outcome as the run directory."""
    traj = build_trajectory(run_dir)
    text = traj.to_json()
    doc = json.loads(text)
    validate(doc)
    back = AtifTrajectory.model_validate_json(text)
    assert back == traj
    info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else None
    if info is not None:
        assert back.extra is not None and back.extra["outcome"] == info["outcome"]
        assert back.extra["run_id"] == info["run_id"]
    export = run_dir / "opencode" / "export.json"
    if export.exists():
        messages = json.loads(export.read_text())["messages"]
        assistants = [m for m in messages if m["info"]["role"] == "assistant"]
        agent_steps = [s for s in back.steps if s.source == "agent"]
        assert len(agent_steps) == len(assistants)
        assert [s.extra["opencode_message_id"] for s in agent_steps] == [m["info"]["id"] for m in assistants]
        tools = [p["callID"] for m in assistants for p in m["parts"] if p["type"] == "tool"]
        assert [c.tool_call_id for s in agent_steps for c in s.tool_calls or []] == tools
        # Tokens: each agent step's metrics are the sum of the model calls attributed to its message.
        recorded = run_dir / "model_calls.jsonl"  # absent when OpenCode never called the model
        lines = recorded.read_text().splitlines() if recorded.exists() else []
        calls = [json.loads(line) for line in lines if line]
        for s in agent_steps:
            mine = [c for c in calls if c.get("message_id") == s.extra["opencode_message_id"]]
            if mine:
                assert s.llm_call_count == len(mine)
                known = [c["usage"]["tokens_in"] for c in mine if c["usage"]["tokens_in"] is not None]
                assert (s.metrics.prompt_tokens if s.metrics else None) == (sum(known) if known else None)
        totals = [s.metrics.prompt_tokens for s in agent_steps if s.metrics and s.metrics.prompt_tokens]
        assert back.final_metrics is not None
        assert back.final_metrics.total_prompt_tokens == (sum(totals) if totals else None)
    assert back.final_metrics.total_steps == len(back.steps)


@pytest.mark.parametrize("name", ["hello-file", "oom"])
def test_round_trip_on_recorded_runs(name):
    round_trip(FIXTURE_RUNS / name)


def test_hello_file_steps_and_messages():
    traj = build_trajectory(FIXTURE_RUNS / "hello-file")
    assert [s.source for s in traj.steps] == ["user", "agent", "agent", "agent"]
    assert traj.agent.name == "opencode" and traj.agent.version == "1.18.32"
    write = traj.steps[1]
    assert write.tool_calls and write.tool_calls[0].function_name == "write"
    assert write.observation and write.observation.results[0].content == "Wrote file successfully."
    assert write.metrics and (write.metrics.prompt_tokens, write.metrics.completion_tokens) == (1500, 16)
    # The title call (no message) is not a step's, but the final metrics still count it.
    assert traj.final_metrics and traj.final_metrics.total_prompt_tokens == 1500 + 1900 + 2300
    assert traj.final_metrics.extra["model_calls"]["by_kind"] == {"title": 1, "agent": 3}
    msgs = to_messages(traj)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert json.loads(msgs[1]["tool_calls"][0]["function"]["arguments"])["filePath"] == "/app/hello.txt"
    assert msgs[2]["tool_call_id"] == msgs[1]["tool_calls"][0]["id"]


def test_export_command(tmp_path, capsys):
    run = tmp_path / "hello"
    shutil.copytree(FIXTURE_RUNS / "hello-file", run)
    assert cli(["export", str(run)]) == 0
    validate(json.loads((run / TRAJECTORY_FILE).read_text()))
    out = tmp_path / "m.jsonl"
    assert cli(["export", str(run), str(FIXTURE_RUNS / "oom"), "--format", "messages", "-o", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["task_id"] for line in lines] == ["hello-file", "oom"]
    assert lines[1]["outcome"]["failure_kind"] == "provider_oom_killed"
    assert cli(["export", str(tmp_path / "nothing")]) == 2
    assert "not a run directory" in capsys.readouterr().err


# ---- end to end: every sample task's run directory, failed and cancelled ones included ----------


@pytest.fixture(scope="module")
def sample_runs(tmp_path_factory):
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode != 0:
        pytest.skip("docker or the base image is unavailable (scripts/start-dockerd, scripts/build-images)")
    runs = tmp_path_factory.mktemp("runs-atif")
    config = AgentConfig.model_validate({"sandbox": {"provider": "docker"}, "policy": {"max_attempts": 1}})
    tasks = [load_task(p) for p in SAMPLE_TASKS]
    summary = asyncio.run(run_batch(tasks, config, runs_dir=runs / "all", jobs=2))

    # One more, cancelled while its agent is running a command.
    control = BatchControl()

    def watch(episode) -> None:
        def on_event(event) -> None:
            if isinstance(event, ToolCall) and event.status == "running" and control.cancelled_by is None:
                asyncio.get_running_loop().create_task(control.cancel("test"))

        episode.bus.subscribe(on_event)

    # The timeout sample's agent runs a long command; with a budget well above its own 20 s it is the
    # cancel (not the deadline, nor a slow start on a loaded machine) that ends it.
    slow = shutil.copytree(SAMPLES / "timeout", runs / "cancel-task")
    (slow / "task.yaml").write_text((slow / "task.yaml").read_text().replace("run_s: 20", "run_s: 600"))
    cancelled = asyncio.run(
        run_batch(
            [load_task(slow)],
            config,
            runs_dir=runs / "cancelled",
            on_episode=watch,
            control=control,
        )
    )
    return [*summary.results, *cancelled.results]


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(2400)  # the module's batch (every sample task, two at a time) runs in its setup
def test_every_sample_run_directory_has_a_valid_trajectory(sample_runs):
    assert {r.task_id for r in sample_runs} >= {load_task(p).id for p in SAMPLE_TASKS}
    actions = set()
    for r in sample_runs:
        run_dir = Path(r.run_dir)
        doc = json.loads((run_dir / TRAJECTORY_FILE).read_text())
        validate(doc)
        assert doc["extra"]["outcome"]["action"] == r.action.value
        assert doc["extra"]["run_id"] == r.run_id
        if r.failure_kind:
            assert doc["extra"]["failure"]["kind"] == r.failure_kind
        round_trip(run_dir)
        actions.add(r.action.value)
    assert any(r.cancelled_by == "test" for r in sample_runs), "the cancelled episode was not cancelled"
    # The rate-limited call and its retry belong to the same assistant message: one step, two calls.
    [flaky] = [r for r in sample_runs if r.task_id == "model-flaky-429"]
    traj = AtifTrajectory.model_validate_json((Path(flaky.run_dir) / TRAJECTORY_FILE).read_text())
    assert [s.llm_call_count for s in traj.steps if s.source == "agent"][0] == 2
    # The delegate sample's subagent is embedded and referenced from its task call (on docker here).
    [delegate] = [r for r in sample_runs if r.task_id == "delegate"]
    traj = AtifTrajectory.model_validate_json((Path(delegate.run_dir) / TRAJECTORY_FILE).read_text())
    [child] = traj.subagent_trajectories or []
    refs = [
        ref
        for s in traj.steps
        for r in (s.observation.results if s.observation else [])
        for ref in r.subagent_trajectory_ref or []
    ]
    assert [ref.trajectory_id for ref in refs] == [child.trajectory_id] and delegate.reward == 1.0
    assert {"scored", "count_as_zero"} <= actions and len(actions) >= 3, actions


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.timeout(2400)
def test_compaction_follows_the_context_management_convention(sample_runs):
    [r] = [r for r in sample_runs if r.task_id == "long-context"]
    assert r.compactions >= 1
    traj = AtifTrajectory.model_validate_json((Path(r.run_dir) / TRAJECTORY_FILE).read_text())
    markers = [s for s in traj.steps if (s.extra or {}).get("context_management", {}).get("trigger")]
    copied = [s for s in traj.steps if s.is_copied_context]
    assert len(markers) == r.compactions and all(s.source == "system" for s in markers)
    assert copied and all(s.source == "user" for s in copied)
    summaries = [
        s for s in traj.steps if (s.extra or {}).get("context_management", {}).get("role") == "summary"
    ]
    assert summaries and all(s.source == "agent" and s.metrics is not None for s in summaries)
    assert traj.final_metrics and traj.final_metrics.extra["compactions"] == r.compactions
    assert not any(m.get("content") == copied[0].message and m["role"] == "user" for m in to_messages(traj))


def test_model_call_summaries_match_the_whole_records():
    """The export counts calls from ``RunDirReader.call_summaries`` (bodies never built): the same
    fields as the whole record, whatever the field order, and a torn last line is passed over."""
    from opencode_tui_core.artifacts import RunDirReader

    for name in ("hello-file", "oom"):
        lines = (FIXTURE_RUNS / name / "model_calls.jsonl").read_bytes().splitlines()
        summaries = list(RunDirReader(FIXTURE_RUNS / name).call_summaries())
        assert len(summaries) == len(lines)
        for line, part in zip(lines, summaries, strict=True):
            whole = json.loads(line)
            for key in ("kind", "message_id", "status"):
                assert getattr(part, key) == whole[key]
            assert part.usage.model_dump() == whole["usage"]


def test_model_call_summaries_do_not_depend_on_field_order(tmp_path):
    from opencode_tui_core.artifacts import RunDirReader, RunFiles

    record = json.loads((FIXTURE_RUNS / "hello-file" / "model_calls.jsonl").read_bytes().splitlines()[0])
    reordered = dict(reversed(list(record.items())))  # the bodies first, the usage last
    text = json.dumps(reordered) + "\n" + '{"kind": "agent", "usage": {}'  # and a torn last line
    (tmp_path / RunFiles.MODEL_CALLS).write_text(text)
    (tmp_path / RunFiles.EVENTS).write_text("")
    [only] = RunDirReader(tmp_path).call_summaries()
    assert (only.kind, only.message_id, only.usage.model_dump()) == (
        record["kind"],
        record["message_id"],
        record["usage"],
    )


def test_captured_tokens_reach_each_agent_steps_metrics(tmp_path):
    """model.capture_tokens: an agent step's metrics carry the token ids and logprobs of the call that
    produced its message (tokens.jsonl, attributed by message id): the schema's
    ``prompt_token_ids``/``completion_token_ids``/``logprobs``; a retried call's partial tokens are not
    the message's, and a message without captured tokens has none. (The end-to-end episode is in
    tests/core/test_episode_tokens.py.)"""
    from opencode_tui_core.artifacts import RunFiles
    from opencode_tui_core.calls.token_capture import CapturedTokens
    from opencode_tui_core.export.atif_versions import for_version

    run = shutil.copytree(FIXTURE_RUNS / "hello-file", tmp_path / "hello")
    calls = [json.loads(line) for line in (run / RunFiles.MODEL_CALLS).read_text().splitlines()]
    write_msg, cat_msg, _ = [c["message_id"] for c in calls if c["kind"] == "agent"]
    lines = [
        CapturedTokens(call_id="retried", message_id=write_msg, completion_token_ids=[9], complete=False),
        CapturedTokens(
            call_id=calls[1]["call_id"],
            message_id=write_msg,
            complete=True,
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            logprobs=[-0.25, -1.5],
        ),
        CapturedTokens(call_id="title", kind="title", complete=True, completion_token_ids=[7]),
    ]
    (run / RunFiles.TOKENS).write_text("".join(t.model_dump_json() + "\n" for t in lines))
    traj = build_trajectory(run)
    doc = json.loads(traj.to_json())
    validate(doc)
    write, cat = (
        s
        for s in doc["steps"]
        if s["source"] == "agent" and s["extra"]["opencode_message_id"] in (write_msg, cat_msg)
    )
    assert (write["metrics"]["prompt_token_ids"], write["metrics"]["completion_token_ids"]) == (
        [1, 2, 3],
        [4, 5],
    )
    assert write["metrics"]["logprobs"] == [-0.25, -1.5]
    assert write["metrics"]["extra"]["token_ids_call_id"] == calls[1]["call_id"]
    assert write["metrics"]["prompt_tokens"] == 1500  # the usage stays as it was
    assert not {"prompt_token_ids", "completion_token_ids", "logprobs"} & set(cat["metrics"])
    assert AtifTrajectory.model_validate_json(traj.to_json()) == traj
    older, dropped = for_version(doc, "1.7")  # ATIF-v1.7 has the same fields: nothing to drop
    assert dropped == [] and older["steps"] == doc["steps"]
