"""A NeMo Gym agent server whose rollouts are episodes of this engine (the ``gym`` extra).

Gym's rollout collector POSTs a row to ``/run``; the row's ``opencode_tui`` block names the task
(``opencode_tui_core.gym.rollout``). The episode runs through the Python API on any provider, is
closed with its cleanup confirmed, keeps its run directory (``opencode-tui open`` replays any
rollout), and answers with Gym's verify response: the reward, the Responses-style output, Gym's
failure fields, and the engine's own account under ``opencode_tui``.

A request the engine refuses (an unknown field, ``env``, a custom ``command``, a task that does not
exist) is answered 422 with what was wrong and what to do: no rollout ran, so there is no reward to
report. A request whose client goes away (Gym cancels its handler) cancels the episode, which closes
with its cleanup confirmed before the handler ends.

Served the way Gym serves every server: ``gym env start`` (``ng_run``) runs this package's
``gym_root/responses_api_agents/opencode_tui_agent/app.py``; ``opencode-tui gym-root`` prints the
root to put on ``NEMO_GYM_EXTRA_ROOTS``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Body, HTTPException, Request
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from opencode_tui_core import api
from opencode_tui_core.gym.rollout import (
    GYM_NAMESPACE,
    RolloutDefaults,
    RolloutRefused,
    parse_request,
    refuse_named,
    refuse_prompt,
    response_body,
    run_options,
    task_ref,
    verify_fields,
)

UNPROCESSABLE = 422


class OpenCodeTuiAgentConfig(BaseResponsesAPIAgentConfig):
    """The server's Gym YAML: Gym's own keys, ``concurrency``, and the engine's ``opencode_tui``."""

    concurrency: int = Field(default=2, ge=1)  # episodes at once; each is a sandbox
    opencode_tui: RolloutDefaults

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        # Gym's server configs ignore unknown keys: without this, the seed agent's `env` or
        # `command` would be dropped without a word and the rollout run on the engine's defaults.
        refuse_named(data, "opencode_tui_agent config")
        return data


class OpenCodeTuiRunRequest(BaseRunRequest):
    """A Gym row: Gym's keys are kept as they come; ``opencode_tui`` is validated by the engine."""

    model_config = ConfigDict(extra="allow")

    opencode_tui: Any = None


class OpenCodeTuiVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")

    opencode_tui: dict[str, Any] = Field(default_factory=dict)


def _refusal(message: str) -> HTTPException:
    return HTTPException(UNPROCESSABLE, detail={"error": message, "failure_kind": f"{GYM_NAMESPACE}:refused"})


class OpenCodeTuiAgent(SimpleResponsesAPIAgent):
    """Each ``/run`` is one episode (one attempt of its task); Gym repeats and retries rollouts itself."""

    config: OpenCodeTuiAgentConfig
    _slots: asyncio.Semaphore | None = PrivateAttr(default=None)

    def _limit(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.concurrency)
        return self._slots

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        # An episode is a task with its verifier; a bare prompt names neither.
        raise _refusal("this agent runs tasks: POST /run with a row whose opencode_tui block names the task")

    async def run(self, request: Request, body: OpenCodeTuiRunRequest) -> OpenCodeTuiVerifyResponse:
        try:
            rollout = parse_request(body.opencode_tui)
            defaults = self.config.opencode_tui
            opts = api.options_of(run_options(rollout, defaults))
            prepared = await asyncio.to_thread(api.prepare, [task_ref(rollout, defaults)], opts, batch=False)
            params = body.responses_create_params.model_dump(mode="json", exclude_none=True)
            refuse_prompt(params.get("input"), prepared.tasks[0])
        except (RolloutRefused, api.RunRefused) as exc:
            raise _refusal(str(exc)) from None
        async with self._limit():
            # Cancelled here (the client went away): result() cancels the episode and returns to
            # the cancellation only once its cleanup is confirmed.
            result = await api.EpisodeRun(prepared).result()
        response = NeMoGymResponse.model_validate(response_body(result, params))
        return OpenCodeTuiVerifyResponse.model_validate(
            {"responses_create_params": body.responses_create_params, "response": response}
            | verify_fields(result)
        )
