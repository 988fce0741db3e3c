"""What a NeMo Gym rollout asks of the engine, and what the engine's episode tells Gym back.

Nothing here imports NeMo Gym: these are the engine's own models of the two sides of a Gym ``/run``
(the agent server's settings, a row's ``opencode_tui`` block) and the translation of an
``EpisodeResult`` into the fields of Gym's verify response (reward, ``mask_sample``, ``failure_kind``
in Gym's vocabulary, ``failure_reason``) plus an ``opencode_tui`` block with the engine's own words
(kind, class, action, run directory). ``opencode_tui_core.gym.agent`` serves it.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.config import deep_merge, format_validation_error
from opencode_tui_core.episode.record import EpisodeResult
from opencode_tui_core.export.atif import AtifStep, AtifTrajectory
from opencode_tui_core.tasks import Task, render_prompt

# The engine's kinds that mean what a kind of Gym's shared vocabulary (nemo_gym.failure_kinds)
# means. Every other kind reaches Gym namespaced, ``opencode_tui:<kind>``, which that vocabulary
# accepts for a server's own kinds: a near match would group unlike failures together.
GYM_KINDS: dict[str, str] = {
    "provider_oom_killed": "provider_oom_killed",
    "provider_unavailable": "provider_unavailable",
    "provider_quota_exhausted": "provider_quota_exhausted",
    "agent_timeout": "agent_timeout",
    "run_cancelled": "cancelled",
    "run_interrupted": "cancelled",
    "verifier_error": "verifier_error",
    "sandbox_lost": "session_lost",
    "sandbox_engine_lost": "session_lost",
    "sandbox_release_failed": "session_release_failed",
    "cleanup_unconfirmed": "session_release_failed",
}
GYM_NAMESPACE = "opencode_tui"

# What the seed's Gym agent accepted and this engine refuses, with what to do instead. The sandbox's
# environment and the agent's command line are the engine's (a pinned OpenCode, run by the supervisor):
# a rollout that could change them would not be the episode the run directory records.
REFUSED: dict[str, str] = {
    "env": (
        "`env` is refused: the sandbox's environment is the engine's. Put what the task needs in the "
        "task (its image or setup), or model credentials in `api_key_env`"
    ),
    "command": (
        "`command` is refused: the agent is the engine's pinned OpenCode, run under its supervisor. "
        "Choose the version with the setting `opencode.version`"
    ),
    "extra_args": (
        "`extra_args` is refused: OpenCode's command line is the engine's. Use the task's or the "
        "configuration's settings instead"
    ),
}


class RolloutRefused(ValueError):
    """A rollout asked for what the engine refuses; nothing started. The message says what to do."""


def refuse_named(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        return
    named = [REFUSED[k] for k in REFUSED if k in data]
    if named:
        raise RolloutRefused(f"{where}: " + "; ".join(named))


class RolloutDefaults(BaseModel):
    """The agent server's ``opencode_tui`` settings (its Gym YAML): how every rollout runs unless its
    row says otherwise. The names are the Python API's (``opencode_tui_core.api.RunOptions``)."""

    model_config = ConfigDict(extra="forbid")

    config: Path | None = None  # a configuration file, as ``--config``
    settings: dict[str, Any] = Field(default_factory=dict)
    provider: str | None = None
    model_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    runs_dir: Path  # where every rollout's run directory is kept (``opencode-tui open`` reads it)
    # A relative task path in a row is taken from here (the server's working directory is Gym's).
    tasks_root: Path | None = None
    keep_sandbox: bool = False

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        refuse_named(data, "opencode_tui agent settings")
        return data

    @model_validator(mode="after")
    def _absolute(self) -> RolloutDefaults:
        # Gym starts the server in its own directory (inside the installed package): a relative
        # path would land the runs there, where nobody looks for them.
        for name in ("config", "runs_dir", "tasks_root"):
            value = getattr(self, name)
            if value is not None and not value.expanduser().is_absolute():
                raise ValueError(
                    f"{name} must be an absolute path (Gym runs this server in its own directory)"
                )
        return self


