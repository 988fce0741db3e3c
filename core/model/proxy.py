"""The recording proxy: a transparent, streaming HTTP/1.1 proxy between OpenCode and the upstream model.

It listens on 127.0.0.1 (TCP) and/or a Unix socket — the socket is how a sandbox without network reaches
it — and forwards every request to ``upstream_url`` (the scripted model, vLLM, NIM, OpenAI, ...; http or
https). Responses are relayed chunk by chunk as they arrive, so streaming behaviour (stalls included) is
what OpenCode would see without the proxy.

Path mapping: the proxy serves the upstream base URL at ``/v1``: ``/v1/chat/completions`` goes to
``{upstream_url}/chat/completions``; a path without the ``/v1`` prefix is appended to the base as is.

For each call it records a ModelCallRecord (``model_calls.jsonl`` in ``record_dir``) and emits a
``opencode_tui_core.events.ModelCall`` through ``on_call``: status, latency, time to first byte and first token, token
usage parsed from the response (unknown stays None), ``x-session-id``, the attribution plugin's
``X-OpenCode-Assistant-Message-Id`` header, the kind (title/agent/compaction/other) and redacted request
and response bodies.

Token capture (``capture_tokens``, off by default; core/calls/token_capture.py): each chat-completions
request goes upstream with vLLM's token parameters added (those the client did not set), and the token
ids and logprobs that come back are written to ``tokens.jsonl``, one line per call that carried any,
attributed like the call. Off, every request goes upstream byte for byte as the client sent it.

Rules: it never retries; an unreachable upstream is answered with 502 and recorded with ``status=None``
and the error; a stream that breaks upstream is broken towards the client too (never completed or
papered over). The upstream API key is read from the environment variable ``api_key_env`` when the proxy
starts and is only ever put on the upstream request: it is never recorded, logged or written to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import itertools
import json
import logging
import os
import secrets
import socket
import ssl
import threading
import zlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.calls.classify import classify
from opencode_tui_core.calls.records import (
    AnswerFault,
    ModelCallRecord,
    TokenUsage,
    answer_fault_error,
    merge_usage,
    parse_usage,
)
from opencode_tui_core.calls.token_capture import (
    CapturedTokens,
    TokenAccumulator,
    TokenCaptureSummary,
    scan_json_body,
    with_capture_params,
)
from opencode_tui_core.events import ModelCall
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.model._http import (
    HOP_BY_HOP,
    LAST_CHUNK,
    BufferedReader,
    Handler,
    HttpServer,
    HttpService,
    Request,
    chunk_bytes,
    head_bytes,
    send_simple,
)
from opencode_tui_core.model.hold import (
    FORWARD,
    CallGate,
    HandAnswer,
    HeldCall,
    HoldVerdict,
    Release,
    answer_json,
    answer_sse,
    reply_of,
)
from opencode_tui_core.model.replay import Replayer
from opencode_tui_core.redaction import REDACTED, redact, redact_headers, redact_text

log = logging.getLogger(__name__)

MESSAGE_ID_HEADER = "X-OpenCode-Assistant-Message-Id"
SESSION_ID_HEADER = "x-session-id"
# OpenCode 1.18.32 names the session on every call in this header (x-session-id only with some
# provider packages): the session id comes from whichever is present.
OPENCODE_SESSION_HEADER = "x-opencode-session"
DEFAULT_MAX_RECORD_BYTES = 2 * 1024 * 1024
_AUTH_HEADERS = frozenset({"authorization", "x-api-key", "api-key"})
_DROP_REQUEST_HEADERS = HOP_BY_HOP | {
    "host",
    "content-length",
    "accept-encoding",
    "expect",
    MESSAGE_ID_HEADER.lower(),
}
_DROP_RESPONSE_HEADERS = HOP_BY_HOP | {"content-length"}


@functools.cache
def _verifying_context() -> ssl.SSLContext:
    """httpx's default verifying TLS context, built once per process (loading the CA bundle is the
    costly part) and shared by every proxy's client: the context holds no per-connection state."""
    make: Callable[[], ssl.SSLContext] | None = getattr(httpx, "create_ssl_context", None)
    if make is None:  # httpx 0.27: not public yet
        from httpx._config import create_ssl_context

        return create_ssl_context()
    return make()


