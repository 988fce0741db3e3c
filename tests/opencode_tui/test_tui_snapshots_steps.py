"""SVG snapshots of the views added for issue 26's "missing, reached for": the step view, a person's shell
played in the replay, a subagent's calls marked, the diff's outputs side by side; each at 80×24 and
160×45, over the recorded runs in ``tests/fixtures/more-runs`` (see test_tui_steps_shells.py).

Update after an intended UI change with ``--snapshot-update`` and review the SVGs in ``__snapshots__``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opencode_tui.app import OpenCodeTUI
from opencode_tui.screens.diff import DiffScreen, OutputsScreen
from opencode_tui.screens.shell_replay import ShellReplayScreen
from opencode_tui.screens.step import StepScreen
from opencode_tui.widgets.timeline import Timeline

MORE = Path(__file__).resolve().parents[1] / "fixtures" / "more-runs"
SIZES = [(80, 24), (160, 45)]
ids = pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")


@ids
def test_step_view(snap_compare, replay_loaded, wait, size):
    """The failed `ls` of the human-shell run, opened from the timeline: command, exit 2, output, the
    model call that asked for it."""

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        pilot.app.screen.query_one(Timeline).focus()
        await pilot.press("home", "o", "enter")
        await wait(pilot, lambda: isinstance(pilot.app.screen, StepScreen), what="the step view")
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=MORE / "human-shell"), terminal_size=size, run_before=run_before)


@ids
def test_shell_replay(snap_compare, replay_loaded, wait, size):
    """The person's shell of the human-shell run: what it showed, and every line typed."""

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        await pilot.press("S")
        await wait(pilot, lambda: isinstance(pilot.app.screen, ShellReplayScreen), what="the shell")
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=MORE / "human-shell"), terminal_size=size, run_before=run_before)


@ids
def test_subagent_calls(snap_compare, replay_loaded, size):
    """The delegate run: the subagent's model calls marked ↳ in the calls table (at 80×24 its tab) and
    `a` on the timeline."""

    async def run_before(pilot) -> None:
        await replay_loaded(pilot)
        if size == (80, 24):
            await pilot.press("4")  # the model calls' tab
        await pilot.pause()

    assert snap_compare(OpenCodeTUI(run_dir=MORE / "delegate"), terminal_size=size, run_before=run_before)


@ids
def test_diff_outputs(snap_compare, wait, size):
    """Enter on the first divergence of human-shell against exit-137: both tool calls in full."""

    async def run_before(pilot) -> None:
        await wait(
            pilot,
            lambda: isinstance(pilot.app.screen, DiffScreen) and pilot.app.screen.loaded,
            what="the diff",
        )
        await pilot.press("enter")
        await wait(pilot, lambda: isinstance(pilot.app.screen, OutputsScreen), what="the outputs")
        await pilot.pause()

    app = OpenCodeTUI(diff=(MORE / "human-shell", MORE / "exit-137"))
    assert snap_compare(app, terminal_size=size, run_before=run_before)
