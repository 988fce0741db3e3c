"""The run screen's panels, written once: what each is, where it is laid out, which search bar it has.

The live and replay screens lay out exactly these (``RunScreen.compose``), the compact tabs and the
number keys list them in this order, and a test fails if a registered panel is not on a run screen or a
widget in the panel area is not registered. A panel that shows the folded run state implements
:class:`opencode_tui.widgets.base.ShowsRunState`; the screen binds its ``view_state`` into it.

Adding a panel: its widget module, one ``PanelSpec`` here, and its CSS if the defaults do not fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from textual.widget import Widget

from opencode_tui.widgets.cleanup import CleanupPanel
from opencode_tui.widgets.failures import FailuresTable
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.stats import StatsPanel
from opencode_tui.widgets.terminal import TerminalView

Region = Literal["main", "side", "bottom"]  # left of the top row, its right column, the bottom row


@dataclass(frozen=True)
class SearchBar:
    """A search/filter bar under the panel (both are wrapped in ``#<panel id>-pane``)."""

    id: str
    placeholder: str


@dataclass(frozen=True)
class PanelSpec:
    id: str  # the widget's id on the run screen
    title: str  # its tab's and its number key's name
    widget: type[Widget]
    region: Region
    bar: SearchBar | None = None
    border_title: str | None = None  # for a panel that does not set its own

    @property
    def pane(self) -> str:
        """The id of what is shown or hidden for this panel in the compact layout."""
        return f"{self.id}-pane" if self.bar is not None else self.id


RUN_PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "terminal",
        "Terminal",
        TerminalView,
        "main",
        SearchBar("terminal-find", "search the terminal · Enter: find · Esc: close"),
    ),
    PanelSpec("stats", "Stats", StatsPanel, "side", border_title="Stats"),
    PanelSpec("cleanup", "Cleanup", CleanupPanel, "side", border_title="Cleanup"),
    PanelSpec(
        "calls",
        "Model calls",
        ModelCallsTable,
        "bottom",
        SearchBar(
            "calls-filter",
            "filter calls: status:error|ok|4xx|5xx|429 kind:agent|title|compaction, or words",
        ),
    ),
    PanelSpec("failures", "Failures", FailuresTable, "bottom"),
)


def panel_spec(panel_id: str) -> PanelSpec:
    return next(p for p in RUN_PANELS if p.id == panel_id)
