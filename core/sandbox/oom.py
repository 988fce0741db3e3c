"""Is an OOM kill confirmed? Only current, authoritative, *structured* evidence about *this*
sandbox counts: flags, counters and reason codes. Text never does.

The rules are contributed, not listed here. Each evidence *source* (a string such as
``docker.state``) has one ``OomRule``: a predicate saying whether a piece from that source confirms
an OOM kill. Core owns the rule of the one source it produces itself, ``cgroup.memory`` (a cgroup's
``oom_kill`` counter rose above its baseline: read by ``opencode_tui_core.sandbox.cgroup``, used by the docker and
local providers and by the live fault watch). Every other rule comes from the provider plug-in that
produces the evidence (``ProviderPlugin.oom_rules``): the docker plug-in's rules are in
``opencode_tui_core.sandbox.docker.oom_rules``, OpenSandbox's in ``opencode_tui_core.sandbox.opensandbox.oom_rules``.
docs/providers.md says how a new provider adds its own kind.

Rules are tried plug-in by plug-in (in name order, each in the order it lists them), core's last;
the first confirming piece wins (``oom_confirmed``).

Never evidence, whatever the provider: exit code 137 (any SIGKILL gives it), output or message text
such as "Killed", "out of memory" or ``npm ERR! JavaScript heap out of memory`` (a program's own
words, wherever they appear), a report about another container (a sidecar, a sibling sandbox), or an
unscoped report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opencode_tui_core import provider_registry
from opencode_tui_core.failures import Evidence

SOURCE_CGROUP = "cgroup.memory"


@dataclass(frozen=True)
class OomRule:
    """How a piece of evidence from ``source`` confirms an OOM kill (``confirms`` sees only pieces
    from that source whose scope is set and, when the caller names one, equal to its scope)."""

    source: str
    confirms: Callable[[Evidence], bool]


def _cgroup_says_oom(ev: Evidence) -> bool:
    count = ev.data.get("oom_kill")
    baseline = ev.data.get("oom_kill_baseline")
    if not isinstance(count, int) or not isinstance(baseline, int):
        return False  # unknown baseline: a rise cannot be shown
    return count > baseline


# The rules of the evidence core itself produces (opencode_tui_core.sandbox.cgroup, opencode_tui_core.sandbox.faults).
CORE_RULES: tuple[OomRule, ...] = (OomRule(SOURCE_CGROUP, _cgroup_says_oom),)


def rules() -> list[OomRule]:
    """Every rule: each loadable plug-in's, then core's. A plug-in that cannot be loaded adds none
    (the command that names it reports why)."""
    out: list[OomRule] = []
    for name in provider_registry.names():
        try:
            plugin = provider_registry.get(name)
        except provider_registry.PluginLoadError:
            continue
        out.extend(plugin.oom_rules)
    out.extend(CORE_RULES)
    return out


def oom_confirmed(evidence: Iterable[Evidence], *, scope: str | None = None) -> Evidence | None:
    """The authoritative piece confirming an OOM kill, or ``None``.

    Only scoped evidence is considered; with ``scope`` given (a container id), only evidence about
    exactly that container. Pieces from a source no rule covers (exit codes, output) are ignored.
    """
    found = oom_evidence(evidence, scope=scope)
    return found[0] if found else None


def oom_evidence(evidence: Iterable[Evidence], *, scope: str | None = None) -> list[Evidence]:
    """Every authoritative piece that confirms an OOM kill, in rule order (see ``oom_confirmed``)."""
    pieces = [ev for ev in evidence if ev.scope and (scope is None or ev.scope == scope)]
    return [ev for rule in rules() for ev in pieces if ev.source == rule.source and rule.confirms(ev)]
