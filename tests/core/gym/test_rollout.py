"""What a Gym row asks of the engine and what the engine tells Gym back (opencode_tui_core.gym.rollout):
no Gym needed. Refusals name the field and what to do; options merge server under row; an episode's
result becomes Gym's verify fields (Gym's vocabulary where it has the kind, namespaced otherwise); a
recorded run's trajectory becomes Responses output items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencode_tui_core.episode.record import EpisodeResult
from opencode_tui_core.export.atif import build_trajectory
from opencode_tui_core.failures import Outcome
from opencode_tui_core.gym.rollout import (
    RolloutDefaults,
    RolloutRefused,
    gym_failure_kind,
    output_items,
    parse_request,
    refuse_prompt,
    run_options,
    task_ref,
    verify_fields,
)
from opencode_tui_core.tasks import load_task, render_prompt

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
SAMPLES = Path(__file__).resolve().parents[3] / "sample_tasks"


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ({"task": "t", "env": {"A": "1"}}, "`env` is refused"),
        ({"task": "t", "command": "opencode"}, "`command` is refused"),
        ({"task": "t", "extra_args": []}, "`extra_args` is refused"),
        ({"task": "t", "modle": "x"}, "modle"),
        ({}, "task"),
        (None, "has no `opencode_tui` block"),
    ],
)
def test_a_row_that_asks_for_what_the_engine_refuses_is_refused_by_name(block, words) -> None:
    with pytest.raises(RolloutRefused, match=words.replace("`", ".")):
        parse_request(block)


def test_the_servers_settings_refuse_the_same_and_want_absolute_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`command` is refused"):
        RolloutDefaults.model_validate({"runs_dir": str(tmp_path), "command": "opencode"})
    with pytest.raises(ValueError, match="runs_dir must be an absolute path"):
        RolloutDefaults.model_validate({"runs_dir": "runs"})
    with pytest.raises(ValueError, match="runs_dir"):
        RolloutDefaults.model_validate({})  # where the runs go is never a silent default


def test_the_rows_options_go_over_the_servers(tmp_path: Path) -> None:
    (tmp_path / "tasks" / "mine").mkdir(parents=True)
    defaults = RolloutDefaults(
        runs_dir=tmp_path / "runs",
        tasks_root=tmp_path / "tasks",
        provider="docker",
        settings={"budgets": {"run_s": 600, "agent_s": 300}},
    )
    row = parse_request({"task": "mine", "provider": "local", "settings": {"budgets": {"run_s": 60}}})
    options = run_options(row, defaults)
    assert options["provider"] == "local" and options["runs_dir"] == tmp_path / "runs"
    assert options["settings"] == {"budgets": {"run_s": 60, "agent_s": 300}}
    assert task_ref(row, defaults) == str(tmp_path / "tasks" / "mine")
    # Not under tasks_root: passed on as given (a bundled sample's name).
    assert task_ref(parse_request({"task": "hello-file"}), defaults) == "hello-file"


def test_the_prompt_is_the_tasks_and_a_different_one_is_refused() -> None:
    task = load_task(SAMPLES / "hello-file")
    for same in (
        [],
        "",
        None,
        task.problem_statement,
        render_prompt(task),
        [{"role": "user", "content": render_prompt(task)}],
    ):
        refuse_prompt(same, task)
    with pytest.raises(RolloutRefused, match="differs from the task's prompt"):
        refuse_prompt("Write a poem.", task)


def _result(run: str, **fields) -> EpisodeResult:
    info = json.loads((FIXTURES / run / "run.json").read_text())
    outcome = info["outcome"]
    return EpisodeResult(
        run_id=info["run_id"],
        task_id=info["task_id"],
        attempt=1,
        provider=info["provider"],
        reward=outcome["reward"],
        action=Outcome(outcome["action"]),
        failure_kind=outcome["failure_kind"],
        failure_stage=outcome["failure_stage"],
        failure_class=outcome["failure_class"],
        cleanup_confirmed=True,
        run_dir=str(FIXTURES / run),
        summary=outcome["summary"],
        **fields,
    )


def test_an_oom_reaches_gym_in_its_vocabulary_with_the_engines_own_words() -> None:
    fields = verify_fields(_result("oom"))
    assert fields["failure_kind"] == "provider_oom_killed" and fields["reward"] == 0.0
    assert fields["mask_sample"] is False  # count_as_zero is a sample
    mine = fields["opencode_tui"]
    assert (mine["failure_kind"], mine["failure_class"], mine["action"]) == (
        "provider_oom_killed",
        "model",
        "count_as_zero",
    )
    assert "provider_oom_killed" in fields["failure_reason"]


def test_what_is_not_a_sample_is_masked_and_a_kind_gym_lacks_is_namespaced() -> None:
    result = _result("oom").model_copy(
        update={"action": Outcome.MARK_EVALUATION_ERROR, "failure_kind": "verifier_timeout", "reward": None}
    )
    fields = verify_fields(result)
    assert fields["mask_sample"] is True and fields["reward"] == 0.0
    assert fields["failure_kind"] == "opencode_tui:verifier_timeout"
    assert gym_failure_kind("run_cancelled") == "cancelled" and gym_failure_kind(None) is None
    scored = verify_fields(_result("hello-file"))
    assert (scored["reward"], scored["mask_sample"], scored["failure_kind"]) == (1.0, False, None)


def test_a_recorded_runs_turns_become_responses_output_items() -> None:
    items = output_items(build_trajectory(FIXTURES / "oom"))
    kinds = [i["type"] for i in items]
    assert kinds == [
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert [i["name"] for i in items if i["type"] == "function_call"] == ["bash", "write"]
    calls = {i["call_id"] for i in items if i["type"] == "function_call"}
    assert {i["call_id"] for i in items if i["type"] == "function_call_output"} == calls
    assert items[-1]["content"][0]["text"] == "The allocation was killed; result.txt records it."
    # An episode that ended before any turn still ends in an (empty) assistant message.
    [empty] = output_items(None)
    assert empty["type"] == "message" and empty["content"][0]["text"] == ""


def test_captured_tokens_ride_on_the_last_item_each_call_generated_in_gyms_training_fields() -> None:
    trajectory = build_trajectory(FIXTURES / "oom")
    step = next(s for s in trajectory.steps if s.source == "agent" and s.tool_calls)
    assert step.metrics is not None
    step.metrics = step.metrics.model_copy(
        update={"prompt_token_ids": [1, 2, 3], "completion_token_ids": [7, 8], "logprobs": [-0.5, -0.25]}
    )
    items = output_items(trajectory)
    bundles = [i for i in items if "generation_token_ids" in i]
    assert len(bundles) == 1 and bundles[0]["type"] == "function_call"
    assert (
        bundles[0]["prompt_token_ids"],
        bundles[0]["generation_token_ids"],
        bundles[0]["generation_log_probs"],
    ) == (
        [1, 2, 3],
        [7, 8],
        [-0.5, -0.25],
    )
    # Gym requires one logprob per generated id: a bundle that is not whole is left off, not padded.
    step.metrics = step.metrics.model_copy(update={"logprobs": [-0.5]})
    assert not [i for i in output_items(trajectory) if "generation_token_ids" in i]
    # Without capture (the recorded run as it is), no item carries them.
    assert not [i for i in output_items(build_trajectory(FIXTURES / "oom")) if "generation_token_ids" in i]
