"""The Docker provider's OOM evidence and how each kind confirms a kill (contributed through its plug-in).

- ``docker.state``: the engine's ``State.OOMKilled`` for the container is true (and, for a borrowed
  container, was not already true when we connected). Docker 20.10+ sets the flag when the
  container stops after *any* OOM kill in its cgroup during its life, so it also covers an OOM-killed
  exec once the container has stopped.
- ``docker.events``: an ``oom`` event emitted by the engine for this container id.
- ``cgroup.memory`` (core's rule, ``opencode_tui_core.sandbox.oom``): the container cgroup's ``oom_kill`` counter
  rose above the baseline recorded when the sandbox was created (or connected).

Cheap to import: the plug-in module imports it.
"""

from __future__ import annotations

from opencode_tui_core.failures import Evidence
from opencode_tui_core.sandbox.oom import OomRule

SOURCE_STATE = "docker.state"
SOURCE_EVENTS = "docker.events"


def _state_says_oom(ev: Evidence) -> bool:
    return ev.data.get("OOMKilled") is True and ev.data.get("OOMKilledAtConnect") is not True


def _event_says_oom(ev: Evidence) -> bool:
    return ev.data.get("action") == "oom" and ev.data.get("container_id") == ev.scope


RULES = (OomRule(SOURCE_STATE, _state_says_oom), OomRule(SOURCE_EVENTS, _event_says_oom))
