"""What a debugger reaches for on the run screen: search in the terminal pane, a filter on the model
calls, readable model calls, the verifier's output, the inputs as sent, each cleanup step's detail.

Driven by Pilot over the recorded run directories (tests/fixtures/runs, real episodes) and the
constructed run of conftest.py where a recorded run lacks the case.
"""

from __future__ import annotations

from core.artifacts import RunDirReader
from core.events import ModelCall
from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.run import RunScreen
from opencode_tui.widgets.findbar import FindBar
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.terminal import TerminalView

SIZE = (160, 45)


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
        await pilot.press("slash", *" status:2xx", "enter")  # the bar opens with the filter in it
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
