"""core/calls/progress.py: which model calls are empty answers, and when their count ends the episode."""

from __future__ import annotations

from opencode_tui_core.calls.progress import EMPTY_RESPONSE_KIND, ProgressWatch, empty_answer
from opencode_tui_core.events import ModelCall
from opencode_tui_core.failures import FailureClass, FailureStage, decide
from opencode_tui_core.failures.evidence import utcnow


def call(
    n: int, *, status: int | None = 200, fault: str | None = None, produced: bool | None = None, kind="agent"
):
    return ModelCall(
        call_id=f"mc-{n}",
        method="POST",
        path="/v1/chat/completions",
        status=status,
        started_at=utcnow(),
        latency_s=0.2,
        kind=kind,
        answer_fault=fault,
        error=f"no answer: HTTP {status} with an empty body" if fault else None,
        produced=produced if produced is not None else (False if fault else None),
    )


def test_what_counts_as_an_empty_answer() -> None:
    assert empty_answer(call(1, fault="empty_body"))
    assert empty_answer(call(2, produced=False))  # a complete answer with nothing in it
    assert not empty_answer(call(3, produced=True))
    assert not empty_answer(call(4, status=429))  # an HTTP error has its own kind
    assert not empty_answer(call(5, status=None))
    assert not empty_answer(call(6))  # not a chat answer: unknown, not empty


def test_consecutive_limit_fires_once_with_the_calls_as_evidence() -> None:
    watch = ProgressWatch(consecutive=3, total=0)
    assert watch.observe(call(1, produced=True, kind="title")) is None
    assert watch.observe(call(2, fault="empty_body")) is None
    assert watch.observe(call(3, status=429)) is None  # neither counts nor breaks the run
    assert watch.observe(call(4, fault="empty_body")) is None
    found = watch.observe(call(5, fault="empty_body"))
    assert found is not None and found.limit == "consecutive" and found.calls_seen == 5
    assert found.call_ids == ["mc-2", "mc-4", "mc-5"]
    assert watch.observe(call(6, fault="empty_body")) is None  # once
    failure = found.to_failure()
    assert failure.kind == EMPTY_RESPONSE_KIND and failure.stage is FailureStage.AGENT
    assert failure.evidence[0].data["call_ids"] == ["mc-2", "mc-4", "mc-5"]
    assert "empty body" in failure.message and "after 5 calls" in failure.message
    decision = decide(failure)  # the endpoint is broken: never a reward-0 sample
    assert (
        decision.failure_class is FailureClass.EVALUATION and decision.action.value == "mark_evaluation_error"
    )


def test_a_good_answer_breaks_the_run_but_the_total_still_counts() -> None:
    watch = ProgressWatch(consecutive=3, total=4)
    seq = [call(1, fault="empty_body"), call(2, fault="empty_body"), call(3, produced=True, kind="title")]
    seq += [call(4, fault="no_choices"), call(5, produced=True), call(6, produced=False)]
    assert all(watch.observe(c) is None for c in seq[:-1])
    found = watch.observe(seq[-1])
    assert found is not None and found.limit == "total" and found.count == 4


def test_limits_of_zero_are_off() -> None:
    watch = ProgressWatch(consecutive=0, total=0)
    assert all(watch.observe(call(n, fault="empty_body")) is None for n in range(100))


def test_many_calls_are_cited_by_their_first_and_last_ids() -> None:
    watch = ProgressWatch(consecutive=0, total=50)
    found = None
    for n in range(50):
        found = watch.observe(call(n, fault="empty_body")) or found
    assert found is not None
    ids = found.to_failure().evidence[0].data["call_ids"]
    assert len(ids) == 20 and ids[0] == "mc-0" and ids[-1] == "mc-49"


def test_empty_title_answers_count_like_agent_ones() -> None:
    """The title path: OpenCode's title call answered with nothing is an empty answer too."""
    watch = ProgressWatch(consecutive=3, total=0)
    assert watch.observe(call(1, fault="empty_body", kind="title")) is None
    assert watch.observe(call(2, fault="empty_body")) is None
    found = watch.observe(call(3, fault="unterminated", kind="title"))
    assert found is not None and found.call_ids == ["mc-1", "mc-2", "mc-3"]