class RolloutRequest(BaseModel):
    """A row's ``opencode_tui`` block: the task this rollout is an episode of, and what it changes."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1)  # a task directory (absolute, or under ``tasks_root``) or a sample name
    settings: dict[str, Any] = Field(default_factory=dict)  # applied over the server's settings
    provider: str | None = None
    model_url: str | None = None
    model: str | None = None
    keep_sandbox: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        refuse_named(data, "the row's opencode_tui block")
        return data


def parse_request(block: Any) -> RolloutRequest:
    """The row's block, or ``RolloutRefused`` naming the field that was wrong."""
    if block is None:
        raise RolloutRefused(
            'the row has no `opencode_tui` block: give at least {"opencode_tui": {"task": ...}} '
            "(a task directory or a bundled sample name)"
        )
    refuse_named(block, "the row's opencode_tui block")  # with its own words, before pydantic's
    try:
        return RolloutRequest.model_validate(block)
    except ValidationError as exc:
        raise RolloutRefused(format_validation_error(exc, "the row's opencode_tui block")) from None


def refuse_prompt(prompt: Any, task: Task) -> None:
    """The prompt is the task's: a row whose ``responses_create_params.input`` says something else is
    refused rather than silently run with the task's words. Empty, the task's problem statement, or the
    whole prompt the agent is given (``render_prompt``) are accepted."""
    if prompt in (None, "", []):
        return
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], dict):
        prompt = prompt[0].get("content")
    if isinstance(prompt, str) and prompt.strip() in (
        task.problem_statement.strip(),
        render_prompt(task).strip(),
    ):
        return
    raise RolloutRefused(
        "responses_create_params.input differs from the task's prompt: this agent takes its prompt from "
        "the task (task.yaml); leave `input` empty ([]) or give the task's problem statement"
    )


def task_ref(request: RolloutRequest, defaults: RolloutDefaults) -> str:
    """A relative task is looked for under ``tasks_root``; a name found nowhere there is passed on as it
    is (a bundled sample, or refused by admission with what exists)."""
    path = Path(request.task).expanduser()
    if not path.is_absolute() and defaults.tasks_root is not None:
        under = defaults.tasks_root.expanduser() / path
        if under.exists():
            return str(under)
    return request.task


def run_options(request: RolloutRequest, defaults: RolloutDefaults) -> dict[str, Any]:
    """The Python API's options for this rollout: the server's, the row's over them."""
    options: dict[str, Any] = {
        "settings": deep_merge(defaults.settings, request.settings),
        "keep_sandbox": defaults.keep_sandbox if request.keep_sandbox is None else request.keep_sandbox,
    }
    options["runs_dir"] = defaults.runs_dir.expanduser()
    for name in ("config", "api_key_env"):
        value = getattr(defaults, name)
        if value is not None:
            options[name] = value.expanduser() if isinstance(value, Path) else value
    for name in ("provider", "model_url", "model"):
        value = getattr(request, name) or getattr(defaults, name)
        if value is not None:
            options[name] = value
    return options


# ---- the episode, as Gym reads a rollout -------------------------------------------------------------


