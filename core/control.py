"""What a front end (the TUI, the batch runner) may ask of a running episode.

The TUI never talks to a provider: it renders events from ``bus`` and sends these commands back.
"""

from __future__ import annotations

import abc

from core.events import EventBus
from core.sandbox.base import PtyHandle


class EpisodeControl(abc.ABC):
    """Handle on one live episode."""

    bus: EventBus

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """True until the outcome has been decided and the sandbox released (or kept)."""

    @abc.abstractmethod
    async def cancel(self) -> None:
        """Graceful close: stop the agent, confirm cleanup, release; returns once requested."""

    @abc.abstractmethod
    def keep_sandbox(self, keep: bool = True) -> None:
        """Keep (or stop keeping) the sandbox after the run for debugging instead of destroying it."""

    @abc.abstractmethod
    async def open_shell(self, cols: int = 80, rows: int = 24) -> PtyHandle:
        """An interactive shell in the sandbox's workdir; raises SandboxClosedError once released."""

    @abc.abstractmethod
    async def wait(self) -> object:
        """Wait for the episode to finish; returns its result."""
