"""The scripted model: trajectory format, request classification, step selection, faults (real HTTP)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from opencode_tui_core.calls.classify import classify, classify_body
from opencode_tui_core.config import ConfigError
from opencode_tui_core.model.scripted import PROGRESS_MARKER, ScriptedModel, compaction_progress, progress_of
from opencode_tui_core.model.trajectory import Trajectory, fill_placeholders, load_trajectory

# Prompt openings as OpenCode 1.18.32 sends them (docs/opencode-notes.md).
AGENT_SYSTEM = "You are opencode, an interactive CLI tool that helps users with software engineering tasks."
TITLE_SYSTEM = "You are a title generator. You output ONLY a thread title. Nothing else.\n\n<task>..."
COMPACTION_SYSTEM = (
    "You are a context summarization agent. You are given a conversation between a user and an agent."
)
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("bash", "edit", "glob", "grep", "read", "write")
]
CONTINUE = (
    "Continue if you have next steps, or stop and ask for clarification if you are unsure how to proceed."
)

TRAJ = """
title: Hello file
steps:
  - tool_calls:
      - name: write
        arguments: {filePath: "{workdir}/hello.txt", content: "hi {name}\\n"}
    usage: {prompt_tokens: 1200, completion_tokens: 30, cached_tokens: 1000, reasoning_tokens: 5}
  - text: Checking the file.
    tool_calls:
      - {name: bash, arguments: {command: "cat hello.txt", description: "Show it"}}
      - {name: read, arguments: {filePath: "{workdir}/hello.txt"}}
  - text: All done.
