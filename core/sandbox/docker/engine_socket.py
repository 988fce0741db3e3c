"""The Docker engine's API over its Unix socket, straight from the event loop, for the calls an
episode makes most: an exec's create, start (the hijacked attach stream) and inspect.

Through the SDK one exec costs about 4 ms of the controller's CPU: three requests through
``requests`` and ``http.client``, each in a worker thread, plus a thread reading the attach stream.
Here the same three requests cost about 1 ms (measured, ``docker exec true``): one small HTTP/1.1
exchange per connection, written and parsed in place. The archive calls (a task's files in, OpenCode's
database and the verifier's output out), the container's inspect and events (the close's evidence)
and its removal go the same way. Only for an engine reached over a Unix socket
(the default); over tcp, ssh or TLS every call still goes through the SDK.

Errors keep the SDK's shape, so the provider classifies them the same way: a status of 400 or more
raises ``EngineStatusError`` (a ``docker.errors.APIError`` with that status), a refused or missing
socket ``ConnectionError``/``FileNotFoundError``, a silent engine ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import docker
import docker.errors
import docker.transport

from opencode_tui_core.sandbox.docker.common import CALL_DEADLINE_S, FILE_DEADLINE_S

# The longest response head the engine sends (its headers are a few hundred bytes).
HEAD_LIMIT = 64 * 1024


class EngineStatusError(docker.errors.APIError):
    """The engine answered with an error status (``status_code``); the message is its own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, explanation=message)
        self._status = status

    @property
    def status_code(self) -> int:
        return self._status

    def __str__(self) -> str:
        return f"{self._status} from the Docker engine: {self.explanation}"


class EngineNotFound(EngineStatusError, docker.errors.NotFound):
    """404: no such container, exec or path."""


class EngineSocket:
    """Requests to the engine's API at ``path`` (a Unix socket), version ``api_version``."""

    def __init__(self, path: str, api_version: str) -> None:
        self.path = path
        self.prefix = f"/v{api_version}"

    @classmethod
    def of(cls, client: docker.DockerClient) -> EngineSocket | None:
        """The socket ``client`` talks to, when it is a Unix socket (None: tcp, ssh, a named pipe)."""
        adapter = getattr(client.api, "_custom_adapter", None)
        if isinstance(adapter, docker.transport.UnixHTTPAdapter):
            return cls(adapter.socket_path, client.api.api_version)
        return None

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request with a JSON body (or none); its JSON answer (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        payload = await self.request(method, path, data)
        return json.loads(payload) if payload.strip() else None

    async def request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        *,
        content_type: str = "application/json",
        timeout: float = CALL_DEADLINE_S,
    ) -> bytes:
        """One request; the answer's body, read within ``timeout``. Raises EngineStatusError (404:
        ``EngineNotFound``) when the engine answers with an error status."""
        reader, writer = await self._send(method, path, data, content_type, upgrade=False)
        try:
            status, headers = await _head(reader)
            payload = await asyncio.wait_for(_body(reader, status, headers), timeout)
        finally:
            writer.close()
        _raise_for(status, payload)
        return payload

    async def attach(
        self, method: str, path: str, body: dict[str, Any]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A request the engine answers by handing over the connection (``Upgrade: tcp``): the
        stream, to read the attach frames from (and write stdin to)."""
        reader, writer = await self._send(
            method, path, json.dumps(body).encode(), "application/json", upgrade=True
        )
        try:
            status, headers = await _head(reader)
            if status not in (101, 200):
                _raise_for(status, await asyncio.wait_for(_body(reader, status, headers), CALL_DEADLINE_S))
                raise EngineStatusError(status, "the engine did not hand over the connection")
        except BaseException:
            writer.close()
            raise
        return reader, writer

    async def _send(
        self, method: str, path: str, data: bytes | None, content_type: str, *, upgrade: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(self.path, limit=HEAD_LIMIT), CALL_DEADLINE_S
        )
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", "Host: docker"]
        if data is not None:
            lines += [f"Content-Type: {content_type}", f"Content-Length: {len(data)}"]
        if upgrade:
            lines += ["Connection: Upgrade", "Upgrade: tcp"]
        # Otherwise keep-alive, though each connection serves one request: told to close, the engine
        # may answer an upload it refuses (404) and close before reading it, and the unread bytes reset
        # the connection before its answer is read.
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (data or b""))
        try:
            await asyncio.wait_for(
                writer.drain(), FILE_DEADLINE_S if data and len(data) > 1 << 20 else CALL_DEADLINE_S
            )
        except BaseException:
            writer.close()
            raise
        return reader, writer


def json_objects(body: bytes) -> list[Any]:
    """The JSON values of a stream that writes them one after another (``/events``)."""
    text, decoder, i = body.decode("utf-8", "replace"), json.JSONDecoder(), 0
    out: list[Any] = []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        value, i = decoder.raw_decode(text, i)
        out.append(value)


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CALL_DEADLINE_S)
    except asyncio.IncompleteReadError as exc:
        raise ConnectionResetError("the Docker engine closed the connection before answering") from exc
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ConnectionResetError(f"the Docker engine answered something else than HTTP: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _body(reader: asyncio.StreamReader, status: int, headers: dict[str, str]) -> bytes:
    if status in (204, 304) or status < 200:
        return b""  # no body, whatever the headers say
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                with contextlib.suppress(asyncio.IncompleteReadError):
                    await reader.readuntil(b"\r\n")  # the (empty) trailer
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read()  # neither: the engine closes after it


def _raise_for(status: int, payload: bytes) -> None:
    if status < 400:
        return
    message = payload.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(payload).get("message") or message
    raise (EngineNotFound if status == 404 else EngineStatusError)(status, message or f"HTTP {status}")
