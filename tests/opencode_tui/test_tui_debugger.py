"""The debugger in the TUI (issue 27), driven by Pilot against REAL live episodes: the real OpenCode,
the scripted model on loopback, the local bubblewrap sandbox. The keys act through the run's real
control socket (``who="tui"``); what they did is read back from the run directory afterwards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from textual.widgets import TextArea

from opencode_tui import debug_acts
from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.debug_input import DebugInputScreen
from opencode_tui.screens.live import LiveRunScreen
from opencode_tui.screens.modals import ConfirmScreen, ModelCallScreen
from opencode_tui.widgets.header import RunHeader
from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.events import Intervention, ToolCall
from opencode_tui_core.tasks import load_task

SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
SAID = "A note from the keyboard: mention PELICAN-7 in your last message."


def _episode(tmp_path: Path, breaks: list[str], steps: list | None = None) -> Episode:
    task = tmp_path / "task"
    shutil.copytree(SAMPLES / "fix-bug", task)
    if steps is not None:
        (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": "local"}, "policy": {"max_attempts": 1}, "debug": {"breaks": breaks}}
    )
    return Episode(load_task(task), config, runs_dir=tmp_path / "runs")


def _whats(screen: LiveRunScreen) -> list[str]:
    return [i.what for i in screen.state.interventions]


def _notes(app: OpenCodeTUI) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def _type(pilot, text: str) -> None:
    for ch in text:
        await pilot.press("space" if ch == " " else ch)


def test_answer_box_reads_text_a_tool_call_and_the_full_form():
    assert debug_acts.parse_answer("just text\n").text == "just text"
    one = debug_acts.parse_answer('{"tool": "bash", "arguments": {"command": "ls"}, "text": "hi"}')
    assert one.text == "hi" and [(c.name, c.arguments) for c in one.tool_calls] == [
        ("bash", {"command": "ls"})
    ]
    full = debug_acts.parse_answer('{"tool_calls": [{"name": "read", "arguments": {"filePath": "/a"}}]}')
    assert [c.name for c in full.tool_calls] == ["read"]
    for bad, words in [
        ("   ", "the reply is empty"),
        ("{oops", "not valid JSON (line 1)"),
        ('{"tool": "bash", "argz": {}}', "unknown field(s) argz"),
        ('{"tool": ""}', "name: String should have at least 1 character"),
        ('{"tool_calls": 3}', "tool_calls"),
    ]:
        with pytest.raises(debug_acts.BadAnswer, match=r".+") as err:
            debug_acts.parse_answer(bad)
        assert words in str(err.value) and "\n" not in str(err.value)
    # what the edit box shows reads back as the same reply
    for answer in (one, full, debug_acts.parse_answer("plain")):
        assert debug_acts.parse_answer(debug_acts.answer_text(answer)) == answer


@pytest.mark.slow
@pytest.mark.bwrap
async def test_keys_at_a_break_say_refuse_step_edit_at_80x24(tmp_path, wait):
    """break call:2 → h shows the held request; a bad answer is refused (one line, nothing changed);
    m says; n steps to call 3; e forwards it and opens the model's reply in the edit box; the edit is
    what OpenCode runs. The header says HELD with the seconds and that the run deadline counts."""
    episode = _episode(tmp_path, ["call:2"])
    app = OpenCodeTUI(control=episode, run_episode=episode.run)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, LiveRunScreen)
        await wait(pilot, lambda: screen.state.held is not None, 120, "the break before call 2")
        assert screen.state.held is not None and screen.state.held.call_number == 2
        header = screen.query_one(RunHeader)
        await wait(pilot, lambda: "HELD before call 2" in header.plain, 5, "the header's HELD")
        assert "run deadline counting" in header.plain and header.plain.startswith("HELD before call 2 (")

        await pilot.press("h")  # the held request, readable
        await wait(pilot, lambda: isinstance(app.screen, ModelCallScreen), 10, "the held call's view")
        view = app.screen
        assert view.held is not None and "HELD" in str(view.query_one("#dialog").border_title)
        await pilot.pause(0.2)
        shown = "\n".join(str(s.render()) for s in view.query("#request-view Static"))
        assert "python3 -m unittest" in shown  # call 1's tool call is in the held conversation
        await pilot.press("escape")

        before = list(_whats(screen))
        await pilot.press("a")
        await wait(pilot, lambda: isinstance(app.screen, DebugInputScreen), 5, "the answer box")
        app.screen.query_one(TextArea).load_text('{"tool": "launch_rockets", "arguments": {}}')
        await pilot.press("ctrl+s")
        await wait(
            pilot,
            lambda: any("does not offer a tool named 'launch_rockets'" in n for n in _notes(app)),
            10,
            "the engine's refusal",
        )
        await pilot.press("a")
        await wait(pilot, lambda: isinstance(app.screen, DebugInputScreen), 5, "the answer box")
        app.screen.query_one(TextArea).load_text("{oops")
        await pilot.press("ctrl+s")
        await wait(pilot, lambda: any("not valid JSON" in n for n in _notes(app)), 5, "the box's refusal")
        assert _whats(screen) == before and screen.state.held is not None  # nothing changed

        await pilot.press("m")
        await wait(pilot, lambda: isinstance(app.screen, DebugInputScreen), 5, "the say box")
        await _type(pilot, SAID)
        await pilot.press("enter")
        await wait(pilot, lambda: "say" in _whats(screen), 60, "the say recorded")
        # (The header is redrawn at its own pace: the say may not have reached it yet.)
        await wait(pilot, lambda: "human intervened" in header.plain, 10, "the header's human intervened")

        await pilot.press("n")  # step: call 2 goes, call 3 is held
        await wait(
            pilot,
            lambda: screen.state.held is not None and screen.state.held.call_number == 3,
            120,
            "the break before call 3",
        )
        await pilot.press("e")
        await wait(pilot, lambda: isinstance(app.screen, DebugInputScreen), 120, "the edit box")
        area = app.screen.query_one(TextArea)
        reply = json.loads(area.text)  # the model's reply, prefilled
        assert reply["tool"] in ("read", "edit")
        reply["text"] = "Edited at the keyboard."
        area.load_text(json.dumps(reply))
        await pilot.press("ctrl+s")
        await wait(pilot, lambda: "edited" in _whats(screen), 30, "the edit recorded")
        await wait(pilot, lambda: screen.state.outcome is not None, 180, "the outcome")

    run_dir = Path(episode.run_dir.path)
    info = RunDirReader(run_dir).info()
    assert info is not None
    whats = [(i.what, i.who) for i in info.interventions]
    assert whats == [
        ("break", "engine"),
        ("say", "tui"),
        ("step", "tui"),
        ("break", "engine"),
        ("edit", "tui"),
        ("reply", "engine"),
        ("edited", "tui"),
    ]
    calls = [json.loads(x) for x in (run_dir / RunFiles.MODEL_CALLS).read_text().splitlines()]
    [edited] = [c for c in calls if c.get("edited_by")]
    assert edited["edited_by"] == "tui" and "Edited at the keyboard." in edited["response_body"]
    assert any(SAID in json.dumps(c["request_body"]) for c in calls)
    assert info.human_intervened and info.counts["cleanup_confirmed"] is True


@pytest.mark.slow
@pytest.mark.bwrap
async def test_break_now_then_abort_the_running_command(tmp_path, wait):
    """b while a long command runs holds the next call; x (confirmed) aborts the turn: the episode
    closes long before the command would have ended, cleanup confirmed."""
    steps = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 120", "description": "Wait"}}]},
        {"text": "done"},
    ]
    episode = _episode(tmp_path, [], steps)
    app = OpenCodeTUI(control=episode, run_episode=episode.run)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = app.screen
        assert isinstance(screen, LiveRunScreen)

        def sleeping() -> bool:
            return any(
                isinstance(e, ToolCall) and e.status == "running" and "sleep" in str(e.input)
                for e in screen.key_evs
            )

        await wait(pilot, sleeping, 120, "the running sleep")
        await pilot.press("b")
        await wait(pilot, lambda: "pause" in _whats(screen), 10, "the pause recorded")
        await pilot.press("x")
        await wait(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the abort question")
        await pilot.press("y")
        await wait(pilot, lambda: "abort" in _whats(screen), 60, "the abort recorded")
        await wait(pilot, lambda: screen.state.outcome is not None, 120, "the outcome")
    info = RunDirReader(Path(episode.run_dir.path)).info()
    assert info is not None and info.counts["cleanup_confirmed"] is True
    assert info.phase_durations_s["agent"] < 100
    assert [i.what for i in info.interventions if isinstance(i, Intervention)][:2] == ["pause", "abort"]


def _run_with_interventions(tmp_path: Path, fixture_runs: Path) -> tuple[Path, list[int]]:
    """hello-file's recorded run with a break, a say and a continue before its 2nd agent call (lines
    written as the engine writes them); returns the run and the interventions' stream indices."""
    from opencode_tui_core.events import ModelCall, encode

    run = tmp_path / "hello-file"
    shutil.copytree(fixture_runs / "hello-file", run)
    events = list(RunDirReader(run).events())
    agent = [i for i, e in enumerate(events) if isinstance(e, ModelCall) and e.kind == "agent"]
    at = agent[1]
    ts = events[at - 1].ts
    call_id = events[at].call_id
    acts = [
        Intervention(what="break", who="engine", call_id=call_id, call_number=2, text="call:2", ts=ts),
        Intervention(what="say", who="tui", call_id=call_id, call_number=2, text="PELICAN-7", ts=ts),
        Intervention(what="continue", who="ctl", call_id=call_id, call_number=2, ts=ts),
    ]
    lines = (run / RunFiles.EVENTS).read_text().splitlines()
    lines[at:at] = [encode(a) for a in acts]
    (run / RunFiles.EVENTS).write_text("\n".join(lines) + "\n")
    return run, [at, at + 1, at + 2]


