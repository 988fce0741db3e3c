"""OOM evidence rules are contributed by the provider plug-ins; core holds only its own (cgroup.memory)."""

from __future__ import annotations

import pytest

from opencode_tui_core import provider_registry
from opencode_tui_core.failures import Evidence
from opencode_tui_core.sandbox import oom
from opencode_tui_core.sandbox.docker.oom_rules import SOURCE_STATE
from opencode_tui_core.sandbox.oom import CORE_RULES, SOURCE_CGROUP, OomRule, oom_confirmed, rules


def test_every_declared_source_has_one_rule() -> None:
    """A source a plug-in names in ``capabilities.oom_evidence`` is confirmed by a rule (its own or
    core's), and no two rules claim one source."""
    sources = [r.source for r in rules()]
    assert len(sources) == len(set(sources))
    for plugin in provider_registry.plugins():
        missing = plugin.capabilities.oom_evidence - set(sources)
        assert not missing, f"{plugin.name} declares {missing} without a rule"
        own = {r.source for r in plugin.oom_rules}
        assert own <= plugin.capabilities.oom_evidence, plugin.name
    assert [r.source for r in CORE_RULES] == [SOURCE_CGROUP]


def test_core_consults_the_plugins_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's flag is evidence only because the docker plug-in says so: without its rules,
    the same piece confirms nothing; a new kind counts once a plug-in contributes a rule for it."""
    flag = Evidence(source=SOURCE_STATE, scope="c1", data={"OOMKilled": True})
    assert oom_confirmed([flag]) is flag
    docker = provider_registry.get("docker")
    monkeypatch.setattr(docker, "oom_rules", ())
    assert oom_confirmed([flag]) is None

    novel = Evidence(source="docker.novel", scope="c1", data={"killed": True})
    assert oom_confirmed([novel]) is None
    monkeypatch.setattr(docker, "oom_rules", (OomRule("docker.novel", lambda ev: ev.data["killed"] is True),))
    assert oom_confirmed([novel]) is novel


def test_cgroup_rule_needs_a_rise_over_a_known_baseline() -> None:
    rise = Evidence(
        source=SOURCE_CGROUP, scope="/sys/fs/cgroup/x", data={"oom_kill": 2, "oom_kill_baseline": 1}
    )
    flat = Evidence(
        source=SOURCE_CGROUP, scope="/sys/fs/cgroup/x", data={"oom_kill": 1, "oom_kill_baseline": 1}
    )
    unknown = Evidence(source=SOURCE_CGROUP, scope="/sys/fs/cgroup/x", data={"oom_kill": 3})
    assert oom.oom_evidence([flat, unknown, rise]) == [rise]
