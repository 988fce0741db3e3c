"""The run's control socket: ``control.sock`` in the run directory (mode 0600, the owner's uid only),
JSON lines (opencode_tui_core.debugger.protocol), served by the engine while the episode runs.

A Unix socket path is limited to about 108 bytes: when the run directory's is longer, the socket lives
in a private temporary directory and ``control.sock`` in the run directory is a symbolic link to it
(``connect_path`` resolves it for a client).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import struct
import tempfile
from pathlib import Path

from pydantic import ValidationError

from opencode_tui_core.debugger.debugger import Debugger
from opencode_tui_core.debugger.protocol import CONTROL_SOCKET, CtlReply, CtlRequest

MAX_LINE = 1 << 20
IDLE_S = 60.0  # a connection that sends nothing for this long is closed
SUN_PATH_MAX = 100  # sockaddr_un holds 108 bytes; leave room


def connect_path(run_dir: Path) -> Path:
    """The socket path a client connects to (the link's target when the run dir's path is long)."""
    path = Path(run_dir) / CONTROL_SOCKET
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def peer_uid(sock: socket.socket) -> int | None:
    with contextlib.suppress(OSError, AttributeError):
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    return None


class ControlSocket:
    """``async with ControlSocket(run_dir, debugger):`` serves requests until the episode ends."""

    def __init__(self, run_dir: Path, debugger: Debugger) -> None:
        self.link = Path(run_dir) / CONTROL_SOCKET
        self.debugger = debugger
        self._server: asyncio.Server | None = None
        self._tmp: str | None = None
        self.path: Path | None = None

    async def __aenter__(self) -> ControlSocket:
        path = self.link
        if len(os.fsencode(path)) > SUN_PATH_MAX:
            self._tmp = tempfile.mkdtemp(prefix="octui-ctl-")
            path = Path(self._tmp) / "c.sock"
        # No moment when others could connect, without touching the process's umask (shared by every
        # episode and thread of this process: a changed umask made their files unusable): the socket's
        # directory is owner-only (a run directory is made 0700, as is mkdtemp's), then the socket is.
        self._server = await asyncio.start_unix_server(self._serve, path=str(path), limit=MAX_LINE)
        os.chmod(path, 0o600)
        if self._tmp is not None:
            os.symlink(path, self.link)
        self.path = path
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        for p in (self.link, self.path):
            if p is not None:
                with contextlib.suppress(OSError):
                    p.unlink()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None and peer_uid(sock) not in (None, os.getuid()):
                await self._reply(writer, CtlReply(ok=False, message="this run belongs to another user"))
                return
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), IDLE_S)
                except (TimeoutError, ValueError):
                    return
                if not line:
                    return
                await self._reply(writer, await self._handle(line))
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 5)

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, reply: CtlReply) -> None:
        writer.write(reply.model_dump_json().encode() + b"\n")
        await writer.drain()

    async def _handle(self, line: bytes) -> CtlReply:
        try:
            req = CtlRequest.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "request"
            return CtlReply(ok=False, message=f"bad request: {where}: {first['msg']}")
        d, who = self.debugger, req.who
        if req.command == "status":
            return d.status(req.with_request)
        if req.command == "pause":
            return d.pause(who)
        if req.command == "continue":
            return d.continue_(who)
        if req.command == "step":
            return d.step(who)
        if req.command == "break":
            return d.add_break(req.text or "", who)
        if req.command == "say":
            return await d.say(req.text or "", who)
        if req.command == "abort":
            return await d.abort(who)
        if req.command == "edit":
            return d.edit(req.answer, who)
        if req.answer is None:
            return CtlReply(ok=False, message="answer: give the reply (text or a tool call); nothing changed")
        return d.answer(req.answer, who)
