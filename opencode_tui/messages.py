"""App-level messages. Live and replay both deliver events as :class:`EventsReceived` batches; the
``*Wanted`` ones are how a screen asks the app for something (they bubble up to it); the rest record
what the user asked of the episode, so functional tests can assert on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from textual.message import Message

from opencode_tui_core.events import Event


@dataclass
class EventsReceived(Message, bubble=False):
    """A batch of events, in order, from a live episode or from a run directory."""

    events: list[Event]
    source: Literal["live", "replay"]


@dataclass
class ReplayLoaded(Message, bubble=False):
    """The replay loader has read the whole ``events.jsonl``."""

    events: int
    seconds: float
    bad_lines: int = 0


@dataclass
class EpisodeFinished(Message):
    """The live episode's ``wait()`` returned (or raised: ``error``)."""

    error: str | None = None


@dataclass
class ShellWanted(Message):
    """The user asked for a shell in the sandbox (``sandbox``: its id, when known)."""

    sandbox: str | None = None


@dataclass
class CancelWanted(Message):
    """The user asked to cancel the live episode (the app asks for confirmation)."""


@dataclass
class KeepToggleWanted(Message):
    """The user asked to toggle keeping the sandbox after the run."""


@dataclass
class RerunWanted(Message):
    """The user asked to run the ended live run's task again (``r``), in this app."""


@dataclass
class CancelRequested(Message):
    """The user confirmed cancelling the live episode (``reason``: "cancel" or "quit")."""

    reason: str


@dataclass
class KeepSandboxChanged(Message):
    keep: bool


@dataclass
class ShellStateChanged(Message):
    state: Literal["opening", "open", "closed", "unavailable", "failed"]
    detail: str = ""


@dataclass
class Copied(Message):
    """Text sent to the clipboard (OSC 52); ``what`` names the source."""

    what: str
    text: str
