"""Is an OOM kill confirmed? Only current, authoritative, *structured* evidence about *this*
container counts: flags, counters and reason codes. Text never does.

Authoritative pieces, in order of preference:

- ``docker.state``: the engine's ``State.OOMKilled`` for the container is true (and, for a borrowed
  container, was not already true when we connected). Docker 20.10+ sets the flag when the
  container stops after *any* OOM kill in its cgroup during its life, so it also covers an OOM-killed
  exec once the container has stopped.
- ``docker.events``: an ``oom`` event emitted by the engine for this container id.
- ``cgroup.memory``: the container cgroup's ``oom_kill`` counter rose above the baseline recorded
  when the sandbox was created (or connected).
- ``opensandbox.lifecycle``: the OpenSandbox server's lifecycle status of this sandbox id is
  terminal (Failed, Terminated) and its machine-readable ``reason`` code is one of the recognised
  OOM codes, matched exactly (``oom_reported``, set by the provider from
  ``settings.oom_reason_codes``). The status ``message`` is free text and is never read for this.
- ``opensandbox.diagnostics`` (**opt-in**, ``settings.oom_from_diagnostics``, default off): the
  server's diagnostic report (``diagnostics/events`` or the deprecated ``diagnostics/inspect``) for
  this sandbox's own container says ``OOMKilled``. Its payload is display text the diagnostics API
  says not to parse, so it counts only when the provider ``admitted`` it (the setting is on); the
  report's subject (container name / id label) must be this sandbox and, for a borrowed sandbox,
  the flag must not already have been set when we connected.

Never evidence: exit code 137 (any SIGKILL gives it), output or message text such as "Killed",
"out of memory" or ``npm ERR! JavaScript heap out of memory`` (a program's own words, wherever they
appear: output, a lifecycle message), a report about another container (a sidecar, a sibling
sandbox), or an unscoped report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from core.failures import Evidence

SOURCE_STATE = "docker.state"
SOURCE_EVENTS = "docker.events"
SOURCE_CGROUP = "cgroup.memory"
SOURCE_OS_LIFECYCLE = "opensandbox.lifecycle"
SOURCE_OS_DIAGNOSTICS = "opensandbox.diagnostics"


def _state_says_oom(ev: Evidence) -> bool:
    return ev.data.get("OOMKilled") is True and ev.data.get("OOMKilledAtConnect") is not True


def _event_says_oom(ev: Evidence) -> bool:
    return ev.data.get("action") == "oom" and ev.data.get("container_id") == ev.scope


def _cgroup_says_oom(ev: Evidence) -> bool:
    count = ev.data.get("oom_kill")
    baseline = ev.data.get("oom_kill_baseline")
    if not isinstance(count, int) or not isinstance(baseline, int):
        return False  # unknown baseline: a rise cannot be shown
    return count > baseline


def _os_lifecycle_says_oom(ev: Evidence) -> bool:
    return ev.data.get("oom_reported") is True and ev.data.get("sandbox_id") == ev.scope


def _os_diagnostics_says_oom(ev: Evidence) -> bool:
    return (
        ev.data.get("admitted") is True
        and ev.data.get("OOMKilled") is True
        and ev.data.get("subject") == ev.scope
        and ev.data.get("OOMKilledAtConnect") is not True
    )


_RULES: tuple[tuple[str, Callable[[Evidence], bool]], ...] = (
    (SOURCE_STATE, _state_says_oom),
    (SOURCE_EVENTS, _event_says_oom),
    (SOURCE_CGROUP, _cgroup_says_oom),
    (SOURCE_OS_LIFECYCLE, _os_lifecycle_says_oom),
    (SOURCE_OS_DIAGNOSTICS, _os_diagnostics_says_oom),
)


def oom_confirmed(evidence: Iterable[Evidence], *, scope: str | None = None) -> Evidence | None:
    """The authoritative piece confirming an OOM kill, or ``None``.

    Only scoped evidence is considered; with ``scope`` given (a container id), only evidence about
    exactly that container. Pieces from any other source (exit codes, output, sidecars) are ignored.
    """
    pieces = [ev for ev in evidence if ev.scope and (scope is None or ev.scope == scope)]
    for source, says_oom in _RULES:
        for ev in pieces:
            if ev.source == source and says_oom(ev):
                return ev
    return None


def oom_evidence(evidence: Iterable[Evidence], *, scope: str | None = None) -> list[Evidence]:
    """Every authoritative piece that confirms an OOM kill (same rules as ``oom_confirmed``)."""
    pieces = [ev for ev in evidence if ev.scope and (scope is None or ev.scope == scope)]
    return [ev for source, says_oom in _RULES for ev in pieces if ev.source == source and says_oom(ev)]
