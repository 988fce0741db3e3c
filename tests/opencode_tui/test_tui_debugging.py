"""What a debugger reaches for on the run screen: search in the terminal pane, a filter on the model
calls, readable model calls, the verifier's output, the inputs as sent, each cleanup step's detail.

Driven by Pilot over the recorded run directories (tests/fixtures/runs, real episodes) and the
constructed run of conftest.py where a recorded run lacks the case.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from textual.widgets import Collapsible, Static, TabbedContent, TextArea

from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.modals import FailureScreen, ModelCallScreen
from opencode_tui.screens.run import RunScreen
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.findbar import FindBar
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.terminal import TerminalView
from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.calls.records import assembled_tool_calls
from opencode_tui_core.events import ModelCall

SIZE = (160, 45)
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"


def _styles_at(term: TerminalView, line: int) -> list[tuple[str, object]]:
    """(text, background) of each segment of ``line`` as drawn."""
    strip = term._line_strip(line, term.rich_style)
    return [(seg.text, seg.style.bgcolor if seg.style else None) for seg in strip]


async def test_search_in_the_terminal_pane_rendered_and_raw(fixture_runs, replay_loaded, wait):
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        term = screen.terminal
        rendered = [line.lower() for line in term.rendered.plain(0, term.rendered.count)]
        expected = sum(line.count("hello") for line in rendered)
        assert expected >= 2
        term.focus()
        await pilot.press("slash")
        bar = screen.query_one("#terminal-find", FindBar)
        assert bar.display and bar.has_focus
        await pilot.press(*"HeLLo", "enter")
        await pilot.pause()
        assert not bar.display and term.has_focus
        assert len(term.matches) == expected  # case-insensitive, every occurrence
        first = term.current
        line, start, end = term.matches[first]
        assert rendered[line][start:end] == "hello"
        assert f"/HeLLo: {first + 1}/{expected}" in term.border_subtitle
        assert not term.follow  # moving to a match pauses following
        # the current match is drawn in its own colour, the others in the match colour
        current_bg = term.get_component_rich_style("terminal--match-current").bgcolor
        match_bg = term.get_component_rich_style("terminal--match").bgcolor
        segs = _styles_at(term, line)
        assert ("hello", current_bg) in [(t.lower(), bg) for t, bg in segs]
        other = next(m for i, m in enumerate(term.matches) if i != first)
        assert ("hello", match_bg) in [(t.lower(), bg) for t, bg in _styles_at(term, other[0])]
        # n / N move through the matches (wrapping); they do not jump to failures while searching
        await pilot.press("n")
        assert term.current == (first + 1) % expected
        await pilot.press("N", "N")
        assert term.current == (first - 1) % expected
        assert screen.cursor is None  # the timeline did not move (n is not "next failure" here)
        top = term.scroll_offset.y
        assert top <= term.matches[term.current][0] < top + term.scrollable_content_region.height
        # the raw view: the same query over the harness's raw output (OpenCode's JSON lines included)
        await pilot.press("r")
        await pilot.pause()
        assert term.view == "raw"
        raw_lines = [term._line_text(i).lower() for i in range(term.line_count)]
        raw_expected = sum(line.count("hello") for line in raw_lines)
        assert raw_expected > expected and len(term.matches) == raw_expected
        line, start, end = term.matches[term.current]
        assert raw_lines[line][start:end] == "hello"
        # Escape clears the search; n is the screen's "next failure" again
        await pilot.press("escape")
        assert term.query == "" and term.matches == [] and "/" not in term.border_subtitle
        # ctrl+f from another panel opens the search too
        screen.query_one(ModelCallsTable).focus()
        await pilot.press("ctrl+f")
        await pilot.pause()
        assert bar.display and bar.has_focus
        await pilot.press(*"no such text", "enter")
        await pilot.pause()
        assert term.matches == [] and "no match" in term.border_subtitle


async def test_a_new_search_replaces_the_previous_query(fixture_runs, replay_loaded):
    """/hello⏎ then /zzz⏎ searches zzz (it searched hellozzz): the bar reopens with the old query
    selected, so typing replaces it."""
    app = OpenCodeTUI(run_dir=fixture_runs / "hello-file")
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        term = app.screen.terminal
        term.focus()
        await pilot.press("slash", *"hello", "enter")
        await pilot.pause()
        assert term.query == "hello" and term.matches
        await pilot.press("slash")
        bar = app.screen.query_one("#terminal-find", FindBar)
        assert bar.value == "hello" and bar.selected_text == "hello"
        await pilot.press(*"zzz", "enter")
        await pilot.pause()
        assert term.query == "zzz" and term.matches == []
        await pilot.press("slash", "end", *"y", "enter")  # End keeps the query to edit
        await pilot.pause()
        assert term.query == "zzzy"


async def test_search_finds_output_that_arrives_later(constructed_run, replay_loaded):
    """n after new lines: the search extends over what arrived since (here: the timeline moved on)."""
    app = OpenCodeTUI(run_dir=constructed_run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        term = screen.terminal
        assert isinstance(screen, RunScreen)
        screen.seek(0)
        await pilot.pause()
        assert term.search("killed") == 0
        screen.seek(screen.total - 1)
        await pilot.pause()
        term.action_find_next(1)
        assert len(term.matches) == 1 and term.current == 0


async def test_model_calls_filter_by_status_and_kind(constructed_run, fixture_runs, replay_loaded):
    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    calls = [e for e in RunDirReader(fixture_runs / "oom").events() if isinstance(e, ModelCall)]
    kinds = {c.call_id: c.kind for c in calls}
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(ModelCallsTable)
        total = len(table.calls)
        assert total == len(kinds) >= 3
        table.focus()
        await pilot.press("slash")
        bar = app.screen.query_one("#calls-filter", FindBar)
        assert bar.has_focus
        await pilot.press(*"kind:title", "enter")
        await pilot.pause()
        assert [c.kind for c in table.calls] == ["title"] and table.row_count == 1
        assert f"1/{total}" in table.border_subtitle
        # the bar opens with the filter in it, selected: End (or an arrow) keeps it to refine
        await pilot.press("slash", "end", *" status:2xx", "enter")
        await pilot.pause()
        assert table.filter_text == "kind:title status:2xx" and table.row_count == 1
        await pilot.press("slash", "escape")  # Escape: no filter
        await pilot.pause()
        assert table.row_count == total and table.border_subtitle == str(total)
    app = OpenCodeTUI(run_dir=constructed_run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(ModelCallsTable)
        table.set_filter("status:error")
        assert [c.call_id for c in table.calls] == ["c-lost"]
        table.set_filter("status:ok|pending")
        assert [c.call_id for c in table.calls] == ["c-ok"]
        table.set_filter("connection")  # a word: matches the error text
        assert [c.call_id for c in table.calls] == ["c-lost"]


def write_failed_call_run(runs_dir: Path) -> Path:
    """A CONSTRUCTED run (real writer, typed events): a model call answered 500 and the failure the
    engine derives from its record (opencode_tui_core.model.endpoint.failure_from_record). The recorded runs have
    no failed model call; the sample task model-flaky-500 produces one, in minutes of real episode."""
    from opencode_tui_core.artifacts import RunDir
    from opencode_tui_core.calls.records import ModelCallRecord
    from opencode_tui_core.events import EpisodeStarted, EventBus, FailureRecorded
    from opencode_tui_core.failures import FailureStage, decide
    from opencode_tui_core.model.endpoint import failure_from_record

    rd = RunDir.create(runs_dir, "constructed-500")
    bus = EventBus()
    bus.subscribe(rd.append_event)
    t0 = datetime(2025, 5, 14, 9, 30, tzinfo=UTC)
    bus.emit(
        EpisodeStarted(
            ts=t0,
            run_id="constructed-500",
            task_id="t",
            provider="docker",
            opencode_version="1.18.32",
            run_budget_s=60,
            close_budget_s=30,
            model="scripted",
        )
    )
    records = [
        ModelCallRecord(
            call_id=f"c-{n}",
            method="POST",
            path="/v1/chat/completions",
            status=status,
            started_at=t0 + timedelta(seconds=n),
            latency_s=0.2,
            kind="agent",
            request_body={"model": "m", "messages": [{"role": "user", "content": f"try {n}"}]},
            response_body={"error": {"message": "upstream boom"}} if status == 500 else None,
        )
        for n, status in ((1, 200), (2, 500))
    ]
    with (rd.path / RunFiles.MODEL_CALLS).open("w") as f:
        for rec in records:
            f.write(rec.model_dump_json() + "\n")
            bus.emit(rec.to_event().model_copy(update={"ts": rec.started_at}))
    failure = failure_from_record(records[1], FailureStage.AGENT)
    bus.emit(FailureRecorded(ts=t0 + timedelta(seconds=3), failure=failure, decision=decide(failure)))
    rd.close()
    return rd.path


async def test_enter_on_a_failures_call_id_opens_that_call(tmp_path, replay_loaded, wait):
    app = OpenCodeTUI(run_dir=write_failed_call_run(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        app.screen.query_one(FailuresTable).focus()
        await pilot.press("enter")
        await pilot.pause()
        detail = app.screen
        assert isinstance(detail, FailureScreen) and detail.call_ids == ["c-2"]
        # the proxy's record is the failure's evidence, not "none"
        assert "source model.proxy" in detail.render_detail().plain
        assert "none: the diagnosis rests on no authoritative observation" not in detail.render_detail().plain
        assert detail.focused is not None and "c-2" in str(detail.focused.label)
        await pilot.press("enter")
        await pilot.pause()
        call = app.screen
        assert isinstance(call, ModelCallScreen) and call.call.call_id == "c-2" and call.call.status == 500
        await wait(pilot, lambda: call.loaded, what="the call's record")
        assert "upstream boom" in call.query_one("#response-view").query_one(Static).render().plain
        # a failed call says its status and error, never "error –" (issue 25)
        summary = call.query_one("#call-summary", Static).render().plain
        assert "upstream answered HTTP 500" in summary and "upstream boom" in summary
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)
        assert app.screen.query_one(ModelCallsTable).selected.call_id == "c-2"


async def test_model_call_reads_as_a_conversation_and_an_assembled_response(
    fixture_runs, replay_loaded, wait
):
    run = fixture_runs / "oom"
    records = list(RunDirReader(run).model_calls())
    last = next(r for r in reversed(records) if r.kind == "agent" and len(r.request_body["messages"]) > 3)
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(ModelCallsTable)
        table.focus()
        table.select_call(last.call_id)
        await pilot.press("enter")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ModelCallScreen)
        await wait(pilot, lambda: modal.loaded, what="the call's record")
        summary = modal.query_one("#call-summary").render().plain
        # latency and TTFT near the top; the session id from OpenCode's header (x-opencode-session)
        assert summary.splitlines()[3].startswith("latency") and summary.splitlines()[4].startswith("TTFT")
        session = last.request_headers["x-opencode-session"]
        assert f"session id              {session}" in summary
        await pilot.press("right")  # the Request tab: a conversation
        await pilot.pause()
        view = modal.query_one("#request-view")
        folded = list(view.query(Collapsible))
        system = last.request_body["messages"][0]["content"]
        assert [c.collapsed for c in folded] == [True, True]
        assert folded[0].title == f"System prompt · {len(system):,} characters"
        assert folded[1].title.startswith(f"Tools · {len(last.request_body['tools'])}: bash")
        messages = [s.render().plain for s in view.query(".message")]
        roles = [m["role"] for m in last.request_body["messages"][1:]]
        assert [m.split("\n", 1)[0].split()[0] for m in messages] == roles
        assert any("→ bash" in m and '"command":' in m for m in messages)  # arguments parsed, pretty
        assert system not in "".join(messages)  # the 10k system prompt stays folded
        # End reaches the end; r shows the raw body, End reaches its end too
        await pilot.press("end")
        await pilot.pause()
        assert view.max_scroll_y > 0 and view.scroll_offset.y == view.max_scroll_y
        await pilot.press("r")
        await pilot.pause()
        raw = modal.query_one("#request", TextArea)
        assert raw.display and not view.display and json.loads(raw.text) == last.request_body
        await pilot.press("end")
        await pilot.pause()
        assert raw.cursor_location == raw.document.end and raw.scroll_offset.y == raw.max_scroll_y > 0
        await pilot.press("r", "right")  # readable again, the Response tab: assembled from the stream
        await pilot.pause()
        shown = modal.query_one("#response-assembled").render().plain
        assert "assembled from" in shown and f"finish reason {last.finish_reason}" in shown
        for name, args in assembled_tool_calls(last.response_body):
            assert f"→ {name}" in shown and json.dumps(json.loads(args), indent=2) in shown
        assert "data:" not in shown


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """A real episode (bubblewrap, the pinned OpenCode, the scripted model) of hello-file with an
    instructions file added, run the way a user runs it: ``opencode-tui run --batch``."""
    tmp = tmp_path_factory.mktemp("inspect")
    task = tmp / "hello-file"
    shutil.copytree(SAMPLES / "hello-file", task)
    data = yaml.safe_load((task / "task.yaml").read_text())
    data["instructions"] = "Keep every answer to one sentence.\n"
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    runs = tmp / "runs"
    cmd = [sys.executable, "-m", "opencode_tui.cli", "run", str(task), "--batch", "--provider", "local"]
    done = subprocess.run([*cmd, "--runs-dir", str(runs)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(json.loads(done.stdout.splitlines()[-1])["run_dir"])


@pytest.mark.slow
@pytest.mark.bwrap
async def test_inspect_cleanup_verifier_and_inputs_of_a_real_run(real_run, replay_loaded, wait):
    from opencode_tui.screens.inspect import InspectScreen
    from opencode_tui_core.tasks import load_task, render_prompt

    reader = RunDirReader(real_run)
    task_file = Path(reader.info().task_dir) / "task.yaml"
    app = OpenCodeTUI(run_dir=real_run)
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_loaded(pilot)
        app.screen.query_one("#cleanup").focus()  # Enter on the cleanup panel: its detail
        await pilot.press("enter")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, InspectScreen)
        await wait(pilot, lambda: modal.loaded, what="the run's files")
        detail = modal.query_one("#cleanup-detail").render().plain
        receipt = next(e for e in reader.events() if e.type == "cleanup" and e.step == "receipt")
        assert "✓ Cleanup receipt ok" in detail
        assert "cleanup confirmed       true" in detail
        assert f"descendants killed      {receipt.data['descendants_killed']}" in detail
        assert 'action                  "destroyed"' in detail  # what became of the sandbox
        await pilot.press("escape", "v")  # v: the same screen from anywhere on the run screen
        await pilot.pause()
        modal = app.screen
        await wait(pilot, lambda: modal.loaded, what="the run's files")
        stdout, stderr = reader.verifier_output()
        assert modal.query_one("#verify-stdout", TextArea).text == (stdout or "(empty)")
        assert modal.query_one("#verify-stderr", TextArea).text == (stderr or "(empty)")
        assert (
            "Verification passed · exit 0 · reward 1" in modal.query_one("#verifier-summary").render().plain
        )
        # what OpenCode was given, exactly as sent
        task = load_task(task_file.parent)
        assert modal.query_one("#prompt", TextArea).text == render_prompt(task)
        assert modal.query_one("#instructions", TextArea).text == "Keep every answer to one sentence.\n"
        assert modal.query_one("#task", TextArea).text == task_file.read_text()
        modal.query_one(TabbedContent).active = "tab-task"
        await pilot.pause()
        await pilot.press("end")
        area = modal.query_one("#task", TextArea)
        assert area.cursor_location == area.document.end


async def test_inspect_says_what_an_older_run_did_not_record(fixture_runs, replay_loaded, wait):
    """The recorded fixture runs predate input/ and kept no verifier output: said, never blank."""
    from opencode_tui.screens.inspect import InspectScreen

    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        await pilot.press("v")
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, InspectScreen)
        await wait(pilot, lambda: modal.loaded, what="the run's files")
        assert modal.query_one("#prompt", TextArea).text.startswith("not recorded")
        assert modal.query_one("#instructions", TextArea).text.startswith("not recorded")
        assert modal.query_one("#verify-stdout", TextArea).text.startswith("not recorded")
        assert "✓ Sandbox released ok" in modal.query_one("#cleanup-detail").render().plain


async def test_search_follows_the_timeline_both_ways(constructed_run, replay_loaded):
    """The matches follow what the pane shows: the timeline moved back hides later matches, moved
    forward finds them again (no key press needed: output is searched as it arrives)."""
    app = OpenCodeTUI(run_dir=constructed_run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        term = screen.terminal
        assert term.search("memory") == 1  # the progress line (collapsed to its last overwrite)
        assert term.search("killed") == 1
        screen.seek(0)
        await pilot.pause()
        assert term.matches == [] and "no match" in term.border_subtitle
        screen.seek(screen.total - 1)
        await pilot.pause()
        assert len(term.matches) == 1 and "/killed: " in term.border_subtitle


async def test_search_in_the_cast_playback_view(fixture_runs, replay_loaded, wait):
    """/ while terminal.cast plays, pressed where a person is then (on the timeline, after Home and p):
    the search bar opens for the terminal pane, the recording's lines are searched like the other
    views, n moves through the matches, and the view stays the recording's."""
    run = fixture_runs / "hello-file"
    cast = RunDirReader(run).cast()
    assert cast is not None and cast.frames
    app = OpenCodeTUI(run_dir=run)
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert isinstance(screen, RunScreen)
        term = screen.terminal
        screen.query_one("#timeline").focus()
        await pilot.press("home", "f", "p")  # fast playback of terminal.cast
        assert term.view == "cast"
        await wait(pilot, lambda: screen.play_frame >= len(cast.frames), what="the recording to play")
        cast_lines = [term._line_text(i).lower() for i in range(term.line_count)]
        needle = "hello"
        expected = sum(line.count(needle) for line in cast_lines)
        assert expected >= 1, cast_lines[-10:]
        await pilot.press("slash")
        bar = screen.query_one("#terminal-find", FindBar)
        assert bar.display and bar.has_focus
        await pilot.press(*needle, "enter")
        await pilot.pause()
        assert term.view == "cast" and len(term.matches) == expected
        first = term.current
        line, start, end = term.matches[first]
        assert cast_lines[line][start:end] == needle
        assert f"/{needle}: {first + 1}/{expected}" in term.border_subtitle
        await pilot.press("n")
        assert term.current == (first + 1) % expected and term.view == "cast"


