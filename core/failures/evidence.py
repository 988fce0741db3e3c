"""Evidence: an observation that supports (or fails to support) a failure diagnosis."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def utcnow() -> datetime:
    return datetime.now(UTC)


class Evidence(BaseModel):
    """One observation, with where it came from and when it was made.

    ``source`` names the authority (e.g. ``docker.state``, ``docker.events``, ``cgroup.memory``,
    ``opensandbox.lifecycle``); ``scope`` names what it is about (a container id, a cgroup path), so
    a report about another container can never be mistaken for evidence about this one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    observed_at: datetime = Field(default_factory=utcnow)
    scope: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
