"""core/health.py's fold and EventBus.derive, on typed events (the end-to-end triggers are in
test_health.py): windows, resets and the derived events' place in the stream."""

from __future__ import annotations

from datetime import timedelta

from opencode_tui_core.config import HealthThresholds
from opencode_tui_core.events import (
    Compaction,
    EventBus,
    HealthWarning,
    ModelCall,
    Phase,
    PhaseChanged,
    TerminalOutput,
    ToolCall,
)
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.health import HealthMonitor


def _call(n: int, status: int = 200, kind: str = "agent", tokens_in: int | None = 1000, at=None) -> ModelCall:
    at = at or utcnow()
    return ModelCall(
        ts=at,
        call_id=f"mc-{n}",
        method="POST",
        path="/v1/chat/completions",
        status=status,
        started_at=at,
        latency_s=0.1,
        kind=kind,
        tokens_in=tokens_in,
    )


def _tool(n: int, tool: str, status: str = "completed", **inp) -> ToolCall:
    return ToolCall(call_id=f"call-{n}", tool=tool, status=status, input=inp)


def test_derived_events_follow_their_cause_in_the_stream():
    bus = EventBus()
    seen: list = []
    bus.subscribe(seen.append)
    HealthMonitor(HealthThresholds(retry_storm_count=2), context_window=100_000).attach(bus)
    bus.emit(_call(1, status=429))
    bus.emit(_call(2, status=503))
    bus.emit(_call(3))
    assert [type(e).__name__ for e in seen] == ["ModelCall", "ModelCall", "HealthWarning", "ModelCall"]
    assert [e.seq for e in seen] == [1, 2, 3, 4]


def test_a_failing_deriver_is_removed_and_reported():
    bus = EventBus()
    seen: list = []
    bus.subscribe(seen.append)

    def broken(_event):
        raise RuntimeError("boom")

    bus.derive(broken)
    bus.emit(PhaseChanged(phase=Phase.AGENT))
    bus.emit(PhaseChanged(phase=Phase.CLOSING))
    warnings = [e for e in seen if type(e).__name__ == "Warning_"]
    assert len(warnings) == 1 and "boom" in warnings[0].message
    assert len(seen) == 3


def test_storm_windows_expire():
    m = HealthMonitor(HealthThresholds(retry_storm_count=3, retry_storm_window_s=10), context_window=1000)
    t0 = utcnow()
    assert m.observe(_call(1, 429, at=t0)) == []
    assert m.observe(_call(2, 429, at=t0 + timedelta(seconds=5))) == []
    assert m.observe(_call(3, 429, at=t0 + timedelta(seconds=12))) == []  # the first fell out
    (w,) = m.observe(_call(4, 500, at=t0 + timedelta(seconds=14)))
    assert w.kind == "retry_storm" and w.data["calls"] == 3
    assert m.summary() == {"retry_storm": 1}


def test_near_limit_only_on_the_first_agent_call_after_a_compaction():
    m = HealthMonitor(HealthThresholds(), context_window=200_000)
    assert m.observe(_call(1, tokens_in=190_000)) == []  # near the limit, but no compaction yet
    assert m.observe(Compaction(count=1)) == []
    assert m.observe(_call(2, kind="title", tokens_in=190_000)) == []  # not the agent
    (w,) = m.observe(_call(3, tokens_in=170_000))
    assert w.data["reason"] == "near_limit_after_compaction" and w.data["tokens_in"] == 170_000
    assert m.observe(_call(4, tokens_in=190_000)) == []  # only the first call after it
    assert m.observe(Compaction(count=2)) == []
    assert m.observe(_call(5, tokens_in=20_000)) == []  # compaction freed the context


def test_an_edit_resets_the_reads():
    m = HealthMonitor(HealthThresholds(reads_without_edits=3), context_window=1000)
    out = []
    for n, tool in enumerate(["read", "grep", "edit", "read", "glob"]):
        out += m.observe(_tool(n, tool, path=f"f{n}"))
    assert out == []
    (w,) = m.observe(_tool(9, "list", path="."))
    assert w.kind == "reads_without_edits" and w.data == {"reads": 3}
    # each call counts once, at its first event
    assert m.observe(_tool(9, "list", path=".")) == []


def test_silence_is_measured_from_the_last_output():
    m = HealthMonitor(HealthThresholds(command_silent_s=10), context_window=1000)
    t0 = utcnow()
    m.observe(PhaseChanged(phase=Phase.AGENT))
    m.observe(ToolCall(ts=t0, call_id="c1", tool="bash", status="running", input={"command": "make"}))
    m.observe(TerminalOutput(ts=t0 + timedelta(seconds=8), stream="display", data="cc -c x.c\n"))
    assert m.silent_commands(now=t0 + timedelta(seconds=15)) == []
    (w,) = m.silent_commands(now=t0 + timedelta(seconds=19))
    assert w.data["command"] == "make" and w.data["silent_s"] == 11
    assert m.silent_commands(now=t0 + timedelta(seconds=60)) == []  # once per command
    assert m.summary() == {"command_silent": 1}


def test_a_finished_command_is_never_silent():
    m = HealthMonitor(HealthThresholds(command_silent_s=1), context_window=1000)
    t0 = utcnow()
    m.observe(PhaseChanged(phase=Phase.AGENT))
    m.observe(ToolCall(ts=t0, call_id="c1", tool="bash", status="running", input={"command": "true"}))
    m.observe(ToolCall(ts=t0, call_id="c1", tool="bash", status="completed", input={"command": "true"}))
    assert m.silent_commands(now=t0 + timedelta(seconds=30)) == []


def test_disabled_means_no_warning():
    m = HealthMonitor(HealthThresholds(enabled=False, repeated_tool_call=2), context_window=1000)
    assert m.observe(_tool(1, "bash", command="ls")) == []
    assert m.observe(_tool(2, "bash", command="ls")) == []
    assert not any(isinstance(w, HealthWarning) for w in m.silent_commands())


def test_empty_answers_warn_once_per_run_before_the_limit():
    """``empty_answers`` (issue 32): answers in a row with nothing in them; a good one starts over."""
    mon = HealthMonitor(HealthThresholds(empty_answers=3), context_window=100_000)

    def empty(n: int) -> ModelCall:
        return _call(n).model_copy(
            update={
                "answer_fault": "empty_body",
                "error": "no answer: HTTP 200 with an empty body",
                "produced": False,
            }
        )

    out = [w for n in range(1, 6) for w in mon.observe(empty(n))]
    assert [w.kind.value for w in out] == ["empty_answers"]
    assert (
        out[0].data["call_ids"] == ["mc-1", "mc-2", "mc-3"] and "3 model answers in a row" in out[0].message
    )
    assert mon.observe(_call(6).model_copy(update={"produced": True})) == []
    again = [w for n in range(7, 10) for w in mon.observe(empty(n))]
    assert len(again) == 1 and again[0].data["calls"] == 3