class RolloutVerdict(BaseModel):
    """The engine's own account of the rollout, carried in Gym's result as ``opencode_tui``."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    run_dir: str
    task_id: str
    provider: str
    action: str  # the outcome: scored, count_as_zero, retry, mark_evaluation_error, ...
    reward: float | None
    exit_code: int
    failure_kind: str | None
    failure_class: str | None
    failure_stage: str | None
    summary: str
    cleanup_confirmed: bool | None
    warnings: list[str]


def gym_failure_kind(kind: str | None) -> str | None:
    if kind is None:
        return None
    return GYM_KINDS.get(kind, f"{GYM_NAMESPACE}:{kind}")


def verify_fields(result: EpisodeResult) -> dict[str, Any]:
    """Gym's verify-response fields for an episode: a sample's reward as it is; anything that is not a
    sample (a retry, an evaluation error, a cancel) is masked, its reward 0.0 only because Gym needs a
    number, and says why."""
    verdict = RolloutVerdict(
        run_id=result.run_id,
        run_dir=result.run_dir,
        task_id=result.task_id,
        provider=result.provider,
        action=result.action.value,
        reward=result.reward,
        exit_code=result.exit_code,
        failure_kind=result.failure_kind,
        failure_class=result.failure_class,
        failure_stage=result.failure_stage,
        summary=result.summary,
        cleanup_confirmed=result.cleanup_confirmed,
        warnings=list(result.warnings),
    )
    sample = result.scored
    return {
        "reward": float(result.reward or 0.0) if sample else 0.0,
        "mask_sample": not sample,
        "failure_kind": gym_failure_kind(result.failure_kind),
        "failure_reason": result.summary if result.failure_kind else None,
        GYM_NAMESPACE: verdict.model_dump(mode="json"),
    }


# ---- the transcript, as Responses API output items ------------------------------------------------------

OutputItem = dict[str, Any]


def _message(step: AtifStep) -> OutputItem:
    return {
        "type": "message",
        "id": f"msg_{step.step_id}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": step.message, "annotations": []}],
    }


def _step_items(step: AtifStep) -> list[OutputItem]:
    items: list[OutputItem] = []
    if step.reasoning_content:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{step.step_id}",
                "summary": [{"type": "summary_text", "text": step.reasoning_content}],
            }
        )
    if step.message:
        items.append(_message(step))
    outputs = {
        r.source_call_id: r.content or "" for r in (step.observation.results if step.observation else [])
    }
    for call in step.tool_calls or []:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call.tool_call_id}",
                "call_id": call.tool_call_id,
                "name": call.function_name,
                "arguments": json.dumps(call.arguments, ensure_ascii=False),
                "status": "completed",
            }
        )
        if call.tool_call_id in outputs:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call.tool_call_id,
                    "output": outputs[call.tool_call_id],
                }
            )
    _attach_tokens(step, items)
    return items


def _attach_tokens(step: AtifStep, items: list[OutputItem]) -> None:
    """Captured tokens (``model.capture_tokens``) in Gym's training fields, on the last item the step's
    model call generated, as Gym's own model servers hand them to a trainer. Only a whole bundle:
    Gym requires prompt ids, generated ids and one logprob per generated id."""
    m = step.metrics
    if m is None or m.prompt_token_ids is None or m.completion_token_ids is None or m.logprobs is None:
        return
    if len(m.completion_token_ids) != len(m.logprobs):
        return
    generated = [i for i in items if i["type"] in ("message", "function_call", "reasoning")]
    if generated:
        generated[-1].update(
            prompt_token_ids=m.prompt_token_ids,
            generation_token_ids=m.completion_token_ids,
            generation_log_probs=m.logprobs,
        )


def read_trajectory(run_dir: Path) -> AtifTrajectory | None:
    """The run's exported trajectory; None when the episode ended before there was one."""
    path = run_dir / RunFiles.TRAJECTORY
    try:
        return AtifTrajectory.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def output_items(trajectory: AtifTrajectory | None) -> list[OutputItem]:
    """The agent's turns as Responses output items (message, reasoning, function_call and its output).
    Copied context (what a compaction replayed) is left out. An episode with no assistant text still
    ends in an (empty) assistant message, as Gym's collectors expect one; its result says why."""
    items: list[OutputItem] = []
    for step in trajectory.steps if trajectory else []:
        if step.source == "agent" and not step.is_copied_context:
            items.extend(_step_items(step))
    if not any(i["type"] == "message" for i in items):
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
        )
    return items


def response_body(result: EpisodeResult, params: dict[str, Any]) -> dict[str, Any]:
    """A Responses API ``response`` for the episode (what Gym's ``NeMoGymResponse`` validates)."""
    trajectory = read_trajectory(Path(result.run_dir))
    tokens_in, tokens_out = result.agent_tokens_in or 0, result.agent_tokens_out or 0
    model = trajectory.agent.model_name if trajectory and trajectory.agent.model_name else "opencode"
    return {
        "id": f"resp_{result.run_id}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "output": output_items(trajectory),
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", True)),
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools", []),
        "status": "completed" if result.scored else "incomplete",
        "usage": {
            "input_tokens": tokens_in,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": tokens_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens_in + tokens_out,
        },
    }
