"""What a screen may ask of the app that hosts it (``OpenCodeTUI`` is the one implementation).

Screens depend on this, never on ``opencode_tui.app`` (which imports every screen): the app and its
screens then form no import circle.
"""

from __future__ import annotations

import asyncio

from textual.app import App

from opencode_tui_core.events import Event


class EpisodeHost(App[None]):
    """The app's side of a live episode, as the run screens use it."""

    def live_queue(self) -> asyncio.Queue[Event]:
        """The queue of live events (subscribed to the episode's bus once, in this app's loop)."""
        raise NotImplementedError

    @property
    def episode_running(self) -> bool:
        raise NotImplementedError

    def request_cancel(self) -> None:
        """Cancel the live episode (``c``): a graceful close, cleanup confirmed."""
        raise NotImplementedError

    def toggle_keep(self) -> None:
        """Keep the sandbox after the run, or not (``k``)."""
        raise NotImplementedError

    @property
    def can_rerun(self) -> bool:
        """The live run, once ended, can be run again here (``r``)."""
        return False