"""


def traj(text: str = TRAJ) -> Trajectory:
    return Trajectory.from_yaml(text)


def agent_body(history: list[dict[str, Any]], stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "scripted-model",
        "max_tokens": 4096,
        "messages": [
            {"role": "system", "content": AGENT_SYSTEM},
            {"role": "user", "content": "Do it"},
            *history,
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def parse_sse(text: str) -> dict[str, Any]:
    """Assemble a streamed chat completion: content, tool calls, finish reason, usage."""
    out: dict[str, Any] = {
        "content": "",
        "tool_calls": {},
        "finish_reason": None,
        "usage": None,
        "done": False,
    }
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            out["done"] = True
            continue
        obj = json.loads(data)
        if obj.get("usage"):
            out["usage"] = obj["usage"]
        for ch in obj["choices"]:
            delta = ch["delta"]
            out["content"] += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = out["tool_calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] = fn.get("name") or slot["name"]
                slot["arguments"] += fn.get("arguments") or ""
            out["finish_reason"] = ch.get("finish_reason") or out["finish_reason"]
    out["tool_calls"] = [out["tool_calls"][i] for i in sorted(out["tool_calls"])]
    return out


def continue_history(history: list[dict[str, Any]], reply: dict[str, Any]) -> list[dict[str, Any]]:
    """What OpenCode sends next: the assistant turn plus one tool result per call."""
    calls = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in reply["tool_calls"]
    ]
    new = [*history, {"role": "assistant", "content": reply["content"], "tool_calls": calls}]
    new += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    return new


async def post(client: httpx.AsyncClient, url: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return await client.post(f"{url}/chat/completions", json=body, **kw)


# -- trajectory format ---------------------------------------------------------------------------------


def test_trajectory_yaml_list_and_mapping(tmp_path: Path) -> None:
    t = traj()
    assert t.title == "Hello file"
    assert [len(s.tool_calls) for s in t.steps] == [1, 2, 0]
    assert t.steps[2].final and not t.steps[0].final
    p = tmp_path / "t.yaml"
    p.write_text("- text: only a final answer\n")
    assert load_trajectory(p).steps[0].text == "only a final answer"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("- text: hi\n  colour: red\n", "unknown field"),
        ("- {}\n", "tool_calls or a non-empty text"),
        ("- text: x\n  fault: {status: 429, drop: true}\n", "exactly one of"),
        ("- text: x\n  fault: {}\n", "exactly one of"),
        ("- text: x\n  fault: {status: 200}\n", "greater than or equal to 400"),
        ("- text: x\n  fault: {drop: true, retry_after: 1}\n", "retry_after only applies"),
        ("steps: []\n", "at least 1"),
        ("just a string\n", "list of steps"),
    ],
)
def test_trajectory_validation_errors(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        Trajectory.from_yaml(text)
    assert needle in str(err.value)


def test_placeholders_only_replace_known_names() -> None:
    args = {"content": "def f():\n    return {'a': 1}  # {workdir} {unknown}", "n": 3, "l": ["{workdir}"]}
    out = fill_placeholders(args, {"workdir": "/app"})
    assert out == {"content": "def f():\n    return {'a': 1}  # /app {unknown}", "n": 3, "l": ["/app"]}


# -- classification ------------------------------------------------------------------------------------


def test_classify_requests_like_opencode() -> None:
    title = {"messages": [{"role": "system", "content": TITLE_SYSTEM}, {"role": "user", "content": "x"}]}
    compaction = {
        "messages": [
            {"role": "system", "content": COMPACTION_SYSTEM},
            {
                "role": "user",
                "content": "Here is the conversation so far:\n\n<conversation>\n</conversation>",
            },
        ]
    }
    assert classify_body(title) == "title"
    assert classify_body(agent_body([])) == "agent"
    assert classify_body(compaction) == "compaction"
    # Content as a list of parts (other providers), and a generic summarisation prompt.
    parts = {"messages": [{"role": "system", "content": [{"type": "text", "text": TITLE_SYSTEM}]}]}
    assert classify_body(parts) == "title"
    generic = {"messages": [{"role": "system", "content": "Please summarize the chat."}]}
    assert classify_body(generic) == "compaction"
    assert classify_body({"messages": [{"role": "user", "content": "hi"}]}) == "other"
    assert classify("/v1/models", None) == "other"
    assert classify("/v1/chat/completions", b"not json") == "other"
    assert classify("/v1/chat/completions", json.dumps(title).encode()) == "title"


# -- step selection ------------------------------------------------------------------------------------


def test_progress_from_ids_texts_and_marker() -> None:
    t = traj()
    assert progress_of(agent_body([]), t) == 0
    h = [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_s0_0", "type": "function"}]}]
    assert progress_of(agent_body(h), t) == 1
    # A foreign id (another model's) proves nothing.
    assert progress_of(agent_body([{"role": "assistant", "tool_calls": [{"id": "toolu_1"}]}]), t) == 0
    # The final text step is proven by its text.
    assert progress_of(agent_body([*h, {"role": "assistant", "content": "All done."}]), t) == 3
    # After a compaction: the summary's marker carries the count.
    post_compaction = [
        {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": f"## Objective\n- x\n- {PROGRESS_MARKER}: 2 (of 3)\n"},
        {"role": "user", "content": CONTINUE},
    ]
    body = agent_body([])
    body["messages"] = [body["messages"][0], *post_compaction]
    assert progress_of(body, t) == 2


def test_compaction_progress_from_rendered_conversation() -> None:
    t = traj()
    conversation = (
        "[User]: Do it\n\n\n"
        '[Assistant tool call]: write({"filePath":"/app/hello.txt","content":"hi\\n"})\n'
        "[Tool result]: Wrote file successfully.\n"
        "[Assistant]: Checking the file.\n"
        '[Assistant tool call]: bash({"command":"cat hello.txt"})\n[Tool result]: hi\n'
        '[Assistant tool call]: read({"filePath":"/app/hello.txt"})\n[Tool result]: hi\n'
    )
    body = {
        "messages": [
            {"role": "system", "content": COMPACTION_SYSTEM},
            {
                "role": "user",
                "content": f"Here is the conversation so far:\n\n<conversation>\n{conversation}</conversation>\n\n"
                "Create a new anchored summary from the conversation history in the <conversation> tags above",
            },
        ]
    }
    assert compaction_progress(body, t) == 2
    # With a prior summary (marker 1), only the bash+read step is in the conversation.
    second = (
        "[User]: Continue\n\n"
        '[Assistant tool call]: bash({"command":"cat hello.txt"})\n[Tool result]: hi\n'
        '[Assistant tool call]: read({"filePath":"x"})\n[Tool result]: hi\n'
    )
    body["messages"][1]["content"] = (
        f"Here is the conversation so far:\n\n<conversation>\n{second}</conversation>\n\n"
        f"<prior-summary>\n- {PROGRESS_MARKER}: 1 (of 3)\n</prior-summary>"
    )
    assert compaction_progress(body, t) == 2
    # A partial match (only the bash call of a two-call step) does not count the step.
    body["messages"][1]["content"] = (
        "<conversation>\n[Assistant tool call]: bash({})\n</conversation>\n"
        f"<prior-summary>{PROGRESS_MARKER}: 1</prior-summary>"
    )
    assert compaction_progress(body, t) == 1


SUBAGENT_TRAJ = """
steps:
  - tool_calls:
      - name: task
        arguments: {description: Greet, prompt: "Write the greeting file", subagent_type: general}
  - text: Delegated and done.