async def test_replay_marks_interventions_jumps_to_them_and_shows_the_hold(
    tmp_path, fixture_runs, replay_loaded
):
    from opencode_tui.widgets.stats import StatsPanel
    from opencode_tui.widgets.timeline import Timeline

    run, indices = _run_with_interventions(tmp_path, fixture_runs)
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=(160, 45)) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        timeline = screen.query_one(Timeline)
        timeline.focus()
        assert timeline.markers["intervention"] == indices
        assert "I" in timeline.render().plain.split("\n")[1]
        stats = str(screen.query_one(StatsPanel).render())
        assert "Debugger     3  break 1 · say 1 · continue 1" in stats
        header = screen.query_one(RunHeader)
        assert "HELD" not in header.plain and "human intervened" in header.plain
        await pilot.press("home", "i")  # the break: the header says the call was held here
        assert screen.cursor == indices[0]
        await pilot.pause()
        assert header.plain.startswith("HELD before call 2 (0 s)") and "deadline" not in header.plain
        assert not screen.query_one("#held-bar").display  # nothing to act on in a replay
        assert "debugger break call 2 by engine: call:2" in timeline.render().plain
        await pilot.press("i", "i")
        assert screen.cursor == indices[2]
        await pilot.pause()
        assert "HELD" not in header.plain  # continued
        await pilot.press("I")
        assert screen.cursor == indices[1]
        bindings = {b.binding.id for b in app.active_bindings.values() if b.binding.id}
        assert "timeline-next-intervention" in bindings
