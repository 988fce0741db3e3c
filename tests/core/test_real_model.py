"""Episodes against a real inference server (issue 32): llama.cpp's server with SmolLM2-135M-Instruct on
loopback (tests/real_model.py), the real OpenCode binary, local (bubblewrap) and docker sandboxes.

- The plain path (the server's default chat format): the tiny model answers, the verifier grades it,
  the episode is scored honestly; token counts are the server's usage when its stream carries one and
  null (unknown) when it does not, never 0; each call's timing and time to first token come from the
  real stream.
- The broken path (``--chat_format chatml-function-calling``, which cannot stream tool calls: the server
  answers HTTP 200 with an empty body): every such call is a failed call in ``model_calls.jsonl``, an
  ``empty_answers`` warning comes first, and the episode ends within a bounded number of calls as
  ``model_empty_response`` (an evaluation error), with cleanup confirmed. Before issue 32 it looped
  2,122 times in 10 minutes with every call recorded as good.

The packages come from scripts/test (``.[realmodel]``); where they are absent the module is skipped
with the reason, and CI installs them, so there it runs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.batch import run_batch
from opencode_tui_core.calls.records import AnswerFault
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.events import FailureRecorded, HealthKind, HealthWarning, ModelCall
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.tasks import load_task
from tests import real_model

# One worker runs the module (the servers and their prompt caches are shared by both providers). The
# first call of each server evaluates OpenCode's whole prompt on one CPU thread: seconds on an idle
# machine, minutes on a busy one, hence the generous run budget and timeout.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000), pytest.mark.xdist_group("real_model")]
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
WHY_NOT = real_model.missing()
if WHY_NOT:
    pytestmark.append(pytest.mark.skip(reason=WHY_NOT))

EMPTY_LIMIT = 4  # model.empty_answers_limit for the broken path (the warning at 2)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Both servers for the module (each about 200 MB), stopped by PID at its end."""
    logs = tmp_path_factory.mktemp("llama-logs")
    with (
        real_model.LlamaServer(logs) as plain,
        real_model.LlamaServer(logs, chat_format="chatml-function-calling") as broken,
    ):
        yield plain, broken


def _config(provider: str, url: str) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "sandbox": {"provider": provider},
            "model": {
                "url": url,
                "name": real_model.MODEL_ALIAS,
                "context_window": real_model.N_CTX,
                "output_cap": 256,  # a 135M model may ramble: keep each answer short
                "empty_answers_limit": EMPTY_LIMIT,
            },
            "health": {"empty_answers": 2},
            "budgets": {"run_s": 1200},
        }
    )


@pytest.fixture(
    scope="module",
    params=[pytest.param("local", marks=pytest.mark.bwrap), pytest.param("docker", marks=pytest.mark.docker)],
)
def episodes(request, servers, tmp_path_factory):
    """hello-file on the plain server and on the broken one, with this provider."""
    provider = request.param
    if provider == "docker":
        r = subprocess.run(["docker", "image", "inspect", "opencode-tui/base:bookworm"], capture_output=True)
        if r.returncode != 0:
            pytest.skip(
                "docker or the base image is unavailable (scripts/start-dockerd, scripts/build-images)"
            )
    plain, broken = servers
    task = load_task(SAMPLES / "hello-file")
    out = {}
    for name, server in (("plain", plain), ("broken", broken)):
        runs = tmp_path_factory.mktemp(f"real-{provider}-{name}")
        summary = asyncio.run(run_batch([task], _config(provider, server.url), runs_dir=runs, jobs=1))
        (result,) = summary.results
        out[name] = result
    return provider, out


def _records(result) -> list[dict]:
    reader = RunDirReader(Path(result.run_dir))
    return [r.model_dump(mode="json") for r in reader.model_calls()]


def _usage_sent(body: str) -> dict | None:
    """The usage object the server put in its stream, if it sent one."""
    for line in body.splitlines():
        data = line.removeprefix("data:").strip()
        if line.startswith("data:") and data not in ("", "[DONE]"):
            usage = json.loads(data).get("usage")
            if usage:
                return usage
    return None


