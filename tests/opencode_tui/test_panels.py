"""The panel registry (opencode_tui/panels.py) against what the run screens lay out: a registered panel
that is not on the live or the replay screen fails here, and so does a widget in the panel area that is
not registered. Also: the panel protocol (state bound downward) and the compact tabs follow the registry.

The live screen is fed a recorded run's events on a real ``EventBus`` by a stand-in for the engine (an
engine would need Docker and minutes; what is checked is the screen's layout).
"""

from __future__ import annotations

import pytest
from textual.containers import Horizontal, Vertical
from textual.widget import Widget

from opencode_tui.app import OpenCodeTUI
from opencode_tui.panels import RUN_PANELS
from opencode_tui.screens.live import LiveRunScreen
from opencode_tui.screens.replay import ReplayRunScreen
from opencode_tui.screens.run import RunScreen
from opencode_tui.widgets.base import ShowsRunState
from opencode_tui.widgets.findbar import FindBar
from opencode_tui.widgets.tabs import PANELS, PanelTabs
from opencode_tui_core.artifacts import RunDirReader
from tests.opencode_tui.conftest import RecordedEpisode

REGIONS = {"main": "#main", "side": "#side", "bottom": "#bottom"}


def _app(kind: str, run_dir) -> OpenCodeTUI:
    if kind == "replay":
        return OpenCodeTUI(run_dir=run_dir)
    episode = RecordedEpisode(list(RunDirReader(run_dir).events()))
    return OpenCodeTUI(control=episode, run_dir=run_dir, run_episode=episode.play)


def _panel_area_leaves(screen: RunScreen) -> list[Widget]:
    """The widgets in the panel area that are not its containers or a registered panel's search bar."""
    panes = {spec.pane for spec in RUN_PANELS} | {"side"}
    bars = {spec.bar.id for spec in RUN_PANELS if spec.bar is not None}
    leaves: list[Widget] = []

    def walk(node: Widget) -> None:
        for child in node.children:
            if isinstance(child, Horizontal | Vertical) and child.id in panes:
                walk(child)
            elif not (isinstance(child, FindBar) and child.id in bars):
                leaves.append(child)

    for region in ("#main", "#bottom"):
        walk(screen.query_one(region))
    return leaves


@pytest.mark.parametrize("kind", ["live", "replay"])
async def test_every_registered_panel_is_laid_out_and_nothing_else(kind, fixture_runs, wait):
    app = _app(kind, fixture_runs / "oom")
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, LiveRunScreen if kind == "live" else ReplayRunScreen)
        await wait(pilot, lambda: screen.total > 0, what="the first events")
        # registered -> laid out, in its region, of its class
        for spec in RUN_PANELS:
            widget = screen.query_one(f"#{spec.id}", spec.widget)
            region = screen.query_one(REGIONS[spec.region])
            assert widget in region.query(spec.widget), (spec.id, spec.region)
            if spec.region == "main":
                assert widget not in screen.query_one("#side").query(spec.widget), spec.id
            if spec.bar is not None:
                assert screen.query_one(f"#{spec.pane}").query_one(f"#{spec.bar.id}", FindBar)
        # laid out -> registered
        leaves = _panel_area_leaves(screen)
        assert sorted(w.id or type(w).__name__ for w in leaves) == sorted(s.id for s in RUN_PANELS)
        # the tabs and the number keys are the registry's, in its order
        assert [pid for pid, _title in PANELS] == [s.id for s in RUN_PANELS]
        keys = {b.action: b.key for b in _all(screen)}
        for i, spec in enumerate(RUN_PANELS, 1):
            assert keys[f"panel('{spec.id}')"] == str(i)


def _all(screen: RunScreen):
    return [b for bindings in screen._bindings.key_to_bindings.values() for b in bindings]


@pytest.mark.parametrize("kind", ["live", "replay"])
async def test_a_small_terminal_shows_each_registered_panel_alone(kind, fixture_runs, wait):
    app = _app(kind, fixture_runs / "oom")
    async with app.run_test(size=(90, 28)) as pilot:
        screen = app.screen
        await wait(pilot, lambda: screen.total > 0, what="the first events")
        assert screen.compact and screen.query_one(PanelTabs).display
        for i, spec in enumerate(RUN_PANELS, 1):
            await pilot.press(str(i))
            shown = [s.id for s in RUN_PANELS if screen.query_one(f"#{s.id}").display]
            assert shown == [spec.id], (i, shown)
            assert screen.query_one(f"#{spec.id}").region.height >= 12, spec.id
            assert screen.query_one(PanelTabs).active == spec.id


async def test_state_is_bound_down_into_every_panel_that_shows_it(fixture_runs, replay_loaded):
    """Moving the replay cursor sets the screen's ``view_state`` only: every ShowsRunState widget
    (panels and the warnings bar) receives it, and shows the run as of the cursor."""
    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert isinstance(screen, ReplayRunScreen)
        bound = [w for w in screen.query("*") if isinstance(w, ShowsRunState)]
        assert {w.id for w in bound} >= {s.id for s in RUN_PANELS if issubclass(s.widget, ShowsRunState)}
        assert "warnings" in {w.id for w in bound}
        assert all(w.view_state is screen.state for w in bound)
        screen.seek(0)
        await pilot.pause()
        assert screen.view_state is not screen.state and screen.view_state.events <= 1
        assert all(w.view_state is screen.view_state for w in bound)
        assert screen.query_one("#calls").row_count == 0 and screen.query_one("#failures").row_count == 0
        screen.seek(None)
        await pilot.pause()
        assert all(w.view_state is screen.state for w in bound)
        assert screen.query_one("#calls").row_count == len(screen.state.model_calls) > 0


async def test_queued_seeks_are_one_fold(fixture_runs, replay_loaded, monkeypatch):
    """Seeks that pile up while the screen is busy (a held key, a dragged timeline) are coalesced
    (``Timeline.Seek.can_replace``): only the newest is folded, and it is the one shown."""
    from opencode_tui.widgets.timeline import Timeline

    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_loaded(pilot)
        screen = app.screen
        assert isinstance(screen, ReplayRunScreen)
        folded: list[int | None] = []
        seek = screen.seek

        def counting_seek(index: int | None) -> None:
            folded.append(index)
            seek(index)

        monkeypatch.setattr(screen, "seek", counting_seek)
        for index in range(10):
            screen.post_message(Timeline.Seek(index))
        await pilot.pause()
        assert folded == [9] and screen.cursor == 9