subagents:
  - prompt: Write the greeting file
    final_text: Greeting written.
    steps:
      - tool_calls:
          - {name: write, arguments: {filePath: "/app/hello.txt", content: "hi"}}
"""


async def test_a_subagent_session_is_answered_from_its_own_script_and_the_parent_keeps_its_place() -> None:
    """OpenCode's ``task`` tool starts a child session whose first user message is the task's prompt
    and whose history holds none of the parent's ids: it gets its own steps, ids and final text."""
    async with ScriptedModel(traj(SUBAGENT_TRAJ)) as m:
        async with httpx.AsyncClient(timeout=10) as c:
            parent = parse_sse((await post(c, m.url, agent_body([]))).text)
            assert [(tc["id"], tc["name"]) for tc in parent["tool_calls"]] == [("call_s0_0", "task")]
            child_body = agent_body([])
            child_body["messages"][1]["content"] = "Write the greeting file"
            child = parse_sse((await post(c, m.url, child_body)).text)
            assert [(tc["id"], tc["name"]) for tc in child["tool_calls"]] == [("call_a0s0_0", "write")]
            child_body["messages"] += continue_history([], child)
            done = parse_sse((await post(c, m.url, child_body)).text)
            assert done["content"] == "Greeting written." and done["finish_reason"] == "stop"
            # The parent, its task call answered, goes on to its own next step (not the child's).
            after = parse_sse((await post(c, m.url, agent_body(continue_history([], parent)))).text)
            assert after["content"] == "Delegated and done."
    assert [(call.subagent, call.step, call.outcome) for call in m.calls] == [
        (None, 0, "step"),
        (0, 0, "step"),
        (0, None, "final"),
        (None, 1, "step"),
    ]


async def test_serves_steps_in_order_and_retries_get_the_same_step() -> None:
    async with ScriptedModel(traj(), placeholders={"workdir": "/app", "name": "there"}) as m:
        async with httpx.AsyncClient(timeout=10) as c:
            history: list[dict[str, Any]] = []
            r = await post(c, m.url, agent_body(history))
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            first = parse_sse(r.text)
            assert first["done"] and first["finish_reason"] == "tool_calls"
            assert first["tool_calls"] == [
                {
                    "id": "call_s0_0",
                    "name": "write",
                    "arguments": json.dumps({"filePath": "/app/hello.txt", "content": "hi there\n"}),
                }
            ]
            assert first["usage"] == {
                "prompt_tokens": 1200,
                "completion_tokens": 30,
                "total_tokens": 1230,
                "prompt_tokens_details": {"cached_tokens": 1000},
                "completion_tokens_details": {"reasoning_tokens": 5},
            }
            # The same request again (a retry) gets the same step.
            again = parse_sse((await post(c, m.url, agent_body(history))).text)
            assert again["tool_calls"] == first["tool_calls"]

            history = continue_history(history, first)
            second = parse_sse((await post(c, m.url, agent_body(history))).text)
            assert second["content"] == "Checking the file."
            assert [(tc["id"], tc["name"]) for tc in second["tool_calls"]] == [
                ("call_s1_0", "bash"),
                ("call_s1_1", "read"),
            ]

            history = continue_history(history, second)
            third = parse_sse((await post(c, m.url, agent_body(history))).text)
            assert third["content"] == "All done." and third["finish_reason"] == "stop"
            assert third["tool_calls"] == []

            # Exhausted (e.g. a new prompt after the final answer): a final text, so OpenCode stops.
            history += [{"role": "assistant", "content": "All done."}, {"role": "user", "content": "more?"}]
            extra = parse_sse((await post(c, m.url, agent_body(history))).text)
            assert extra["content"] == m.trajectory.final_text and extra["finish_reason"] == "stop"
    assert [(c.kind, c.outcome, c.step) for c in m.calls] == [
        ("agent", "step", 0),
        ("agent", "step", 0),
        ("agent", "step", 1),
        ("agent", "step", 2),
        ("agent", "final", None),
    ]


