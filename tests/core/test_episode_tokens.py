"""Token capture for RL end to end (``model.capture_tokens``, issue 38): real episodes through the Python
API on the local provider (bubblewrap), the real OpenCode binary, the recording proxy, and as the
upstream a vLLM stand-in (tests/core/model/vllm_standin.py; vLLM cannot run here) that streams vLLM's
``prompt_token_ids``, ``token_ids`` and ``logprobs`` in front of the scripted model playing hello-file.

With the capture on, every chat call is asked for tokens and each one's ids and logprobs are in
tokens.jsonl, attributed to the assistant message, counted in run.json, on each agent step of
trajectory.json (validated against the ATIF v1.8 schema) and returned by ``api.captured_tokens``.
With it off (the default), the upstream sees none of the parameters and nothing is recorded.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from opencode_tui_core import api
from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.calls.token_capture import CAPTURE_PARAMS
from opencode_tui_core.episode import EpisodeResult
from opencode_tui_core.failures import Outcome
from opencode_tui_core.model.scripted import ScriptedModel
from opencode_tui_core.tasks import load_task
from tests.core.model.vllm_standin import VllmStandIn, byte_ids, logprob_of, prompt_text
from tests.leftovers import left_behind

pytestmark = [pytest.mark.slow, pytest.mark.bwrap, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "sample_tasks" / "hello-file"
SCHEMA = json.loads((ROOT / "tests" / "schemas" / "atif-v1.8.schema.json").read_text())
TOKEN_FIELDS = {"prompt_token_ids", "completion_token_ids", "logprobs"}


class Ran:
    """One episode, and what its upstream received."""

    def __init__(self, result: EpisodeResult, requests: list[dict[str, Any]]) -> None:
        self.result, self.requests = result, requests
        self.dir = Path(result.run_dir)
        self.info = json.loads((self.dir / RunFiles.RUN_INFO).read_text())
        self.trajectory = json.loads((self.dir / RunFiles.TRAJECTORY).read_text())


def _episode(runs: Path, capture: bool | None) -> Ran:
    async def main() -> Ran:
        task = load_task(TASK)
        assert task.trajectory_path is not None
        model = await ScriptedModel(task.trajectory_path, placeholders={"workdir": task.workdir}).start()
        try:
            async with VllmStandIn(model.url) as standin:
                settings = {} if capture is None else {"model": {"capture_tokens": capture}}
                result = await api.run_episode(
                    TASK, provider="local", runs_dir=runs, model_url=standin.url, settings=settings
                )
                return Ran(result, standin.chat_requests())
        finally:
            await model.close()

    return asyncio.run(main())


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return _episode(tmp_path_factory.mktemp("tokens-on"), capture=True)


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    return _episode(tmp_path_factory.mktemp("tokens-default"), capture=None)


def _scored(ran: Ran) -> None:
    r = ran.result
    assert (r.action, r.reward) == (Outcome.SCORED, 1.0), r.summary
    assert r.cleanup_confirmed and left_behind("local", r) == []


def test_every_chat_call_asked_for_tokens_and_recorded_them_by_message(captured: Ran) -> None:
    _scored(captured)
    assert captured.info["config"]["model"]["capture_tokens"] is True
    assert captured.requests and all(
        {k: body.get(k) for k in CAPTURE_PARAMS} == CAPTURE_PARAMS for body in captured.requests
    )
    records = {r.call_id: r for r in RunDirReader(captured.dir).model_calls()}
    lines = api.captured_tokens(captured.result)
    assert lines == list(RunDirReader(captured.dir).captured_tokens())
    agent = [t for t in lines if t.kind == "agent"]
    assert len(agent) >= 3  # hello-file: write, cat, the final text
    for t in lines:
        rec = records[t.call_id]
        assert rec.capture_params == list(CAPTURE_PARAMS) and t.message_id == rec.message_id
        assert t.complete and t.prompt_token_ids == byte_ids(prompt_text(rec.request_body))
        assert t.completion_token_ids and t.logprobs == [logprob_of(i) for i in t.completion_token_ids]
    assert all(t.message_id for t in agent) and len({t.message_id for t in agent}) == len(agent)
    # What the model generated, decoded from the captured ids: the tool call that wrote the file.
    said = [bytes(t.completion_token_ids or []).decode() for t in agent]
    assert any(s.startswith("write") and "Hello from OpenCode" in s for s in said), said


def test_run_json_counts_them_and_names_the_file(captured: Ran) -> None:
    lines = api.captured_tokens(captured.result)
    summary = captured.info["token_capture"]
    assert summary == {
        "file": RunFiles.TOKENS,
        "calls": len(captured.requests),
        "calls_with_tokens": len(lines),
        "prompt_token_ids": sum(len(t.prompt_token_ids or []) for t in lines),
        "completion_token_ids": sum(len(t.completion_token_ids or []) for t in lines),
        "logprobs": sum(len(t.logprobs or []) for t in lines),
    }
    assert summary["calls"] == summary["calls_with_tokens"]
    print(f"captured: {summary}")  # the figures behind the "what must be shown"


def test_each_agent_step_of_the_trajectory_carries_its_messages_tokens(captured: Ran) -> None:
    doc = captured.trajectory
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(doc)
    by_message = {t.message_id: t for t in api.captured_tokens(captured.result) if t.kind == "agent"}
    steps = [s for s in doc["steps"] if s["source"] == "agent"]
    assert len(steps) == len(by_message)
    for step in steps:
        t = by_message[step["extra"]["opencode_message_id"]]
        metrics = step["metrics"]
        assert (metrics["prompt_token_ids"], metrics["completion_token_ids"], metrics["logprobs"]) == (
            t.prompt_token_ids,
            t.completion_token_ids,
            t.logprobs,
        )
        assert metrics["extra"]["token_ids_call_id"] == t.call_id
    assert doc["extra"]["token_capture"] == captured.info["token_capture"]


def test_off_by_default_nothing_is_asked_and_nothing_recorded(default: Ran) -> None:
    _scored(default)
    assert default.info["config"]["model"]["capture_tokens"] is False
    assert default.requests and not any(set(CAPTURE_PARAMS) & set(body) for body in default.requests)
    # The upstream got what OpenCode sent, as the proxy recorded it.
    sent = [
        r.request_body for r in RunDirReader(default.dir).model_calls() if r.path.endswith("/completions")
    ]
    assert sorted(map(json.dumps, sent)) == sorted(map(json.dumps, default.requests))
    assert not (default.dir / RunFiles.TOKENS).exists() and api.captured_tokens(default.result) == []
    assert "token_capture" not in default.info
    lines = (default.dir / RunFiles.MODEL_CALLS).read_text().splitlines()
    assert not any("capture_params" in json.loads(line) for line in lines)
    steps = [s for s in default.trajectory["steps"] if s["source"] == "agent"]
    assert steps and not any(TOKEN_FIELDS & set(s.get("metrics") or {}) for s in steps)
