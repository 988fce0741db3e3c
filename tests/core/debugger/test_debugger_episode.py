"""The debugger on a real episode (issue 27): real OpenCode, the scripted model, Docker and bubblewrap
sandboxes. A person's acts go through the run's real control socket with the same client ``opencode-tui
ctl`` uses, from a second thread, when the event stream shows the moment (a break, a running command).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.batch import BatchControl, run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.debugger.client import request
from opencode_tui_core.debugger.protocol import CtlReply, CtlRequest
from opencode_tui_core.events import Event, Intervention, ToolCall
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.model.hold import HandAnswer, HandToolCall
from opencode_tui_core.signals import closing_signals
from opencode_tui_core.tasks import load_task

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[3] / "sample_tasks"
SAID = "Before you finish, also mention the word PELICAN-7 in your last message."


def _fix_bug(tmp_path: Path, steps: list | None = None) -> Path:
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "fix-bug", task)
    if steps is not None:
        (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    return task


def _run(
    tmp_path: Path,
    provider: str,
    *,
    breaks: list[str],
    when: Callable[[Event], bool],
    acts: Callable[[Path], list[CtlReply]],
    steps: list | None = None,
    run_s: float | None = None,
    signal_at_break: signal.Signals | None = None,
):
    """One episode; when ``when`` first holds, ``acts(run_dir)`` runs on a thread (a second client)."""
    task = load_task(_fix_bug(tmp_path, steps))
    data: dict = {
        "sandbox": {"provider": provider},
        "policy": {"max_attempts": 1},
        "debug": {"breaks": breaks},
    }
    if run_s is not None:
        data["budgets"] = {"run_s": run_s}
    config = AgentConfig.model_validate(data)
    control = BatchControl()
    replies: list[CtlReply] = []
    fired: list[threading.Thread] = []

    def watch(episode) -> None:
        def on_event(event: Event) -> None:
            if fired or not when(event):
                return
            if signal_at_break is not None:
                fired.append(threading.current_thread())
                os.kill(os.getpid(), signal_at_break)
                return
            run_dir = episode.run_dir.path
            thread = threading.Thread(target=lambda: replies.extend(acts(run_dir)), daemon=True)
            fired.append(thread)
            thread.start()

        episode.bus.subscribe(on_event)

    async def main():
        with closing_signals(control.cancel):
            return await run_batch(
                [task], config, runs_dir=tmp_path / "runs", on_episode=watch, control=control
            )

    summary = asyncio.run(main())
    for t in fired:
        if t is not threading.current_thread():
            t.join(30)
    [result] = summary.results
    assert fired, f"the moment to act never came: {result.summary}"
    return summary, result, replies


def _is_break(event: Event) -> bool:
    return isinstance(event, Intervention) and event.what == "break"


def _requests(run_dir: Path) -> list[dict]:
    lines = (run_dir / RunFiles.MODEL_CALLS).read_text().splitlines()
    return [json.loads(line) for line in lines]


def _interventions(run_dir: Path) -> list[str]:
    info = RunDirReader(run_dir).info()
    assert info is not None
    return [i.what for i in info.interventions]


def test_say_at_a_break_reaches_a_later_request(tmp_path, episode_provider):
    def acts(run_dir: Path) -> list[CtlReply]:
        return [
            request(run_dir, CtlRequest(command="status")),
            request(run_dir, CtlRequest(command="say", text=SAID)),
            request(run_dir, CtlRequest(command="continue")),
        ]

    _, result, replies = _run(tmp_path, episode_provider, breaks=["call:2"], when=_is_break, acts=acts)
    status, said, went_on = replies
    assert status.status is not None and status.status.held is not None
    assert status.status.held.call_number == 2 and "tools offered: bash" in status.status.held.conversation
    assert said.ok and went_on.ok, (said.message, went_on.message)
    run_dir = Path(result.run_dir)
    calls = [c for c in _requests(run_dir) if c["kind"] == "agent"]
    held_id = status.status.held.call_id
    held_at = next(i for i, c in enumerate(calls) if c["call_id"] == held_id)
    assert SAID not in json.dumps(calls[held_at]["request_body"])  # the held call went as it was
    assert any(SAID in json.dumps(c["request_body"]) for c in calls[held_at + 1 :])
    assert result.human_intervened and result.failure_kind == "human_intervened"
    assert _interventions(run_dir) == ["break", "say", "continue"]
    assert result.interventions == 3
    assert result.cleanup_confirmed is True
    assert not (run_dir / "control.sock").exists()


def test_answer_with_a_tool_call_runs_that_tool(tmp_path, episode_provider):
    command = "echo HAND-WRITTEN > hand.txt"

    def acts(run_dir: Path) -> list[CtlReply]:
        wrong = HandAnswer(tool_calls=[HandToolCall(name="launch_rockets", arguments={})])
        good = HandAnswer(
            text="Writing a marker.",
            tool_calls=[HandToolCall(name="bash", arguments={"command": command, "description": "marker"})],
        )
        return [
            request(run_dir, CtlRequest(command="answer", answer=wrong)),
            request(run_dir, CtlRequest(command="status")),
            request(run_dir, CtlRequest(command="answer", answer=good)),
        ]

    _, result, replies = _run(tmp_path, episode_provider, breaks=["call:2"], when=_is_break, acts=acts)
    refused, still, answered = replies
    assert not refused.ok and "does not offer a tool named 'launch_rockets'" in refused.message
    assert still.status is not None and still.status.held is not None  # nothing changed
    assert answered.ok, answered.message
    run_dir = Path(result.run_dir)
    events = list(RunDirReader(run_dir).events())
    ran = [e for e in events if isinstance(e, ToolCall) and e.status == "completed"]
    assert any(e.tool == "bash" and e.input.get("command") == command for e in ran)
    answered_calls = [c for c in _requests(run_dir) if c.get("answered_by")]
    assert [c["call_id"] for c in answered_calls] == [still.status.held.call_id]
    assert answered_calls[0]["usage"]["tokens_in"] is None  # the model's tokens only count the model's
    assert result.model_calls_answered == 1 and result.human_intervened
    assert _interventions(run_dir) == ["break", "answer"]
    assert result.cleanup_confirmed is True


def test_edit_replaces_the_models_reply_before_opencode_sees_it(tmp_path, episode_provider):
    """``edit`` forwards the held call; the model's reply is held; the person's edit (a different
    command) is what OpenCode runs. The call is marked edited, with the model's own reply kept."""
    command = "echo EDITED-REPLY > edited.txt"

    def acts(run_dir: Path) -> list[CtlReply]:
        replies = [request(run_dir, CtlRequest(command="edit"))]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = request(run_dir, CtlRequest(command="status"))
            held = status.status.held if status.status else None
            if held is not None and held.stage == "reply":
                replies.append(status)
                break
            time.sleep(0.1)
        edited = HandAnswer(
            text="Writing a marker instead.",
            tool_calls=[HandToolCall(name="bash", arguments={"command": command, "description": "marker"})],
        )
        replies.append(request(run_dir, CtlRequest(command="edit", answer=edited)))
        return replies

    _, result, replies = _run(tmp_path, episode_provider, breaks=["call:2"], when=_is_break, acts=acts)
    forwarded, reply_held, edited = replies
    assert forwarded.ok and edited.ok, (forwarded.message, edited.message)
    assert reply_held.status is not None and reply_held.status.held is not None
    model_reply = reply_held.status.held.reply
    assert model_reply is not None and model_reply.tool_calls  # the scripted model's own tool call
    assert model_reply.tool_calls[0].arguments.get("command") != command
    run_dir = Path(result.run_dir)
    events = list(RunDirReader(run_dir).events())
    ran = [e for e in events if isinstance(e, ToolCall) and e.status == "completed"]
    assert any(e.tool == "bash" and e.input.get("command") == command for e in ran)
    assert not any(
        e.tool == "bash" and e.input.get("command") == model_reply.tool_calls[0].arguments.get("command")
        for e in ran[:1]
    )
    edited_calls = [c for c in _requests(run_dir) if c.get("edited_by")]
    assert [c["call_id"] for c in edited_calls] == [reply_held.status.held.call_id]
    assert edited_calls[0]["edited_by"] == "ctl" and not edited_calls[0].get("answered_by")
    assert command in edited_calls[0]["response_body"]
    assert model_reply.tool_calls[0].name in json.dumps(edited_calls[0]["model_response_body"])
    assert result.model_calls_edited == 1 and result.model_calls_answered == 0
    assert result.human_intervened and result.failure_kind == "human_intervened"
    assert _interventions(run_dir) == ["break", "edit", "reply", "edited"]
    assert result.cleanup_confirmed is True