async def test_title_and_compaction_requests_and_usage_falls_after_compaction() -> None:
    t = Trajectory.from_yaml(
        """
title: Big context task
context_usage: {base: 1000, per_turn: 500}
steps:
  - tool_calls: [{name: bash, arguments: {command: "true"}}]
    usage: {prompt_tokens: 250000}
  - tool_calls: [{name: bash, arguments: {command: "ls"}}]
  - text: Finished.
"""
    )
    async with ScriptedModel(t) as m, httpx.AsyncClient(timeout=10) as c:
        title_req = {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": TITLE_SYSTEM},
                {"role": "user", "content": "Generate a title"},
            ],
        }
        title = parse_sse((await post(c, m.url, title_req)).text)
        assert title["content"] == "Big context task" and not title["tool_calls"]

        step0 = parse_sse((await post(c, m.url, agent_body([]))).text)
        assert step0["usage"]["prompt_tokens"] == 250000  # huge: OpenCode compacts now

        conv = '[User]: Do it\n\n[Assistant tool call]: bash({"command":"true"})\n[Tool result]: \n'
        compaction_req = {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": COMPACTION_SYSTEM},
                {
                    "role": "user",
                    "content": f"Here is the conversation so far:\n\n<conversation>\n{conv}"
                    "</conversation>\n\nCreate a new anchored summary",
                },
            ],
        }
        summary = parse_sse((await post(c, m.url, compaction_req)).text)
        assert f"{PROGRESS_MARKER}: 1" in summary["content"] and summary["finish_reason"] == "stop"
        assert not summary["tool_calls"]

        body = agent_body([])
        body["messages"] = [
            body["messages"][0],
            {"role": "user", "content": "What did we do so far?"},
            {"role": "assistant", "content": summary["content"]},
            {"role": "user", "content": CONTINUE},
        ]
        step1 = parse_sse((await post(c, m.url, body)).text)
        assert [tc["id"] for tc in step1["tool_calls"]] == ["call_s1_0"]  # no replay of step 0
        assert step1["usage"]["prompt_tokens"] == 1000 + 500 * 1  # fell after the compaction
    assert [c.kind for c in m.calls] == ["title", "agent", "compaction", "agent"]
    assert m.calls[2].progress == 1


async def test_non_streaming_models_and_not_found() -> None:
    async with ScriptedModel(traj(), placeholders={"workdir": "/w"}) as m, httpx.AsyncClient(timeout=10) as c:
        r = await post(c, m.url, agent_body([], stream=False))
        assert r.status_code == 200
        data = r.json()
        msg = data["choices"][0]["message"]
        assert data["choices"][0]["finish_reason"] == "tool_calls"
        assert msg["tool_calls"][0]["function"]["name"] == "write"
        assert data["usage"]["prompt_tokens"] == 1200
        models = (await c.get(f"{m.url}/models")).json()
        assert models["data"][0]["id"] == "scripted-model"
        assert (await c.get(f"{m.url}/nope")).status_code == 404
        bad = await c.post(f"{m.url}/chat/completions", content=b"{not json", headers={"content-type": "x"})
        assert bad.status_code == 400


async def test_faults_status_then_success_counted_per_step() -> None:
    t = Trajectory.from_yaml(
        "- tool_calls: [{name: bash, arguments: {command: ls}}]\n"
        "  fault: {status: 429, times: 2, retry_after: 1}\n"
        "- text: ok\n"
    )
    async with ScriptedModel(t) as m, httpx.AsyncClient(timeout=10) as c:
        statuses = []
        for _ in range(3):
            r = await post(c, m.url, agent_body([]))
            statuses.append(r.status_code)
        assert statuses == [429, 429, 200]
        assert r.status_code == 200 and parse_sse(r.text)["tool_calls"][0]["id"] == "call_s0_0"
    assert [(c.status, c.outcome, c.step) for c in m.calls] == [
        (429, "fault:status_429", 0),
        (429, "fault:status_429", 0),
        (200, "step", 0),
    ]


async def test_scripted_model_on_a_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "model.sock"
    async with ScriptedModel(traj(), port=None, unix_path=sock) as m:
        assert m.port is None and m.unix_path == str(sock)
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(transport=transport, timeout=10) as c:
            r = await post(c, m.url, agent_body([]))
            assert parse_sse(r.text)["tool_calls"][0]["name"] == "write"
    assert not sock.exists()
