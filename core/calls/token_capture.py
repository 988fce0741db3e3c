"""Token capture for RL (``model.capture_tokens``, off by default): the token ids and logprobs of each
model call, as vLLM's OpenAI-compatible server returns them, recorded in ``tokens.jsonl``.

What is asked of the upstream (each only when the client's request does not set it already):

- ``logprobs: true`` and ``top_logprobs: 0``: a logprob per generated token, no alternatives;
- ``return_tokens_as_token_ids: true``: each logprob entry's ``token`` is ``"token_id:<id>"``, so
  the ids are known even from a vLLM too old for the next one;
- ``return_token_ids: true`` (vLLM ≥ 0.10.2): the response (or a stream's first chunk) carries the
  prompt's ids as a top-level ``prompt_token_ids``, and each choice (or each chunk's choice) its new
  ids as ``token_ids``.

What is read back: the first choice only (OpenCode asks for one). A field the upstream did not send
stays ``None`` (an upstream that ignores these parameters yields no token data, and no line is
written for its calls): nothing is ever derived from text or filled in.
"""

from __future__ import annotations

import json
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.calls.classify import CallKind

# What the proxy adds to a chat-completions request when the capture is on, in this order.
CAPTURE_PARAMS: Final[dict[str, Any]] = {
    "logprobs": True,
    "top_logprobs": 0,
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
}
_TOKEN_ID_PREFIX = "token_id:"


def with_capture_params(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The request body with the capture's parameters the client left unset, and their names.

    A parameter the client set (even to ``false``) is the client's choice and stays as it is."""
    added = [name for name in CAPTURE_PARAMS if name not in body]
    if not added:
        return body, []
    return {**body, **{name: CAPTURE_PARAMS[name] for name in added}}, added


def _ids(value: Any) -> list[int] | None:
    """A list of token ids as the server sent it, or None when it is not one."""
    if not isinstance(value, list):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return None
    return list(value)


def _logprob_entries(choice: dict[str, Any]) -> list[dict[str, Any]]:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return [e for e in content if isinstance(e, dict)] if isinstance(content, list) else []


def _id_of_token(token: Any) -> int | None:
    """``"token_id:123"`` (``return_tokens_as_token_ids``) → 123; any other token text → None."""
    if isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX):
        digits = token[len(_TOKEN_ID_PREFIX) :]
        if digits.isascii() and digits.isdigit():  # isdigit alone takes "²", which int() refuses
            return int(digits)
    return None


class TokenAccumulator:
    """The token data of one call, gathered from its stream's events (or its one JSON body) in order."""

    def __init__(self) -> None:
        self.prompt_token_ids: list[int] | None = None
        self.completion_token_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        # The ids named by the logprob entries' tokens: the completion's ids when ``token_ids`` is absent.
        self._logprob_ids: list[int] | None = None

    def feed(self, obj: dict[str, Any]) -> None:
        """One chat-completions object: a stream chunk or a whole response."""
        prompt = _ids(obj.get("prompt_token_ids"))
        if prompt is not None and self.prompt_token_ids is None:
            self.prompt_token_ids = prompt
        for choice in obj.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        # Extended in place: a long answer streams one token per chunk.
        ids = _ids(choice.get("token_ids"))
        if ids is not None:
            if self.completion_token_ids is None:
                self.completion_token_ids = []
            self.completion_token_ids.extend(ids)
        for entry in _logprob_entries(choice):
            logprob = entry.get("logprob")
            if isinstance(logprob, int | float) and not isinstance(logprob, bool):
                if self.logprobs is None:
                    self.logprobs = []
                self.logprobs.append(float(logprob))
            token_id = _id_of_token(entry.get("token"))
            if token_id is not None:
                if self._logprob_ids is None:
                    self._logprob_ids = []
                self._logprob_ids.append(token_id)

    def completion_ids(self) -> list[int] | None:
        """The generated ids: the choices' ``token_ids``, else the ids the logprob entries named."""
        return self.completion_token_ids if self.completion_token_ids is not None else self._logprob_ids

    def found(self) -> bool:
        return any(v is not None for v in (self.prompt_token_ids, self.completion_ids(), self.logprobs))


def scan_json_body(data: bytes, tokens: TokenAccumulator) -> None:
    """A whole (non-streamed) JSON response, fed to ``tokens`` when it is a JSON object."""
    try:
        body = json.loads(data)
    except ValueError:
        return
    if isinstance(body, dict):
        tokens.feed(body)


class CapturedTokens(BaseModel):
    """One model call's token data: a line of ``tokens.jsonl``, attributed like its call record in
    ``model_calls.jsonl`` (``call_id``; ``message_id``, the assistant message the call answered)."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    message_id: str | None = None
    session_id: str | None = None
    kind: CallKind = "other"
    model: str | None = None
    status: int | None = None
    finish_reason: str | None = None
    # The call did not fail: its answer reached OpenCode whole. A broken stream's ids are a part only.
    complete: bool = False
    # A person replaced the model's reply before OpenCode saw it (the debugger): these tokens are the
    # model's, not the message's.
    edited_by: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None

    @property
    def of_message(self) -> bool:
        """These are the tokens of the assistant message OpenCode kept (complete and unedited)."""
        return self.message_id is not None and self.complete and self.edited_by is None


class TokenCaptureSummary(BaseModel):
    """run.json's ``token_capture``: where the tokens are and how many were captured."""

    model_config = ConfigDict(extra="forbid")

    file: str
    calls: int = 0  # chat-completions calls the capture asked tokens of
    calls_with_tokens: int = 0  # of those, the calls the upstream answered with token data
    prompt_token_ids: int = 0  # ids recorded, summed over the calls
    completion_token_ids: int = 0
    logprobs: int = 0

    def add(self, line: CapturedTokens | None) -> None:
        """Count one call the capture asked tokens of (``line`` None: the upstream sent none)."""
        self.calls += 1
        if line is None:
            return
        self.calls_with_tokens += 1
        self.prompt_token_ids += len(line.prompt_token_ids or [])
        self.completion_token_ids += len(line.completion_token_ids or [])
        self.logprobs += len(line.logprobs or [])