def test_abort_during_a_long_command_ends_the_turn(tmp_path, episode_provider):
    steps = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 120", "description": "Wait"}}]},
        {"text": "done"},
    ]

    def running_sleep(event: Event) -> bool:
        return isinstance(event, ToolCall) and event.status == "running" and "sleep" in str(event.input)

    def acts(run_dir: Path) -> list[CtlReply]:
        return [request(run_dir, CtlRequest(command="abort"))]

    _, result, replies = _run(
        tmp_path, episode_provider, breaks=[], when=running_sleep, acts=acts, steps=steps
    )
    assert replies[0].ok, replies[0].message
    assert result.durations_s["agent"] < 100  # the turn ended long before the command would have
    assert result.cleanup_confirmed is True and result.human_intervened
    assert _interventions(Path(result.run_dir)) == ["abort"]


def test_a_call_held_past_the_run_deadline_ends_run_timeout(tmp_path, episode_provider):
    _, result, _ = _run(
        # The first agent call: the budget must cover OpenCode's start-up on a loaded machine.
        tmp_path,
        episode_provider,
        breaks=["call:1"],
        when=_is_break,
        acts=lambda _: [],
        run_s=90,
    )
    # The run deadline (this code base's ``agent_timeout``) fired, recorded as such; the hold used the
    # run up, so the run is not a clean sample of the agent either.
    info = RunDirReader(Path(result.run_dir)).info()
    assert info is not None and info.outcome is not None
    failures = (Path(result.run_dir) / "events.jsonl").read_text()
    assert '"kind":"agent_timeout"' in failures.replace(" ", "")
    assert result.human_intervened and result.failure_kind in ("agent_timeout", "human_intervened")
    assert result.cleanup_confirmed is True
    assert _interventions(Path(result.run_dir)) == ["break", "release"]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_while_held_closes_with_its_exit_code(tmp_path, episode_provider, sig, code):
    """SIGTERM (a scheduler) and SIGHUP (the terminal went away) while a model call is held: the
    call is released, the episode closes and its cleanup is confirmed."""
    _, result, _ = _run(
        tmp_path,
        episode_provider,
        breaks=["call:2"],
        when=_is_break,
        acts=lambda _: [],
        signal_at_break=sig,
    )
    assert result.exit_code == ExitCode.for_cancel(sig.name) == code
    assert result.cancelled_by == sig.name and result.cleanup_confirmed is True
    assert "release" in _interventions(Path(result.run_dir))
