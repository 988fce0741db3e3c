"""A minimal HTTP/1.1 server core on asyncio streams, shared by the scripted model and the recording proxy.

Only what those two need: request parsing (Content-Length and chunked bodies), keep-alive, chunked
responses for streaming, TCP or Unix-socket listeners, and clean shutdown of open connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 256 * 1024 * 1024

REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    529: "Overloaded",
}
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
    }
)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BufferedReader:
    """An asyncio StreamReader with a push-back buffer (bytes read early are served again first)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._buf = bytearray()

    def unread(self, data: bytes) -> None:
        self._buf[:0] = data

    async def read(self, n: int = 65536) -> bytes:
        if self._buf:
            data = bytes(self._buf[:n])
            del self._buf[:n]
            return data
        return await self._reader.read(n)

    async def readline(self, limit: int) -> bytes:
        while True:
            idx = self._buf.find(b"\n")
            if idx >= 0:
                line = bytes(self._buf[: idx + 1])
                del self._buf[: idx + 1]
                return line
            if len(self._buf) > limit:
                raise HttpError(431, "header line too long")
            chunk = await self._reader.read(65536)
            if not chunk:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf.extend(chunk)

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = await self._reader.read(max(65536, n - len(self._buf)))
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(self._buf), n)
            self._buf.extend(chunk)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    received_at: float = 0.0  # loop.time() when the request line arrived
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None

    @property
    def keep_alive(self) -> bool:
        conn = (self.header("connection") or "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


async def read_request(
    reader: BufferedReader, writer: asyncio.StreamWriter | None = None, max_body: int = MAX_BODY_BYTES
) -> Request | None:
    """Read one request; ``None`` on a clean end of stream before any byte of a new request.

    With ``writer``, an ``Expect: 100-continue`` request gets its interim ``100 Continue`` first.
    """
    loop = asyncio.get_running_loop()
    line = await reader.readline(MAX_HEADER_BYTES)
    while line in (b"\r\n", b"\n"):  # tolerate stray CRLF between requests
        line = await reader.readline(MAX_HEADER_BYTES)
    if not line:
        return None
    received_at = loop.time()
    try:
        method, target, version = line.decode("latin-1").strip().split(" ", 2)
    except ValueError as exc:
        raise HttpError(400, f"bad request line {line[:80]!r}") from exc
    if not version.startswith("HTTP/1."):
        raise HttpError(400, f"unsupported protocol {version!r}")
    headers: list[tuple[str, str]] = []
    total = len(line)
    while True:
        hline = await reader.readline(MAX_HEADER_BYTES)
        total += len(hline)
        if total > MAX_HEADER_BYTES:
            raise HttpError(431, "request headers too large")
        if not hline:
            raise HttpError(400, "connection closed inside the request headers")
        if hline in (b"\r\n", b"\n"):
            break
        name, sep, value = hline.decode("latin-1").partition(":")
        if not sep:
            raise HttpError(400, f"bad header line {hline[:80]!r}")
        headers.append((name.strip(), value.strip()))
    req = Request(method.upper(), target, version, headers, received_at=received_at)
    if writer is not None and (req.header("expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    te = (req.header("transfer-encoding") or "").lower()
    if "chunked" in te:
        body = bytearray()
        while True:
            size_line = await reader.readline(MAX_HEADER_BYTES)
            try:
                size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
            except ValueError as exc:
                raise HttpError(400, "bad chunk size") from exc
            if size == 0:
                while (await reader.readline(MAX_HEADER_BYTES)) not in (b"\r\n", b"\n", b""):
                    pass  # trailers are ignored
                break
            if len(body) + size > max_body:
                raise HttpError(413, "request body too large")
            body.extend(await reader.readexactly(size))
            await reader.readexactly(2)
        req.body = bytes(body)
    else:
        length = req.header("content-length")
        if length:
            try:
                n = int(length)
            except ValueError as exc:
                raise HttpError(400, "bad Content-Length") from exc
            if n < 0 or n > max_body:
                raise HttpError(413, "request body too large")
            req.body = await reader.readexactly(n)
    return req


def head_bytes(status: int, headers: list[tuple[str, str]], reason: str | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason or REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk_bytes(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n" if data else b""


LAST_CHUNK = b"0\r\n\r\n"


async def send_simple(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes | str | dict[str, Any],
    *,
    content_type: str | None = None,
    headers: list[tuple[str, str]] | None = None,
    keep_alive: bool = True,
) -> None:
    if isinstance(body, dict):
        payload = json.dumps(body).encode()
        content_type = content_type or "application/json"
    else:
        payload = body.encode() if isinstance(body, str) else body
        content_type = content_type or "text/plain; charset=utf-8"
    hdrs = [("Content-Type", content_type), ("Content-Length", str(len(payload)))]
    hdrs += headers or []
    hdrs.append(("Connection", "keep-alive" if keep_alive else "close"))
    writer.write(head_bytes(status, hdrs) + payload)
    await writer.drain()


def _remove_stale_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()


Handler = Callable[[Request, BufferedReader, asyncio.StreamWriter], Awaitable[bool]]


class HttpServer:
    """Listens on TCP (``host``/``port``; port 0 picks one) and/or a Unix socket; one task per connection.

    ``handler(request, reader, writer)`` answers one request and returns whether the connection may be
    reused. ``close()`` stops listening and aborts every open connection.
    """

    def __init__(self, handler: Handler, name: str = "http") -> None:
        self._handler = handler
        self._name = name
        self._servers: list[asyncio.base_events.Server] = []
        self._conns: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port: int | None = None
        self.unix_path: str | None = None

    async def start(
        self,
        host: str | None = "127.0.0.1",
        port: int | None = 0,
        unix_path: str | os.PathLike[str] | socket.socket | None = None,
    ) -> None:
        if isinstance(unix_path, socket.socket):
            # Bound and listening already (a warm sandbox's bind mount holds this very socket file:
            # a new socket at the same path would be another inode, unseen inside).
            srv = await asyncio.start_unix_server(self._on_conn, sock=unix_path, limit=MAX_HEADER_BYTES)
            self._servers.append(srv)
            self.unix_path = str(unix_path.getsockname())
        elif unix_path is not None:
            path = Path(unix_path)
            _remove_stale_socket(path)
            srv = await asyncio.start_unix_server(self._on_conn, path=str(path), limit=MAX_HEADER_BYTES)
            self._servers.append(srv)
            self.unix_path = str(path)
        if host is not None and port is not None:
            srv = await asyncio.start_server(self._on_conn, host=host, port=port, limit=MAX_HEADER_BYTES)
            self._servers.append(srv)
            self.port = srv.sockets[0].getsockname()[1]
        if not self._servers:
            raise ValueError(f"{self._name}: nothing to listen on (give host/port and/or unix_path)")

    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self._writers.add(writer)
        br = BufferedReader(reader)
        try:
            while True:
                try:
                    req = await read_request(br, writer)
                except HttpError as exc:
                    with contextlib.suppress(ConnectionError):
                        await send_simple(
                            writer, exc.status, {"error": {"message": str(exc)}}, keep_alive=False
                        )
                    break
                if req is None:
                    break
                keep = await self._handler(req, br, writer)
                if not keep or not req.keep_alive or writer.is_closing():
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception:  # a handler bug must not kill the server
            log.exception("%s: connection handler failed", self._name)
        finally:
            self._conns.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def close(self) -> None:
        for srv in self._servers:
            srv.close()
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
        for srv in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(srv.wait_closed(), 2.0)
        self._servers.clear()
        if self.unix_path:
            with contextlib.suppress(OSError):
                os.unlink(self.unix_path)


class HttpService:
    """What the scripted model and the proxy share: a server, its addresses, a context manager.

    Subclasses set ``host``, ``_port``, ``_unix_path`` and ``_server`` and may extend ``start``/``close``.
    """

    host: str
    _port: int | None
    _unix_path: str | os.PathLike[str] | socket.socket | None
    _server: HttpServer

    async def start(self) -> Self:
        await self._server.start(self.host if self._port is not None else None, self._port, self._unix_path)
        return self

    async def close(self) -> None:
        await self._server.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def port(self) -> int | None:
        return self._server.port

    @property
    def unix_path(self) -> str | None:
        return self._server.unix_path

    @property
    def url(self) -> str:
        """Base URL for OpenAI clients (``.../v1``); over a Unix socket the host part is nominal."""
        if self._server.port is not None:
            return f"http://{self.host}:{self._server.port}/v1"
        return "http://localhost/v1"
