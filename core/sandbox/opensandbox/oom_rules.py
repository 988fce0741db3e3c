"""OpenSandbox's OOM evidence and how each kind confirms a kill (contributed through its plug-in).

- ``opensandbox.lifecycle``: the server's lifecycle status of this sandbox id is terminal (Failed,
  Terminated) and its machine-readable ``reason`` code is one of the recognised OOM codes, matched
  exactly (``oom_reported``, set by the provider from ``settings.oom_reason_codes``). The status
  ``message`` is free text and is never read for this.
- ``opensandbox.diagnostics`` (**opt-in**, ``settings.oom_from_diagnostics``, default off): the
  server's diagnostic report (``diagnostics/events`` or the deprecated ``diagnostics/inspect``) for
  this sandbox's own container says ``OOMKilled``. Its payload is display text the diagnostics API
  says not to parse, so it counts only when the provider ``admitted`` it (the setting is on); the
  report's subject (container name / id label) must be this sandbox and, for a borrowed sandbox,
  the flag must not already have been set when we connected.

Cheap to import: the plug-in module imports it.
"""

from __future__ import annotations

from opencode_tui_core.failures import Evidence
from opencode_tui_core.sandbox.oom import OomRule

SOURCE_OS_LIFECYCLE = "opensandbox.lifecycle"
SOURCE_OS_DIAGNOSTICS = "opensandbox.diagnostics"


def _lifecycle_says_oom(ev: Evidence) -> bool:
    return ev.data.get("oom_reported") is True and ev.data.get("sandbox_id") == ev.scope


def _diagnostics_says_oom(ev: Evidence) -> bool:
    return (
        ev.data.get("admitted") is True
        and ev.data.get("OOMKilled") is True
        and ev.data.get("subject") == ev.scope
        and ev.data.get("OOMKilledAtConnect") is not True
    )


RULES = (
    OomRule(SOURCE_OS_LIFECYCLE, _lifecycle_says_oom),
    OomRule(SOURCE_OS_DIAGNOSTICS, _diagnostics_says_oom),
)
