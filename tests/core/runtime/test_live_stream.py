"""How live the terminal is, against the real OpenCode binary in a real bubblewrap sandbox.

``serve`` (the default harness) relays OpenCode's server event stream: a running command's output is
shown while the command still runs. ``run`` (the fallback) only learns of a tool call once it has ended.
Also: what the serve runner does when OpenCode asks for a permission nobody can give, and when the
server dies under the session (a real SIGKILL from inside the sandbox).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.events import Event, FailureRecorded, TerminalOutput, ToolCall, TranscriptStats

pytestmark = [pytest.mark.slow, pytest.mark.bwrap]

ATIF_SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "atif-v1.8.schema.json").read_text()
)

SLOW_COMMAND = "for i in 1 2 3; do echo line$i; sleep 1; done"
WRITE_HELLO = {"name": "write", "arguments": {"filePath": "{workdir}/hello.txt", "content": "Hello\n"}}


def _record(ep) -> list[tuple[float, Event]]:
    seen: list[tuple[float, Event]] = []
    ep.bus.subscribe(lambda e: seen.append((time.monotonic(), e)))
    return seen


def _first(seen, pred) -> float:
    return next(t for t, e in seen if pred(e))


def _display(seen) -> str:
    return "".join(e.data for _, e in seen if isinstance(e, TerminalOutput) and e.stream == "display")


def _cast_text(run_dir: str) -> str:
    """The recorded terminal as plain text (colours dropped)."""
    lines = (Path(run_dir) / RunFiles.CAST).read_text().splitlines()[1:]
    text = "".join(json.loads(line)[2] for line in lines).replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _failure_message(seen) -> str:
    (failure,) = [e.failure for _, e in seen if isinstance(e, FailureRecorded)]
    return failure.message


def _slow_task(task_copy) -> Path:
    steps = [
        {"tool_calls": [WRITE_HELLO]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": SLOW_COMMAND, "description": "count"}}]},
        {"text": "Counted."},
    ]
    return task_copy(trajectory=steps)


def _is_line1(e: Event) -> bool:
    return isinstance(e, TerminalOutput) and e.stream == "display" and "line1" in e.data


def _bash_done(e: Event) -> bool:
    return isinstance(e, ToolCall) and e.tool == "bash" and e.status == "completed"


async def test_serve_shows_a_running_commands_output_before_it_ends(task_copy, episode_on):
    ep = episode_on(_slow_task(task_copy))
    seen = _record(ep)
    result = await ep.run()
    assert result.action == "scored", result.summary
    started = _first(seen, lambda e: isinstance(e, ToolCall) and e.tool == "bash" and e.status == "running")
    line1 = _first(seen, _is_line1)
    done = _first(seen, _bash_done)
    # line2 and line3 take two more seconds of sleep after line1 is printed.
    assert started <= line1 and done - line1 >= 1.5, (started, line1, done)
    # Each line once, in order, after one prompt line: continuation, not repetition.
    text = _cast_text(result.run_dir)
    assert text.count(f"$ {SLOW_COMMAND}\n") == 1
    assert [text.count(f"line{i}\n") for i in (1, 2, 3)] == [1, 1, 1]
    assert text.index("line1") < text.index("line2") < text.index("line3") < text.index("Counted.")
    assert "live from opencode serve" in text
    calls = [e for _, e in seen if isinstance(e, ToolCall) and e.tool == "bash"]
    assert [c.status for c in calls] == ["running", "completed"]
    assert calls[-1].output == "line1\nline2\nline3\n"


async def test_run_harness_only_shows_a_command_once_it_has_ended(task_copy, episode_on):
    ep = episode_on(_slow_task(task_copy), runtime={"harness": "run"})
    seen = _record(ep)
    result = await ep.run()
    assert result.action == "scored", result.summary
    assert _first(seen, _bash_done) <= _first(seen, _is_line1)
    text = _cast_text(result.run_dir)
    assert [text.count(f"line{i}\n") for i in (1, 2, 3)] == [1, 1, 1]
    assert "opencode run (tool calls appear when they finish)" in text


async def test_permission_nobody_can_give_ends_the_turn_and_says_why(task_copy, episode_on):
    """``question`` is denied by the session's rules (not offered; a call to it is answered as an invalid
    tool and the turn goes on). A read outside the workdir asks for ``external_directory``, which would
    wait forever for a human in a bare server: the runner rejects it as ``opencode run`` does, OpenCode
    ends the turn, and the failure (``agent_permission_rejected``) names the permission and its pattern."""
    steps = [
        {
            "tool_calls": [
                {"name": "question", "arguments": {"questions": [{"question": "?", "options": []}]}}
            ]
        },
        {"tool_calls": [WRITE_HELLO]},
        {"tool_calls": [{"name": "read", "arguments": {"filePath": "/etc/hostname"}}]},
        {"text": "Done."},
    ]
    ep = episode_on(task_copy(trajectory=steps))
    seen = _record(ep)
    result = await ep.run()
    assert (result.failure_kind, result.failure_stage) == ("agent_permission_rejected", "agent"), (
        result.summary
    )
    assert "permission `external_directory` for /etc/* (/etc/hostname)" in _failure_message(seen)
    final = {e.tool: e for _, e in seen if isinstance(e, ToolCall) and e.status != "running"}
    assert "question" not in final and final["invalid"].status == "completed"  # not offered: not run
    assert final["write"].status == "completed"
    assert final["read"].status == "error" and "rejected" in (final["read"].output or "")
    assert "permission requested: external_directory for /etc/* (/etc/hostname); auto-rejected" in _display(
        seen
    )
    assert result.durations_s["agent"] < 60


async def test_server_killed_under_the_session_is_a_nonzero_exit_with_the_reason(task_copy, episode_on):
    """The agent's own command SIGKILLs the OpenCode server (its parent process): a real crash."""
    steps = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "kill -9 $PPID", "description": "crash"}}]},
        {"text": "unreachable"},
    ]
    ep = episode_on(task_copy(trajectory=steps))
    seen = _record(ep)
    result = await ep.run()
    assert (result.failure_kind, result.failure_stage) == ("agent_nonzero_exit", "agent"), result.summary
    message = _failure_message(seen)
    assert "exited with 137" in message and "opencode serve exited with -9" in message
    assert "opencode serve exited with -9 during the session" in _display(seen)
    assert result.cleanup_confirmed


