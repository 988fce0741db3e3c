"""The recording proxy answering from a record (issue 28, core/model/replay.py): real proxies and real
scripted models on loopback. A first proxy records a conversation; a second one, given a ``Replayer``
of that record, answers the same requests from it, and a changed request by its plan: stop, continue
or live. The second proxy's upstream is a scripted model of another trajectory, so a live answer is
told from a recorded one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from opencode_tui_core.calls.records import ModelCallRecord
from opencode_tui_core.model.proxy import ModelProxy
from opencode_tui_core.model.replay import Divergence, Replayer, ReplayPlan, compare
from opencode_tui_core.model.scripted import ScriptedModel
from opencode_tui_core.model.trajectory import Trajectory
from tests.core.model.test_proxy import CLIENT_KEY, agent_body

AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}
RECORDED = Trajectory.from_yaml(
    "- tool_calls: [{name: bash, arguments: {command: ls, description: list}}]\n- text: Finished.\n"
)
LIVE = Trajectory.from_yaml("- text: the live model speaking.\n")
# The live model past its script (the request proves step 1 served): its final text, not "Finished.".
LIVE_WORDS = "Done."


def _said(resp: httpx.Response) -> str:
    """The text a streamed chat answer carries (its content deltas joined)."""
    out = []
    for line in resp.text.splitlines():
        data = line.removeprefix("data:").strip()
        if line.startswith("data:") and data != "[DONE]":
            for choice in json.loads(data).get("choices") or []:
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def _second(tool_output: str) -> dict[str, Any]:
    body = agent_body()
    body["messages"] += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_s0_0", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_s0_0", "content": tool_output},
    ]
    return body


async def _record(tmp_path: Path, trajectory: Trajectory = RECORDED) -> list[ModelCallRecord]:
    model = await ScriptedModel(trajectory).start()
    proxy = await ModelProxy(model.url, record_dir=tmp_path / "parent").start()
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            for body in (agent_body(), _second("a.txt\nRan 1 test in 0.001s\n")):
                await c.post(f"{proxy.url}/chat/completions", json=body, headers=AUTH)
        return list(proxy.records)
    finally:
        await proxy.close()
        await model.close()


async def _replay(
    tmp_path: Path, records: list[ModelCallRecord], second: str, on_divergence: str = "stop", **plan: Any
) -> tuple[list[httpx.Response], ModelProxy, ScriptedModel, list[Divergence]]:
    seen: list[Divergence] = []
    replayer = Replayer(
        ReplayPlan(
            lineage=plan.pop("lineage", "rerun"),
            parent_run_id="p",
            parent_run_dir=str(tmp_path),
            on_divergence=on_divergence,  # type: ignore[arg-type]
            **plan,
        ),
        records,
        on_diverged=seen.append,
    )
    live = await ScriptedModel(LIVE).start()
    proxy = await ModelProxy(live.url, record_dir=tmp_path / "child", replay=replayer).start()
    try:
        async with httpx.AsyncClient(timeout=10) as c:
            out = [
                await c.post(f"{proxy.url}/chat/completions", json=body, headers=AUTH)
                for body in (agent_body(), _second(second))
            ]
    finally:
        await proxy.close()
        await live.close()
    return out, proxy, live, seen


async def test_the_same_requests_get_the_recorded_answers_and_the_model_sees_none(tmp_path) -> None:
    records = await _record(tmp_path)
    # another duration and other tool-call ids are the same conversation
    out, proxy, live, seen = await _replay(tmp_path, records, "a.txt\nRan 1 test in 0.250s\n")
    assert [r.text for r in out] == [rec.response_body for rec in records]
    assert [rec.replayed_from for rec in proxy.records] == [rec.call_id for rec in records]
    assert live.calls == [] and seen == []
    # the replayed answers are judged and counted like live ones
    assert [rec.finish_reason for rec in proxy.records] == [rec.finish_reason for rec in records]
    assert [rec.usage for rec in proxy.records] == [rec.usage for rec in records]
    line = json.loads((tmp_path / "child" / "model_calls.jsonl").read_text().splitlines()[0])
    assert line["replayed_from"] == records[0].call_id


async def test_a_changed_tool_result_is_the_divergence_and_stop_fails_the_call(tmp_path) -> None:
    records = await _record(tmp_path)
    out, _, live, [d] = await _replay(tmp_path, records, "b.txt\n")
    assert (d.step, d.call_id) == (2, records[1].call_id)
    assert "(a tool result)" in d.what and "-[tool] a.txt" in d.diff and "+[tool] b.txt" in d.diff
    assert out[1].status_code == 503 and "rerun stopped at its divergence" in out[1].text
    assert live.calls == []  # never sent to the model


async def test_live_sends_the_divergent_call_to_the_model(tmp_path) -> None:
    records = await _record(tmp_path)
    out, proxy, live, [_] = await _replay(tmp_path, records, "b.txt\n", "live")
    assert out[1].status_code == 200 and _said(out[1]) == LIVE_WORDS
    assert len(live.calls) == 1 and proxy.records[1].replayed_from is None


async def test_continue_answers_from_the_record_after_the_divergence(tmp_path) -> None:
    records = await _record(tmp_path)
    out, _, live, [_] = await _replay(tmp_path, records, "b.txt\n", "continue")
    assert out[1].text == records[1].response_body and live.calls == []


async def test_a_fork_goes_live_after_its_step(tmp_path) -> None:
    records = await _record(tmp_path)
    out, _, live, seen = await _replay(tmp_path, records, "a.txt\n", lineage="fork", fork_step=1)
    assert out[0].text == records[0].response_body and _said(out[1]) == LIVE_WORDS
    assert seen == [] and len(live.calls) == 1


async def test_a_recorded_fault_is_reproduced(tmp_path) -> None:
    faulty = Trajectory.from_yaml(
        "- tool_calls: [{name: bash, arguments: {command: ls, description: list}}]\n"
        "  fault: {status: 429, times: 1}\n- text: Finished.\n"
    )
    records = await _record(tmp_path, faulty)
    assert records[0].status == 429
    out, proxy, _, _ = await _replay(tmp_path, records, "a.txt\n", "continue")
    assert out[0].status_code == 429 and proxy.records[0].status == 429 and proxy.records[0].failed


def test_compare_ignores_ids_and_clock_noise_and_names_the_message() -> None:
    a = _second("ok at 2026-12-02T08:51:00Z, took 3.5 seconds")
    b = _second("ok at 2026-12-03T10:00:01Z, took 0.2 seconds")
    b["messages"][2]["tool_calls"][0]["id"] = "call_other"
    b["messages"][3]["tool_call_id"] = "call_other"
    assert compare(a, b) is None
    # OpenCode's ids (a subagent's session) and the pid of a killed job are ids too
    a, b = (
        _second('<task id="ses_dc9e685c6ffeaB0mK25MIq6a7J">'),
        _second('<task id="ses_dc9e5ef69ffeWTn8LD4SWMMnFq">'),
    )
    assert compare(a, b) is None
    a, b = (
        _second("line 1:   112 Killed   bash -c 'kill -9 $$'"),
        _second("line 1:   113 Killed   bash -c 'kill -9 $$'"),
    )
    assert compare(a, b) is None
    # a throughput is a timing too (dd on the docker run of disk-full: 214 then 222 MB/s)
    a, b = (
        _second("3221225472 bytes (3.2 GB, 3.0 GiB) copied, 15.0 s, 214 MB/s"),
        _second("3221225472 bytes (3.2 GB, 3.0 GiB) copied, 14.5 s, 222 MB/s"),
    )
    assert compare(a, b) is None
    assert compare(_second("copied 3 GiB"), _second("copied 4 GiB")) is not None  # a size is not
    what, diff = compare(a, _second("changed")) or ("", "")
    assert what == "message 4 [tool] differs (a tool result)" and "+[tool] changed" in diff
    assert compare(agent_body(), _second("x")) is not None  # a message more