@functools.cache
def _unused_context() -> ssl.SSLContext:
    """The context handed to httpx for a plain-http upstream, never used to connect: given ``False``
    httpx builds a new context per client (~4 ms of CPU per episode); this one is built once."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class ProxyConfigError(ValueError):
    pass


class _ClientGone(Exception):
    pass


class _Watch:
    """Watches the client connection while a response is in flight: EOF means the client went away."""

    def __init__(self, reader: BufferedReader) -> None:
        self.reader = reader
        self.task: asyncio.Task[bytes] | None = asyncio.ensure_future(reader.read(65536))

    async def run(self, aw: Awaitable[Any]) -> Any:
        """Await ``aw``; raise _ClientGone (after cancelling it) if the client disconnects first."""
        task = asyncio.ensure_future(aw)
        done: set[asyncio.Future[Any]] = set()
        try:
            while self.task is not None:
                done, _ = await asyncio.wait({task, self.task}, return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    return task.result()
                try:
                    data = self.task.result()
                except (ConnectionError, OSError):
                    data = b""
                if data:  # the client sent more (pipelining): keep it for the next request
                    self.reader.unread(data)
                    self.task = None
                else:
                    raise _ClientGone
            return await task
        except BaseException:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            raise
        finally:
            # The task holds what ``aw`` raised (StopAsyncIteration at every stream's end), whose
            # traceback holds this frame: without these references no cycle is left to collect.
            task = None  # type: ignore[assignment]
            done.clear()

    async def stop(self) -> None:
        """Stop watching; bytes the watch already read are kept for the next request."""
        task, self.task = self.task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            await task
        if task.done() and not task.cancelled() and task.exception() is None and task.result():
            self.reader.unread(task.result())


class _StreamScanner:
    """Incremental SSE scan of a response: usage, first-token time, finish reason, malformed chunks,
    and (``tokens``, the token capture) the token ids and logprobs of each event."""

    def __init__(self, tokens: TokenAccumulator | None = None) -> None:
        self.tokens = tokens
        self._buf = b""
        self.usage: TokenUsage | None = None
        self.first_token = False
        self.finish_reason: str | None = None
        self.errors: list[str] = []
        self.events = 0  # JSON data events
        self.choices = False  # an event carried a choice (chat completions)
        self.ended = False  # [DONE], or an Anthropic/responses end event
        self.error_object: str | None = None  # an event that is an error object: its message

    def feed(self, data: bytes) -> bool:
        """Scan ``data``; True when this chunk carried the first generated token."""
        self._buf += data
        first = False
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            line = line.rstrip(b"\r")
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.ended = True
            if not payload or payload == b"[DONE]":
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                if len(self.errors) < 20:
                    self.errors.append(f"malformed SSE data: {payload[:200].decode('utf-8', 'replace')}")
                continue
            if isinstance(obj, dict) and self._event(obj) and not self.first_token:
                self.first_token = first = True
        return first

    def _event(self, obj: dict[str, Any]) -> bool:
        token = False
        self.events += 1
        if self.error_object is None and (obj.get("error") or obj.get("type") == "error"):
            self.error_object = _error_words(obj)
        if obj.get("type") in ("message_stop", "response.completed"):
            self.ended = True
        if obj.get("choices"):
            self.choices = True
        if self.tokens is not None:
            self.tokens.feed(obj)
        usage = obj.get("usage")
        if usage is None and isinstance(obj.get("message"), dict):  # anthropic message_start
            usage = obj["message"].get("usage")
        if usage is None and isinstance(obj.get("response"), dict):  # responses API completed event
            usage = obj["response"].get("usage")
        self.usage = merge_usage(self.usage, parse_usage(usage))
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta, dict) and (
                delta.get("content")
                or delta.get("tool_calls")
                or delta.get("reasoning_content")
                or delta.get("reasoning")
            ):
                token = True
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        etype = obj.get("type")
        if etype in ("content_block_delta", "response.output_text.delta"):
            token = True
        if etype == "message_delta" and isinstance(obj.get("delta"), dict):
            self.finish_reason = obj["delta"].get("stop_reason") or self.finish_reason
        return token


def _error_words(obj: dict[str, Any]) -> str:
    """The message of an error object (OpenAI ``{"error": {...}}``, Anthropic ``{"type": "error"}``)."""
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or err)[:300]
    return str(err or obj)[:300]


def _answers(path: str) -> bool:
    """A request whose 2xx must carry a model's answer (chat completions, messages, responses)."""
    return path.rstrip("/").endswith(("/chat/completions", "/messages", "/responses"))


