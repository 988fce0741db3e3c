"""The model-call table's status column and filter: a 2xx that was no answer is a failed call (issue 32)."""

from __future__ import annotations

from opencode_tui.widgets.model_calls import call_matches, status_word
from opencode_tui_core.events import ModelCall
from opencode_tui_core.failures.evidence import utcnow


def _call(status: int | None, error: str | None = None, fault: str | None = None) -> ModelCall:
    return ModelCall(
        call_id="mc-1",
        method="POST",
        path="/v1/chat/completions",
        status=status,
        started_at=utcnow(),
        latency_s=0.2,
        error=error,
        answer_fault=fault,
    )


def test_an_empty_200_shows_as_failed_and_filters_as_an_error() -> None:
    empty = _call(200, "no answer: HTTP 200 with an empty body", "empty_body")
    assert status_word(empty) == "200 failed" and empty.failed
    assert call_matches(empty, "status:error") and not call_matches(empty, "status:ok")
    assert call_matches(empty, "status:2xx")  # still what the server said
    assert call_matches(empty, "empty")  # the error's words


def test_good_pending_and_http_errors_keep_their_words() -> None:
    assert status_word(_call(200)) == "200" and call_matches(_call(200), "status:ok")
    assert status_word(_call(None)) == "pending" and call_matches(_call(None), "status:pending")
    assert status_word(_call(500)) == "500" and call_matches(_call(500), "status:error")
    lost = _call(None, "upstream request failed: ConnectError")
    assert status_word(lost) == "error" and call_matches(lost, "status:error")
