"""What the token capture asks of a request and reads from an answer (core/calls/token_capture.py), on
objects shaped as vLLM's OpenAI server sends them."""

from __future__ import annotations

from opencode_tui_core.calls.token_capture import (
    CAPTURE_PARAMS,
    CapturedTokens,
    TokenAccumulator,
    TokenCaptureSummary,
    scan_json_body,
    with_capture_params,
)


def test_only_the_parameters_the_client_left_unset_are_added() -> None:
    body = {"model": "m", "messages": [], "top_logprobs": 5}
    asked, added = with_capture_params(body)
    assert added == ["logprobs", "return_tokens_as_token_ids", "return_token_ids"]
    assert asked == {**body, "logprobs": True, "return_tokens_as_token_ids": True, "return_token_ids": True}
    assert body == {"model": "m", "messages": [], "top_logprobs": 5}  # the client's body is not changed
    full = {**CAPTURE_PARAMS, "model": "m"}
    assert with_capture_params(full) == (full, [])


def test_a_stream_is_gathered_chunk_by_chunk_from_the_first_choice() -> None:
    acc = TokenAccumulator()
    acc.feed({"prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    entry = {"token": "token_id:7", "logprob": -0.5, "top_logprobs": []}
    acc.feed({"choices": [{"index": 0, "token_ids": [7], "logprobs": {"content": [entry]}}]})
    acc.feed({"choices": [{"index": 1, "token_ids": [99], "logprobs": {"content": [entry]}}]})  # not ours
    acc.feed({"prompt_token_ids": [4], "choices": [{"index": 0, "token_ids": [8, 9]}]})
    acc.feed({"choices": [], "usage": {"prompt_tokens": 3}})
    assert acc.prompt_token_ids == [1, 2, 3]  # the first chunk's
    assert acc.completion_ids() == [7, 8, 9] and acc.logprobs == [-0.5]


def test_ids_from_logprob_tokens_only_when_no_token_ids_came() -> None:
    acc = TokenAccumulator()
    entries = [{"token": "token_id:11", "logprob": -1}, {"token": "token_id:12", "logprob": 0}]
    acc.feed({"choices": [{"logprobs": {"content": entries}}]})
    assert acc.completion_ids() == [11, 12] and acc.logprobs == [-1.0, 0.0]
    text = TokenAccumulator()  # tokens given as text (no return_tokens_as_token_ids): no ids
    as_text = [{"token": "Hi", "logprob": -0.1}, {"token": "token_id:\u00b2", "logprob": -0.2}]
    text.feed({"choices": [{"logprobs": {"content": as_text}}]})
    assert text.completion_ids() is None and text.logprobs == [-0.1, -0.2]


def test_nothing_found_is_none_never_made_up() -> None:
    acc = TokenAccumulator()
    acc.feed({"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]})
    acc.feed({"prompt_token_ids": "1,2", "choices": [{"token_ids": [1, True], "logprobs": None}]})
    assert not acc.found()
    assert (acc.prompt_token_ids, acc.completion_ids(), acc.logprobs) == (None, None, None)


def test_a_json_answer() -> None:
    acc = TokenAccumulator()
    scan_json_body(
        b'{"prompt_token_ids":[5,6],"choices":[{"index":0,"token_ids":[1],'
        b'"logprobs":{"content":[{"token":"token_id:1","logprob":-2.5}]}}]}',
        acc,
    )
    assert (acc.prompt_token_ids, acc.completion_ids(), acc.logprobs) == ([5, 6], [1], [-2.5])
    scan_json_body(b"not json", acc)  # ignored
    assert acc.found()


def test_the_summary_counts_what_was_recorded() -> None:
    summary = TokenCaptureSummary(file="tokens.jsonl")
    summary.add(None)
    summary.add(
        CapturedTokens(call_id="c1", prompt_token_ids=[1, 2], completion_token_ids=[3], logprobs=[-1.0])
    )
    assert summary.model_dump() == {
        "file": "tokens.jsonl",
        "calls": 2,
        "calls_with_tokens": 1,
        "prompt_token_ids": 2,
        "completion_token_ids": 1,
        "logprobs": 1,
    }


def test_tokens_of_a_message_are_complete_and_unedited() -> None:
    base = CapturedTokens(call_id="c", message_id="msg_1", complete=True)
    assert base.of_message
    assert not base.model_copy(update={"complete": False}).of_message
    assert not base.model_copy(update={"edited_by": "tui"}).of_message
    assert not base.model_copy(update={"message_id": None}).of_message