@pytest.mark.slow
@pytest.mark.bwrap
async def test_a_lost_transcript_is_a_warning_row_and_the_reward_stands(tmp_path, replay_loaded):
    """A REAL episode (local provider, the real OpenCode) whose agent deletes OpenCode's database: the
    snapshot fails after the verifier passed. The failures table shows it as a warning, not as the
    action that would have decided it, and the header's outcome is scored with reward 1."""
    from opencode_tui.widgets.header import RunHeader
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.episode import Episode
    from opencode_tui_core.tasks import load_task

    task = tmp_path / "task"
    shutil.copytree(Path(__file__).resolve().parents[2] / "sample_tasks" / "hello-file", task)
    trajectory = yaml.safe_load((task / "trajectory.yaml").read_text())
    remove = {"name": "bash", "arguments": {"command": 'rm -f "$XDG_DATA_HOME"/opencode/opencode.db*'}}
    trajectory["steps"].insert(-1, {"tool_calls": [remove]})
    (task / "trajectory.yaml").write_text(yaml.safe_dump(trajectory))
    config = AgentConfig.model_validate({"sandbox": {"provider": "local"}, "policy": {"max_attempts": 1}})
    result = await Episode(load_task(task), config, runs_dir=tmp_path / "runs").run()
    assert (result.action, result.reward) == ("scored", 1.0)

    app = OpenCodeTUI(run_dir=Path(result.run_dir))
    async with app.run_test(size=SIZE) as pilot:
        await replay_loaded(pilot)
        table = app.screen.query_one(FailuresTable)
        rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert rows[0][:4] == [
            "transcript_export_failed",
            "transcript",
            "evaluation",
            "warning (mark_evaluation_error)",
        ]
        assert "transcript.snapshot" in rows[0][4]
        assert app.screen.query_one(RunHeader).plain.startswith("done · scored · reward 1")