def _is_chat(path: str) -> bool:
    return path.rstrip("/").endswith("/chat/completions")


def _judge_stream(
    status: int, path: str, nbytes: int, scan: _StreamScanner
) -> tuple[AnswerFault | None, str | None]:
    """Is a 2xx stream an answer? (fault, server's words)."""
    if nbytes == 0:
        return AnswerFault.EMPTY_BODY, None
    if scan.error_object is not None:
        return AnswerFault.ERROR_OBJECT, scan.error_object
    if _is_chat(path) and not scan.choices:
        return AnswerFault.NO_CHOICES, None
    if not scan.ended and scan.finish_reason is None:
        return AnswerFault.UNTERMINATED, None
    if _is_chat(path) and scan.finish_reason is None and not scan.first_token and not scan.errors:
        # Ended, but neither said anything nor why it stopped. (An empty answer that gives a finish
        # reason is the model's choice to say nothing: a good call that produced nothing; a stream
        # with malformed chunks is a malformed answer, its own kind.)
        return AnswerFault.NOTHING, None
    return None, None


def _judge_json(path: str, nbytes: int, body: Any) -> tuple[AnswerFault | None, str | None]:
    """Is a 2xx JSON body an answer? (fault, server's words)."""
    if nbytes == 0:
        return AnswerFault.EMPTY_BODY, None
    if isinstance(body, dict) and body.get("error"):
        return AnswerFault.ERROR_OBJECT, _error_words(body)
    if _is_chat(path) and not (isinstance(body, dict) and body.get("choices")):
        return AnswerFault.NO_CHOICES, None
    return None, None


def _json_produced(body: Any) -> bool:
    """A JSON answer carried text, a tool call or reasoning (chat, Anthropic or responses shape)."""
    if not isinstance(body, dict):
        return False
    for choice in body.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and any(
            message.get(k) for k in ("content", "tool_calls", "reasoning_content", "reasoning")
        ):
            return True
    return bool(body.get("content") or body.get("output"))


def _decode_body(data: bytes, encoding: str | None) -> bytes:
    enc = (encoding or "").lower()
    try:
        if enc == "gzip":
            return zlib.decompress(data, 16 + zlib.MAX_WBITS)
        if enc == "deflate":
            return zlib.decompress(data)
    except zlib.error:
        return data
    return data


def _body_for_record(data: bytes, limit: int) -> tuple[Any, bool]:
    """Parsed JSON when the body is JSON and within ``limit``; else (truncated) text."""
    truncated = len(data) > limit
    if not truncated:
        try:
            return json.loads(data), False
        except ValueError:
            pass
    return data[:limit].decode("utf-8", "replace"), truncated