def test_plain_path_is_scored_honestly(episodes):
    _, out = episodes
    result = out["plain"]
    assert result.action == "scored" and result.reward in (0.0, 1.0), result.summary
    assert result.failure_kind is None and result.cleanup_confirmed
    assert result.exit_code == ExitCode.OK
    records = _records(result)
    agent = [r for r in records if r["kind"] == "agent"]
    assert agent and all(r["status"] == 200 for r in agent), agent
    # The server serves one call at a time and interrupts a running stream when the next call arrives
    # (its interrupt_requests default): the title call or an agent call beside it may be cut off (a
    # stream with nothing in it and no finish reason) and is then a failed call, as recorded; OpenCode
    # asks again, and the agent's last call is a good one.
    cut = [r for r in agent if r["error"] is not None]
    assert all(r["answer_fault"] == "nothing" for r in cut), cut
    assert agent[-1]["error"] is None, agent[-1]
    assert result.model_calls_failed == len([r for r in records if r["error"] is not None])


def test_tokens_are_the_servers_usage_or_null_never_zero(episodes):
    _, out = episodes
    result = out["plain"]
    streamed = [r for r in _records(result) if r["stream"]]
    assert streamed
    for rec in streamed:
        sent = _usage_sent(rec["response_body"])
        if sent is None:  # the server reported nothing: unknown, not 0
            assert rec["usage"]["tokens_in"] is None and rec["usage"]["tokens_out"] is None
        else:
            assert rec["usage"]["tokens_in"] == sent["prompt_tokens"]
            assert rec["usage"]["tokens_out"] == sent["completion_tokens"]
    if all(_usage_sent(r["response_body"]) is None for r in streamed):
        assert result.tokens_in is None and result.tokens_out is None


def test_call_timing_and_ttft_come_from_the_real_stream(episodes):
    _, out = episodes
    answered = [r for r in _records(out["plain"]) if r["stream"] and r["produced"]]
    assert answered
    for rec in answered:
        assert rec["ttfb_s"] is not None and rec["ttft_s"] is not None and rec["latency_s"] is not None
        assert 0 < rec["ttfb_s"] <= rec["ttft_s"] <= rec["latency_s"]
        assert rec["finish_reason"] is not None and rec["answer_fault"] is None
    events = [e for e in RunDirReader(Path(out["plain"].run_dir)).events() if isinstance(e, ModelCall)]
    assert {e.call_id: e.ttft_s for e in events} == {
        r["call_id"]: r["ttft_s"] for r in _records(out["plain"])
    }


def test_broken_path_ends_as_model_empty_response_within_bounded_calls(episodes):
    _, out = episodes
    result = out["broken"]
    assert result.failure_kind == "model_empty_response", result.summary
    assert result.action == "mark_evaluation_error" and result.failure_class == "evaluation"
    assert result.exit_code == ExitCode.INFRA and result.cleanup_confirmed
    records = _records(result)
    # The first agent call keeps the stream open with ": ping" comments while the prompt is evaluated,
    # then ends it without an event (no choices); the next ones are empty bodies. The title call,
    # when the server gets to end it, is a role-only chunk and [DONE] (nothing, no finish reason).
    empty = [r for r in records if r["answer_fault"] is not None]
    assert len(empty) >= EMPTY_LIMIT
    assert {r["answer_fault"] for r in empty} <= {
        AnswerFault.EMPTY_BODY.value,
        AnswerFault.NO_CHOICES.value,
        AnswerFault.NOTHING.value,
    }
    assert AnswerFault.EMPTY_BODY.value in {r["answer_fault"] for r in empty}
    # Bounded: the limit, and what was already in flight when the agent was stopped.
    assert len(records) <= EMPTY_LIMIT + 4, [r["call_id"] for r in records]
    for rec in empty:
        assert (
            rec["status"] == 200
            and rec["kind"] in ("agent", "title")
            and rec["error"].startswith("no answer: HTTP 200")
        )
        if rec["answer_fault"] == AnswerFault.EMPTY_BODY.value:
            assert rec["response_bytes"] == 0 and rec["error"] == "no answer: HTTP 200 with an empty body"
    assert result.model_calls_failed == len([r for r in records if r["error"] is not None])

    events = list(RunDirReader(Path(result.run_dir)).events())
    (failure,) = [e for e in events if isinstance(e, FailureRecorded)]
    cited = failure.failure.evidence[0].data["call_ids"]
    assert set(cited) <= {r["call_id"] for r in empty} and len(cited) == EMPTY_LIMIT
    warnings = [e for e in events if isinstance(e, HealthWarning) and e.kind is HealthKind.EMPTY_ANSWERS]
    assert warnings and warnings[0].seq < failure.seq  # warned before it failed
    assert RunDirReader(Path(result.run_dir)).info().outcome.failure_kind == "model_empty_response"
