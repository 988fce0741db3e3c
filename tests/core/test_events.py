"""Event stream: every event type round-trips through JSONL unchanged; the bus stamps seq."""

from datetime import UTC, datetime

from opencode_tui_core.events import (
    CleanupObserved,
    CleanupStep,
    Compaction,
    EpisodeStarted,
    EventBus,
    FailureRecorded,
    FailureRecovered,
    InstallProgress,
    ModelCall,
    OpenCodeEvent,
    OutcomeDecided,
    Phase,
    PhaseChanged,
    SandboxReady,
    StepState,
    TerminalOutput,
    ToolCall,
    TranscriptStats,
    VerificationFinished,
    Warning_,
    decode,
    encode,
)
from opencode_tui_core.failures import (
    Action,
    CommandDetails,
    Evidence,
    FailureCause,
    FailureEvent,
    FailureStage,
    OomDetails,
    decide,
)
from opencode_tui_core.sandbox.base import Recovery


def _failure():
    try:
        try:
            raise OSError("connection reset")
        except OSError as inner:
            raise RuntimeError("exec failed") from inner
    except RuntimeError as exc:
        return FailureEvent.from_exception(
            exc,
            kind="provider_oom_killed",
            stage=FailureStage.AGENT,
            operation="exec opencode",
            evidence=[
                Evidence(source="docker.state", scope="abc", data={"OOMKilled": True, "ExitCode": 137})
            ],
            details=OomDetails(container_id="abc", memory_limit_bytes=64 << 20, exit_code=137),
        )


def all_events():
    now = datetime.now(UTC)
    f = _failure()
    return [
        EpisodeStarted(
            run_id="r",
            task_id="t",
            provider="docker",
            opencode_version="1.18.32",
            run_budget_s=10.0,
            close_budget_s=60.0,
            model="scripted",
        ),
        PhaseChanged(phase=Phase.AGENT, state=StepState.RUNNING, detail="x"),
        SandboxReady(sandbox_id="s", provider="docker", owned=True, network="model-only", notes=["n"]),
        InstallProgress(package="opencode-linux-x64", bytes_done=10, bytes_total=100),
        Warning_(code="ripgrep_missing", message="no rg"),
        TerminalOutput(stream="stdout", data="\x1b[31mred\x1b[0m ünïcode\n"),
        OpenCodeEvent(
            event_type="tool_use", payload={"part": {"tool": "bash", "state": {"status": "completed"}}}
        ),
        ModelCall(
            call_id="c1",
            method="POST",
            path="/v1/chat/completions",
            status=200,
            started_at=now,
            latency_s=0.5,
            ttft_s=0.1,
            kind="agent",
            message_id="msg_1",
            tokens_in=None,
            tokens_out=5,
        ),
        ToolCall(call_id="t1", tool="bash", status="completed", input={"command": "ls"}, output="a\n"),
        Compaction(count=2, trigger="auto"),
        CleanupObserved(step=CleanupStep.RECEIPT, state=StepState.OK, data={"return_code": 0}),
        FailureRecorded(failure=f, decision=decide(f)),
        FailureRecorded(
            failure=FailureEvent(
                kind="command_delivery_uncertain",
                stage="agent",
                operation="exec",
                message="m",
                details=CommandDetails(execution_id="e"),
            ),
            decision=decide(FailureEvent(kind="x_y", stage="agent", operation="o", message="m")),
        ),
        FailureRecovered(
            failure=FailureEvent(
                kind="command_stream_lost",
                stage="agent",
                operation="exec.stream",
                message="stream broke; following the execution id",
                details=CommandDetails(execution_id="e", delivery="delivered", submissions=1),
            ),
            recovery=Recovery.FOLLOWED_EXECUTION_ID,
        ),
        VerificationFinished(exit_code=0, reward=1.0, passed=True, duration_s=1.5, output_excerpt="ok"),
        TranscriptStats(messages=4, tool_calls={"bash": 2}, compactions=1, tokens_in=None),
        OutcomeDecided(
            action=Action.COUNT_AS_ZERO,
            reward=0.0,
            failure_kind="provider_oom_killed",
            failure_class="model",
            summary="OOM",
        ),
    ]


def test_every_event_round_trips_losslessly():
    events = all_events()
    assert {e.type for e in events} >= {
        "phase",
        "terminal",
        "opencode",
        "model_call",
        "tool_call",
        "compaction",
        "cleanup",
        "failure",
        "failure_recovered",
        "verification",
        "outcome",
    }
    for e in events:
        line = encode(e)
        assert "\n" not in line
        back = decode(line)
        assert back == e
        assert type(back) is type(e)


def test_cause_chain_preserved():
    f = _failure()
    chain = f.cause.chain()
    assert [c.type for c in chain] == ["RuntimeError", "OSError"]
    assert isinstance(chain[1], FailureCause)


def test_bus_stamps_monotonic_seq_and_survives_broken_subscriber():
    bus = EventBus(attempt=2)
    seen = []

    def broken(_):
        raise RuntimeError("consumer bug")

    bus.subscribe(broken)
    bus.subscribe(seen.append)
    for e in all_events():
        bus.emit(e)
    # The broken consumer is dropped, and that is said as an event of its own (never silent).
    assert [e.seq for e in seen] == list(range(1, len(all_events()) + 2))
    assert all(e.attempt == 2 for e in seen)
    assert len(bus.errors) == 1
    warning = seen[1]
    assert warning.type == "warning" and warning.code == "event_consumer_failed"
    assert "consumer bug" in warning.message
