"""What a front end (the TUI, the batch runner) may ask of a running episode.

The TUI never talks to a provider: it renders events from ``bus`` and sends these commands back.
"""

from __future__ import annotations

import abc
import signal

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.artifacts import RunDir
from opencode_tui_core.events import EventBus, Phase
from opencode_tui_core.sandbox.base import PtyHandle

CANCELLED_BY_USER = "user"  # `c` or `q` in the TUI
CANCELLED_BY_CALLER = "caller"  # the task running the episode was cancelled
# The signals a front end turns into a graceful close; their names are what the record says.
CLOSING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class CancelRequest(BaseModel):
    """Who asked the episode to stop, in which phase, and whether a second request hurried it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    by: str  # "user", "caller", or a signal name such as "SIGTERM"
    phase: Phase
    hurry: bool = False
    hurried_by: str | None = None

    @property
    def words(self) -> str:
        return "cancelled by the user" if self.by == CANCELLED_BY_USER else f"cancelled by {self.by}"


class EpisodeControl(abc.ABC):
    """Handle on one live episode."""

    bus: EventBus
    # The episode's run directory once it exists (its ``path`` is where the front end reads model-call
    # bodies); None before, and for an episode that keeps none.
    run_dir: RunDir | None = None

    @property
    @abc.abstractmethod
    def running(self) -> bool:
        """True until the outcome has been decided and the sandbox released (or kept)."""

    @abc.abstractmethod
    async def cancel(self, by: str = CANCELLED_BY_USER) -> None:
        """Graceful close: stop the agent, confirm cleanup, release; returns once requested.

        ``by`` is what asked (``user``, or a signal name); a second call hurries the close."""

    @property
    @abc.abstractmethod
    def kept(self) -> bool:
        """Whether the sandbox will be (or was) kept after the run: the one source of truth."""

    @property
    @abc.abstractmethod
    def keep_changeable(self) -> bool:
        """False once the release has started: the sandbox's fate is then decided."""

    @abc.abstractmethod
    def keep_sandbox(self, keep: bool = True) -> None:
        """Keep (or stop keeping) the sandbox after the run for debugging instead of destroying it."""

    @abc.abstractmethod
    async def open_shell(self, cols: int = 80, rows: int = 24) -> PtyHandle:
        """An interactive shell in the sandbox's workdir; raises SandboxClosedError once released."""

    @abc.abstractmethod
    async def wait(self) -> object:
        """Wait for the episode to finish; returns its result."""