async def test_output_longer_than_opencodes_live_window_is_shown_once_in_order(task_copy, episode_on):
    """120,000 numbered lines (~790 KB) in 60 bursts: past 30,000 characters OpenCode only streams a
    window on the tail; the display stitches the windows together without losing or repeating a line,
    and points at the full output OpenCode saved (collected into the run directory).

    When the machine is busy, OpenCode can read more than a window's worth between two updates (a pipe
    holds up to 64 KB): those lines were never streamed, and the display must say so at that very spot.
    So the contract checked is: every number shown once, in order; every jump marked, and no mark
    without a jump; and most of the output stitched (a gap-only display would fail)."""
    command = "for i in $(seq 0 59); do seq $((i*2000+1)) $((i*2000+2000)); sleep 0.05; done"
    steps = [
        {"tool_calls": [WRITE_HELLO]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": command, "description": "count"}}]},
        {"text": "Counted."},
    ]
    ep = episode_on(task_copy(trajectory=steps))
    result = await ep.run()
    assert result.action == "scored", result.summary
    text = _cast_text(result.run_dir)
    shown, gaps, expected = 0, 0, 1
    marked = False
    for line in text.splitlines():
        if line.startswith("⋯ output skipped"):
            assert not marked, "two gap marks in a row"
            marked, gaps = True, gaps + 1
        elif line.isdigit():
            n = int(line)
            assert (n > expected) if marked else (n == expected), (expected, n, marked)
            shown, expected, marked = shown + 1, n + 1, False
    assert expected == 120_001 and not marked
    assert shown >= 90_000, (shown, gaps)  # three quarters at least came through stitched windows
    (saved,) = re.findall(r"full output saved by OpenCode: (\S+) in the run directory", text)
    assert (Path(result.run_dir) / saved).read_text().splitlines() == [str(n) for n in range(1, 120_001)]


async def test_a_subagent_is_shown_nested_and_exported_as_an_embedded_trajectory(task_copy, episode_on):
    """The agent delegates the file to a subagent (OpenCode's ``task`` tool; the scripted model answers
    the child session from the trajectory's ``subagents``): the terminal shows the delegation and the
    subagent's work nested, the transcript counts the child session, and trajectory.json embeds the
    subagent's trajectory (valid ATIF, referenced from the task call, metered from the model calls)."""
    prompt = "Write hello.txt in the working directory containing: Hello from OpenCode"
    write = {
        "name": "write",
        "arguments": {"filePath": "{workdir}/hello.txt", "content": "Hello from OpenCode\n"},
    }
    task = task_copy()
    (task / "trajectory.yaml").write_text(
        yaml.safe_dump(
            {
                "steps": [
                    {
                        "tool_calls": [
                            {
                                "name": "task",
                                "arguments": {
                                    "description": "Write the greeting",
                                    "prompt": prompt,
                                    "subagent_type": "general",
                                },
                            }
                        ]
                    },
                    {"text": "The subagent wrote hello.txt."},
                ],
                "subagents": [
                    {
                        "prompt": prompt,
                        "steps": [{"tool_calls": [write]}, {"text": "hello.txt is written."}],
                    }
                ],
            }
        )
    )
    ep = episode_on(task)
    seen = _record(ep)
    result = await ep.run()
    assert result.action == "scored" and result.reward == 1.0, result.summary
    text = _cast_text(result.run_dir)
    shown = text[text.index("▸ delegating to a subagent: Write the greeting") :]
    nested = re.search(r"┌ subagent session (ses_\w+)\n│ \+\+\+ hello.txt \(new, 1 lines\)\n", shown)
    assert nested and "│ hello.txt is written." in shown, shown[:600]
    assert shown.index("│ hello.txt is written.") < shown.index("• task ") < shown.index("The subagent wrote")
    # Only the parent's calls are the episode's tool calls; the subagent's are in its own trajectory.
    assert {e.tool for _, e in seen if isinstance(e, ToolCall)} == {"task"}
    (stats,) = [e for _, e in seen if isinstance(e, TranscriptStats)]
    assert stats.subagent_sessions == 1 and stats.tool_calls == {"task": 1}

    doc = json.loads((Path(result.run_dir) / RunFiles.TRAJECTORY).read_text())
    jsonschema.Draft202012Validator(ATIF_SCHEMA).validate(doc)
    (child,) = doc["subagent_trajectories"]
    assert child["trajectory_id"] == child["session_id"] == nested.group(1)
    (task_step,) = [s for s in doc["steps"] if s.get("tool_calls")]
    (result_ref,) = task_step["observation"]["results"]
    assert result_ref["subagent_trajectory_ref"] == [
        {"trajectory_id": nested.group(1), "session_id": nested.group(1)}
    ]
    assert child["agent"]["extra"]["subagent_type"] == "general"
    assert [s["source"] for s in child["steps"]] == ["user", "agent", "agent"]
    assert child["steps"][0]["message"] == prompt
    assert child["steps"][1]["tool_calls"][0]["function_name"] == "write"
    assert [s["llm_call_count"] for s in child["steps"][1:]] == [1, 1]  # metered from model_calls.jsonl
    assert child["final_metrics"]["total_steps"] == 3
