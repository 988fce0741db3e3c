"""SVG snapshots of the main screens and modals, driven by Pilot over the recorded run directories
(``tests/fixtures/runs``, recorded by ``scripts/record-fixture-runs``).

Update after an intended UI change with ``pytest tests/opencode_tui --snapshot-update`` and review the
SVGs in ``__snapshots__``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.artifacts import RunDirReader
from core.events import ModelCall, TerminalOutput, ToolCall
from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.modals import FailureScreen, ModelCallScreen
from opencode_tui.themes import BUILTIN_ORDER
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.model_calls import ModelCallsTable

SIZE = (160, 45)


def test_run_screen_mid_episode(snap_compare, fixture_runs, replay_loaded):
    run = fixture_runs / "hello-file"
    events = list(RunDirReader(run).events())
    # mid-episode: the agent's bash command is running and its output has just been shown (the server
    # stream's live output on the display stream), before the agent's last model call and before cleanup
    bash = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, ToolCall) and e.tool == "bash" and e.status == "running"
    )
    mid = next(
        i
        for i, e in enumerate(events)
        if i > bash and isinstance(e, TerminalOutput) and e.stream == "display" and "Hello from" in e.data
    )
    assert not any(isinstance(e, ToolCall) and e.status == "completed" for e in events[bash:mid])
    assert any(isinstance(e, ModelCall) for e in events[mid:])

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        pilot.app.screen.seek(mid)
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=run), terminal_size=SIZE, run_before=run_before)


def test_failure_detail_modal(snap_compare, fixture_runs, replay_loaded):
    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        pilot.app.screen.query_one(FailuresTable).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(pilot.app.screen, FailureScreen)

    assert snap_compare(OpenCodeTUI(run_dir=fixture_runs / "oom"), terminal_size=SIZE, run_before=run_before)


def test_model_call_detail_modal(snap_compare, fixture_runs, replay_loaded, wait):
    run = fixture_runs / "hello-file"
    events = list(RunDirReader(run).events())
    agent_row = next(
        i for i, e in enumerate(e for e in events if isinstance(e, ModelCall)) if e.kind == "agent"
    )

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        table = pilot.app.screen.query_one(ModelCallsTable)
        table.focus()
        table.move_cursor(row=agent_row)
        await pilot.press("enter")
        modal = pilot.app.screen
        assert isinstance(modal, ModelCallScreen)
        await wait(pilot, lambda: modal.loaded, what="the call's bodies")
        await pilot.press("right")  # Request tab
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=run), terminal_size=SIZE, run_before=run_before)


def test_runs_browser(snap_compare, fixture_runs, monkeypatch):
    async def run_before(pilot) -> None:
        await pilot.pause()

    monkeypatch.chdir(
        fixture_runs.parent
    )  # the title shows the runs dir as given: keep it checkout-independent
    app = OpenCodeTUI(runs_dir=Path(fixture_runs.name))
    assert snap_compare(app, terminal_size=(140, 20), run_before=run_before)


@pytest.mark.parametrize("theme", BUILTIN_ORDER)
def test_theme(snap_compare, fixture_runs, replay_loaded, theme):
    async def run_before(pilot) -> None:
        await replay_loaded(pilot)

    app = OpenCodeTUI(run_dir=fixture_runs / "oom", theme=theme)
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