class ModelProxy(HttpService):
    """Async context manager: ``async with ModelProxy(upstream, record_dir=..., on_call=...) as p:``.

    ``url`` is the base URL to give OpenCode (``http://127.0.0.1:<port>/v1``); ``unix_path`` also (or,
    with ``port=None``, only) listens on a Unix socket. ``upstream_uds`` reaches an upstream that
    listens on a Unix socket. ``access_token``: every request must carry it (``Authorization: Bearer``
    or ``x-api-key``); others get 401 and are recorded as refused, never forwarded. ``read_timeout`` (None: none) bounds the wait for each upstream read; by
    default the client's own timeouts govern, as they would without the proxy.
    """

    def __init__(
        self,
        upstream_url: str,
        *,
        record_dir: str | os.PathLike[str] | None = None,
        on_call: Callable[[ModelCall], None] | None = None,
        on_record: Callable[[ModelCallRecord], None] | None = None,
        api_key_env: str | None = None,
        auth_header: str = "Authorization",
        host: str = "127.0.0.1",
        port: int | None = 0,
        unix_path: str | os.PathLike[str] | socket.socket | None = None,
        upstream_uds: str | os.PathLike[str] | None = None,
        connect_timeout: float = 30.0,
        read_timeout: float | None = None,
        verify: bool = True,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        call_id_prefix: str | None = None,
        access_token: str | None = None,
        gate: CallGate | None = None,
        replay: Replayer | None = None,
        side: tuple[str, Handler] | None = None,
        capture_tokens: bool = False,
    ) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ProxyConfigError(
                f"upstream URL {redact_text(upstream_url)!r} must be http(s)://host[:port]/..."
            )
        self.upstream_url = upstream_url.rstrip("/")
        self.record_dir = Path(record_dir) if record_dir is not None else None
        self.on_call = on_call
        self.on_record = on_record
        self.api_key_env = api_key_env
        self.auth_header = auth_header
        self.host = host
        self._port = port
        self._unix_path = unix_path
        self._upstream_uds = str(upstream_uds) if upstream_uds is not None else None
        self._timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=60.0, pool=None)
        self._verify = verify
        self.max_record_bytes = max_record_bytes
        self._prefix = call_id_prefix if call_id_prefix is not None else f"mc-{secrets.token_hex(3)}-"
        self._counter = itertools.count(1)
        self._api_key: str | None = None
        self.access_token = access_token
        self.gate = (
            gate  # the debugger's breakpoints (opencode_tui_core.model.hold); None: every call goes through
        )
        # rerun/fork (opencode_tui_core.model.replay): recorded answers instead of the upstream's; None: always forward
        self.replay = replay
        # (path prefix, handler): requests there are not the model's (a runner taking its task,
        # opencode_tui_core.episode.handoff): answered by the handler, with the token still required, never recorded.
        self.side = side
        self._client: httpx.AsyncClient | None = None
        self._server = HttpServer(self._handle, name="model-proxy")
        self._file_lock = threading.Lock()
        self.records: list[ModelCallRecord] = []
        self.write_error: str | None = None  # the first failed append to model_calls.jsonl
        self.refusing: str | None = None  # why every new model call is refused (see ``refuse``)
        # The token capture's counts so far (run.json's ``token_capture``); None: the capture is off.
        self.token_capture = TokenCaptureSummary(file=RunFiles.TOKENS) if capture_tokens else None

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> ModelProxy:
        if self.api_key_env:
            key = os.environ.get(self.api_key_env, "")
            if not key.strip():
                raise ProxyConfigError(
                    f"the upstream API key variable {self.api_key_env} is not set (or empty) in the environment"
                )
            self._api_key = key.strip()
        if self.record_dir is not None:
            self.record_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        transport = httpx.AsyncHTTPTransport(uds=self._upstream_uds, verify=self._tls(), retries=0)
        self._client = httpx.AsyncClient(transport=transport, timeout=self._timeout, follow_redirects=False)
        try:
            await super().start()
        except BaseException:
            await self._client.aclose()
            raise
        return self

    async def close(self) -> None:
        await super().close()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def refuse(self, reason: str) -> None:
        """From now on, answer every new call with a 503 naming ``reason``, without asking the model
        (the episode stopped its agent): OpenCode asks again at once after an empty answer, so the
        calls made while it was being stopped were unbounded (ten on docker, for a limit of five)."""
        self.refusing = reason

    def _tls(self) -> ssl.SSLContext | bool:
        """What the upstream client verifies with. A plain-http upstream (the scripted model, a local
        vLLM) never speaks TLS (redirects are not followed): no verifying context, whose CA bundle costs
        ~30 ms of CPU per episode to load, only the shared unused one; an https one shares the
        process's verifying context (or, with verification off, httpx's own per client)."""
        if urlsplit(self.upstream_url).scheme != "https":
            return _unused_context()
        return _verifying_context() if self._verify else False

    @property
    def records_path(self) -> Path | None:
        return None if self.record_dir is None else self.record_dir / RunFiles.MODEL_CALLS

    # -- helpers -----------------------------------------------------------------------------------

    def _secrets(self) -> tuple[str, ...]:
        return tuple(x for x in (self._api_key, self.access_token) if x)

    def _authorized(self, req: Request) -> bool:
        if self.access_token is None:
            return True
        bearer = req.header("authorization") or ""
        given = bearer[7:].strip() if bearer[:7].lower() == "bearer " else req.header("x-api-key") or ""
        return hmac.compare_digest(given.encode(), self.access_token.encode())

    def _target(self, req: Request) -> str:
        path, _, query = req.target.partition("?")
        base = urlsplit(self.upstream_url)
        rest = path[3:] if path == "/v1" or path.startswith("/v1/") else path
        return urlunsplit((base.scheme, base.netloc, base.path.rstrip("/") + rest, query, ""))

    def _upstream_headers(self, req: Request) -> list[tuple[str, str]]:
        out = []
        for k, v in req.headers:
            lk = k.lower()
            if lk in _DROP_REQUEST_HEADERS:
                continue
            if self._api_key and lk in _AUTH_HEADERS:
                continue
            out.append((k, v))
        out.append(("Accept-Encoding", "identity"))
        if self._api_key:
            value = (
                f"Bearer {self._api_key}" if self.auth_header.lower() == "authorization" else self._api_key
            )
            out.append((self.auth_header, value))
        return out

    def _append(self, path: Path, data: dict[str, Any]) -> None:
        """One JSON line appended to a run-directory file (model_calls.jsonl, tokens.jsonl)."""
        line = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        try:
            with self._file_lock:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
        except OSError as exc:
            # Recorded for the episode (a full runs directory), never a traceback on stderr.
            if self.write_error is None:
                self.write_error = f"cannot write {path}: {exc.strerror or exc}"
            log.debug("model proxy: cannot append to %s: %s", path, exc)

    def _finish(self, rec: ModelCallRecord, tokens: TokenAccumulator | None = None) -> ModelCallRecord:
        """Redact, keep, append to model_calls.jsonl (and the call's tokens to tokens.jsonl), emit."""
        data = redact(rec.model_dump(mode="json"), self._secrets())
        # The record of a run that is no replay, or has no token capture, is as it was.
        for name in ("replayed_from", "capture_params"):
            if data.get(name) is None:
                data.pop(name, None)
        safe = ModelCallRecord.model_validate(data)
        self.records.append(safe)
        path = self.records_path
        if path is not None:
            self._append(path, data)
        if tokens is not None:
            self._record_tokens(safe, tokens)
        try:
            if self.on_record is not None:
                self.on_record(safe)
            if self.on_call is not None:
                self.on_call(safe.to_event())
        except Exception:  # a broken consumer must not break the proxy
            log.exception("model proxy: callback failed for %s", safe.call_id)
        return safe

    def _capture_request(
        self, req: Request, body: Any, rec: ModelCallRecord
    ) -> tuple[bytes, TokenAccumulator | None]:
        """What goes upstream, and what gathers its tokens: with the capture on, a chat-completions
        request gets the token parameters it lacks (named in ``rec.capture_params``); any other request,
        or any request with the capture off, goes as it came, its bytes untouched."""
        if self.token_capture is None or req.method != "POST" or not _is_chat(req.path):
            return req.body, None
        if not isinstance(body, dict):
            return req.body, None
        asked, rec.capture_params = with_capture_params(body)
        if not rec.capture_params:  # the client asked for all of it itself
            return req.body, TokenAccumulator()
        return json.dumps(asked, ensure_ascii=False, separators=(",", ":")).encode(), TokenAccumulator()

    def _record_tokens(self, rec: ModelCallRecord, tokens: TokenAccumulator) -> None:
        """Count the call for run.json; its line in tokens.jsonl when the upstream sent token data."""
        assert self.token_capture is not None
        if rec.answered_by is not None:  # a person's reply: the model was never asked
            return
        line = None
        if tokens.found():
            line = CapturedTokens(
                call_id=rec.call_id,
                message_id=rec.message_id,
                session_id=rec.session_id,
                kind=rec.kind,
                model=rec.model,
                status=rec.status,
                finish_reason=rec.finish_reason,
                complete=not (rec.failed or rec.client_disconnected or rec.stream_errors),
                edited_by=rec.edited_by,
                prompt_token_ids=tokens.prompt_token_ids,
                completion_token_ids=tokens.completion_ids(),
                logprobs=tokens.logprobs,
            )
            if self.record_dir is not None:
                self._append(self.record_dir / RunFiles.TOKENS, line.model_dump(mode="json"))
        self.token_capture.add(line)

    def _judge(self, rec: ModelCallRecord, req: Request, is_sse: bool, scan: _StreamScanner) -> None:
        """A call is good only if its answer is: a 2xx to a chat request that is empty, has no choices,
        never ends or carries an error object is a failed call, with the reason (issue 32)."""
        status = rec.status
        if status is None or not 200 <= status < 300 or req.method != "POST" or not _answers(req.path):
            return
        if rec.error is not None or rec.truncated:
            return  # a broken stream says so already; a truncated capture cannot be judged
        if is_sse:
            fault, detail = _judge_stream(status, req.path, rec.response_bytes, scan)
            produced = scan.first_token
        else:
            fault, detail = _judge_json(req.path, rec.response_bytes, rec.response_body)
            produced = _json_produced(rec.response_body)
        rec.produced = produced or bool(rec.usage.tokens_out)
        if fault is not None:
            rec.answer_fault = fault
            rec.error = answer_fault_error(status, fault, detail)

    async def _release_by_hand(
        self, rec: ModelCallRecord, verdict: HoldVerdict, body: Any, writer: asyncio.StreamWriter
    ) -> None:
        """A held call that never reaches the model: a person's answer, or a 503 (the run is ending)."""
        if verdict.action is Release.FAIL:
            await self._fail_held(rec, verdict, writer)
            return
        assert verdict.answer is not None
        rec.status = rec.proxy_status = 200
        rec.answered_by = verdict.by or "person"
        await self._send_answer(rec, verdict.answer, writer)

    @staticmethod
    async def _fail_held(rec: ModelCallRecord, verdict: HoldVerdict, writer: asyncio.StreamWriter) -> None:
        rec.proxy_status = 503
        rec.error = f"held by the debugger and failed: {verdict.reason or 'released without an answer'}"
        message = {"error": {"message": rec.error, "type": "debugger_released", "code": 503}}
        await send_simple(writer, 503, message)

    @staticmethod
    async def _send_answer(rec: ModelCallRecord, answer: HandAnswer, writer: asyncio.StreamWriter) -> None:
        """A reply a person wrote (or edited), in the format the client asked for (stream or JSON)."""
        model = rec.model
        rec.finish_reason = "tool_calls" if answer.tool_calls else "stop"
        rec.produced = True
        if rec.stream:
            data = answer_sse(answer, model)
            headers = [
                ("Content-Type", "text/event-stream"),
                ("Cache-Control", "no-cache"),
                ("Transfer-Encoding", "chunked"),
                ("Connection", "keep-alive"),
            ]
            writer.write(head_bytes(200, headers) + chunk_bytes(data) + LAST_CHUNK)
            await writer.drain()
            rec.response_headers = dict(headers)
            rec.response_body = data.decode()
            rec.response_bytes = len(data)
        else:
            reply = answer_json(answer, model)
            await send_simple(writer, 200, reply)
            rec.response_body = reply

    async def _deliver_reply(
        self,
        rec: ModelCallRecord,
        held: HeldCall,
        head: bytes,
        body: bytes,
        no_body: bool,
        watch: _Watch,
        writer: asyncio.StreamWriter,
    ) -> None:
        """A reply held back for editing (``HoldVerdict.edit_reply``): asked of the gate once the model
        answered; sent as it came, replaced by the person's edit, or failed (the run is ending). A reply
        that is no plain answer (an error, a broken or cut stream) goes through unasked."""
        reply = None
        if rec.status is not None and 200 <= rec.status < 300 and not rec.failed and not rec.truncated:
            reply = reply_of(rec.response_body)
        verdict = FORWARD
        if reply is not None and self.gate is not None:
            verdict = await watch.run(self.gate.hold_reply(held, reply))
        if verdict.action is Release.FORWARD:
            writer.write(head + (b"" if no_body else (chunk_bytes(body) if body else b"") + LAST_CHUNK))
            await writer.drain()
            return
        rec.model_response_body = rec.response_body
        if verdict.action is Release.FAIL:
            await self._fail_held(rec, verdict, writer)
            return
        assert verdict.answer is not None
        rec.edited_by = verdict.by or "person"
        await self._send_answer(rec, verdict.answer, writer)

    # -- the request path --------------------------------------------------------------------------

    async def _handle(self, req: Request, reader: BufferedReader, writer: asyncio.StreamWriter) -> bool:
        if self.side is not None and req.path.startswith(self.side[0]):
            if not self._authorized(req):
                await send_simple(writer, 401, {"error": {"message": "this episode's token is required"}})
                return False
            return await self.side[1](req, reader, writer)
        loop = asyncio.get_running_loop()
        t0 = req.received_at or loop.time()
        started: datetime = utcnow()
        body_json: Any = None
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            body_json = json.loads(req.body) if req.body else None
        req_body, req_trunc = _body_for_record(req.body, self.max_record_bytes) if req.body else (None, False)
        rec = ModelCallRecord(
            call_id=f"{self._prefix}{next(self._counter):04d}",
            method=req.method,
            path=req.path,
            upstream_url=redact_text(self._target(req)),
            started_at=started,
            kind=classify(req.path, body_json if isinstance(body_json, dict) else None),
            session_id=req.header(SESSION_ID_HEADER) or req.header(OPENCODE_SESSION_HEADER),
            message_id=req.header(MESSAGE_ID_HEADER) or None,
            model=str(body_json["model"]) if isinstance(body_json, dict) and "model" in body_json else None,
            stream=bool(body_json.get("stream")) if isinstance(body_json, dict) else None,
            request_headers=redact_headers(req.headers),
            request_body=req_body,
            truncated=req_trunc,
        )
        assert self._client is not None
        if not self._authorized(req):
            # Recorded, so an OpenCode that lost its token is a visible 401, not a silent gap.
            rec.status = rec.proxy_status = 401
            rec.latency_s = loop.time() - t0
            rec.error = "refused by the recording proxy: the request lacks this episode's token"
            with contextlib.suppress(ConnectionError):
                await send_simple(
                    writer,
                    401,
                    {"error": {"message": rec.error, "type": "proxy_unauthorized", "code": 401}},
                )
            self._finish(rec)
            return True
        if self.refusing is not None and req.method == "POST":
            rec.status = rec.proxy_status = 503
            rec.latency_s = loop.time() - t0
            rec.error = f"refused by the recording proxy: {self.refusing}"
            with contextlib.suppress(ConnectionError):
                await send_simple(
                    writer, 503, {"error": {"message": rec.error, "type": "proxy_agent_stopped", "code": 503}}
                )
            self._finish(rec)
            return True
        forwarded, tokens = self._capture_request(req, body_json, rec)
        watch = _Watch(reader)
        resp: httpx.Response | None = None
        head_sent = False
        keep_alive = True
        # Before the try: a client that hangs up mid-stream (OpenCode does, on a malformed chunk) must
        # not hide what the stream had already shown (its malformed chunks decide the failure's kind).
        scanner = _StreamScanner()
        edit: HeldCall | None = None  # forwarded to have its reply held for editing
        try:
            if self.gate is not None and rec.kind == "agent" and req.method == "POST":
                held = HeldCall(call_id=rec.call_id, kind=rec.kind, request_body=body_json)
                hold_began = loop.time()
                verdict = await watch.run(self.gate.hold(held))
                rec.held_s = round(loop.time() - hold_began, 3)
                # The latency and time to first token are the model's: the clock starts again here.
                t0 += loop.time() - hold_began
                if verdict.edit_reply:
                    edit = held
                elif verdict.action is not Release.FORWARD:
                    head_sent = True
                    await self._release_by_hand(rec, verdict, body_json, writer)
                    rec.latency_s = loop.time() - t0
                    return True
            try:
                replayed = None
                if self.replay is not None and req.method == "POST":
                    replayed = await self.replay.answer(rec.kind, body_json)
                if replayed is not None:
                    resp = replayed.response
                    rec.replayed_from = replayed.call_id or "replay"
                else:
                    upstream_req = self._client.build_request(
                        req.method,
                        self._target(req),
                        headers=self._upstream_headers(req),
                        content=forwarded if forwarded or req.method in ("POST", "PUT", "PATCH") else None,
                    )
                    resp = await watch.run(self._client.send(upstream_req, stream=True))
            except httpx.HTTPError as exc:
                rec.error = f"upstream request failed: {type(exc).__name__}: {exc}".rstrip(": ")
                rec.latency_s = loop.time() - t0
                rec.proxy_status = 502
                message = redact_text(f"recording proxy: {rec.error}", self._secrets())
                with contextlib.suppress(ConnectionError):
                    await send_simple(
                        writer,
                        502,
                        {
                            "error": {
                                "message": message,
                                "type": "proxy_upstream_error",
                                "code": 502,
                                "call_id": rec.call_id,
                            }
                        },
                    )
                return True
            rec.status = rec.proxy_status = resp.status_code
            rec.response_headers = redact_headers(resp.headers.multi_items())
            headers = [
                (k, v) for k, v in resp.headers.multi_items() if k.lower() not in _DROP_RESPONSE_HEADERS
            ]
            no_body = req.method == "HEAD" or resp.status_code in (204, 304) or 100 <= resp.status_code < 200
            if not no_body:
                headers.append(("Transfer-Encoding", "chunked"))
            headers.append(("Connection", "keep-alive"))
            head = head_bytes(resp.status_code, headers, resp.reason_phrase or None)
            held_back = bytearray()  # an edited call's reply: sent whole, once the person decided
            if edit is None:
                writer.write(head)
                head_sent = True
            scanner = _StreamScanner(tokens)
            is_sse = "text/event-stream" in resp.headers.get("content-type", "")
            encoding = resp.headers.get("content-encoding")
            captured = bytearray()
            # A JSON answer's tokens are read from all of it, past the record's cap.
            whole = bytearray() if tokens is not None and not is_sse else None
            iterator = resp.aiter_raw()
            while True:
                try:
                    data = await watch.run(iterator.__anext__())
                except StopAsyncIteration:
                    break
                except httpx.HTTPError as exc:
                    rec.error = f"upstream stream broken: {type(exc).__name__}: {exc}".rstrip(": ")
                    keep_alive = False
                    writer.transport.abort()  # the client must see the break, not a completed stream
                    break
                if not data:
                    continue
                now = loop.time()
                if rec.ttfb_s is None:
                    rec.ttfb_s = now - t0
                rec.response_bytes += len(data)
                if len(captured) <= self.max_record_bytes:
                    captured.extend(data[: self.max_record_bytes + 1 - len(captured)])
                if whole is not None:
                    whole.extend(data)
                if is_sse and not encoding and scanner.feed(data) and rec.ttft_s is None:
                    rec.ttft_s = now - t0
                if edit is not None:
                    held_back.extend(data)
                elif not no_body:
                    writer.write(chunk_bytes(data))
                    await writer.drain()
            if keep_alive and not no_body and edit is None:
                writer.write(LAST_CHUNK)
                await writer.drain()
            raw = _decode_body(bytes(captured), encoding)
            if len(captured) > self.max_record_bytes:
                rec.truncated = True
            if is_sse:
                if encoding:  # rare: scan the decoded capture once at the end
                    scanner.feed(raw + b"\n")
                rec.response_body = raw[: self.max_record_bytes].decode("utf-8", "replace")
                rec.usage = scanner.usage or TokenUsage()
                rec.finish_reason = scanner.finish_reason
                rec.stream_errors = scanner.errors
            else:
                if tokens is not None and whole is not None:
                    scan_json_body(_decode_body(bytes(whole), encoding), tokens)
                rec.response_body, trunc = _body_for_record(raw, self.max_record_bytes)
                rec.truncated = rec.truncated or trunc
                if isinstance(rec.response_body, dict):
                    rec.usage = parse_usage(rec.response_body.get("usage")) or TokenUsage()
                    choices = rec.response_body.get("choices") or []
                    if choices and isinstance(choices[0], dict) and choices[0].get("finish_reason"):
                        rec.finish_reason = str(choices[0]["finish_reason"])
                    if rec.ttfb_s is not None and resp.status_code < 400:
                        rec.ttft_s = rec.ttfb_s
            self._judge(rec, req, is_sse, scanner)
            if edit is not None and keep_alive:
                head_sent = True
                await self._deliver_reply(rec, edit, head, bytes(held_back), no_body, watch, writer)
            rec.latency_s = loop.time() - t0
            return keep_alive
        except _ClientGone:
            rec.client_disconnected = True
            rec.stream_errors = rec.stream_errors or list(scanner.errors)
            rec.error = "client disconnected before the response completed"
            rec.latency_s = loop.time() - t0
            keep_alive = False
            return False
        except (ConnectionError, OSError) as exc:  # writing to the client failed
            rec.client_disconnected = True
            rec.stream_errors = rec.stream_errors or list(scanner.errors)
            rec.error = f"client connection lost: {type(exc).__name__}: {exc}"
            rec.latency_s = loop.time() - t0
            return False
        except asyncio.CancelledError:
            rec.error = rec.error or "cancelled: proxy closed while the call was in flight"
            rec.latency_s = loop.time() - t0
            raise
        except Exception as exc:
            log.exception("model proxy: call %s failed", rec.call_id)
            rec.error = f"proxy error: {type(exc).__name__}: {exc}"
            rec.latency_s = loop.time() - t0
            if not head_sent:
                rec.proxy_status = 502
                with contextlib.suppress(ConnectionError):
                    await send_simple(
                        writer,
                        502,
                        {
                            "error": {
                                "message": redact_text(rec.error, self._secrets()),
                                "type": "proxy_error",
                                "code": 502,
                            }
                        },
                    )
                return True
            writer.transport.abort()
            return False
        finally:
            await watch.stop()
            if resp is not None:
                with contextlib.suppress(Exception):
                    await resp.aclose()
            self._finish(rec, tokens)


__all__ = ["MESSAGE_ID_HEADER", "REDACTED", "ModelCallRecord", "ModelProxy", "ProxyConfigError"]
