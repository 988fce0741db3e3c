"""``opencode-tui serve [--host 127.0.0.1] [--port P] [--read-only] [--runs-dir DIR]``: the TUI in a browser.

``textual-serve`` runs the app (the runs browser, and from it replays and diffs) in a process of its
own for each browser session, ended when the session's websocket closes (a re-run, which starts a
second app in that process, is refused there). Around it:

- a random token: the one URL printed carries it; the first request with it sets an HttpOnly,
  SameSite=Strict cookie and redirects to the bare path (the token leaves the address bar), and every
  other request (page, static files, downloads, websocket) needs that cookie: none gives 401, a wrong
  one 403. The token is kept in this process's memory only: not in the app's environment, not in a
  log (the access log is off), not in a run directory.
- a websocket from another origin is refused (403), and at most ``--max-sessions`` run at once (503).
- loopback by default; any other ``--host`` prints a warning (plain HTTP: the token travels in clear).
- ``--read-only``: the app's processes refuse what changes state (``opencode_tui.read_only``).
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
import secrets
import shlex
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from core.exit_codes import ExitCode
from opencode_tui import read_only

COOKIE = "opencode_tui_session"
DEFAULT_MAX_SESSIONS = 4


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


QUIT_DEADLINE_S = (
    30.0  # a session's app, asked to quit when its socket closed, has this long; then it is ended
)
END_DEADLINE_S = 5.0


def app_command(runs_dir: Path) -> str:
    """The command each session runs. textual-serve starts it through the shell: ``exec`` makes the app
    the process the server holds, so ending that process ends the app."""
    return "exec " + shlex.join(
        [sys.executable, "-m", "opencode_tui.cli", "runs", "--runs-dir", str(runs_dir)]
    )


def make_server(command: str, sock: socket.socket, token: str, max_sessions: int, title: str):
    """The textual-serve server with the token check and the session limit (imported here: aiohttp and
    textual-serve load only for `serve`)."""
    import asyncio
    import contextlib
    import logging

    from aiohttp import web
    from textual_serve.app_service import AppService
    from textual_serve.server import Server

    class SessionProcess(AppService):
        """One session's app process, which ends with the session: asked to quit, then ended."""

        async def stop(self) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(super().stop(), QUIT_DEADLINE_S)
            proc = self._process
            if proc is None or proc.returncode is not None:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), END_DEADLINE_S)  # quitting: give it a moment
                return
            for end in (proc.terminate, proc.kill):
                with contextlib.suppress(ProcessLookupError):
                    end()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), END_DEADLINE_S)
                    return

    def size(request: web.Request, name: str, default: int) -> int:
        try:
            return max(1, min(int(request.query.get(name, default)), 1000))
        except ValueError:
            return default

    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host

    class TokenServer(Server):
        def __init__(self) -> None:
            super().__init__(
                command, host=host, port=port, title=title, public_url=f"http://{shown_host}:{port}"
            )
            self.sessions = 0

        def _valid(self, value: str) -> bool:
            return hmac.compare_digest(value.encode(), token.encode())

        @web.middleware
        async def guard(
            self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            given = request.query.get("token")
            if given is not None:
                if not self._valid(given):
                    raise web.HTTPForbidden(text="wrong token\n")
                # The token becomes the session cookie, and leaves the address bar and the history.
                response = web.HTTPFound(request.rel_url.with_query(None).path or "/")
                response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
                raise response
            cookie = request.cookies.get(COOKIE)
            if cookie is None:
                raise web.HTTPUnauthorized(
                    text="open the URL `opencode-tui serve` printed (it carries a token)\n"
                )
            if not self._valid(cookie):
                raise web.HTTPForbidden(text="wrong token\n")
            if request.path == "/ws":
                origin = request.headers.get("Origin")
                if origin is not None and origin != self.public_url:
                    raise web.HTTPForbidden(text="websocket from another origin\n")
                if self.sessions >= max_sessions:
                    raise web.HTTPServiceUnavailable(
                        text=f"{max_sessions} browser sessions are open (serve --max-sessions)\n"
                    )
            return await handler(request)

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            app.middlewares.append(self.guard)
            return app

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            """A browser session: its own app process, counted, and ended when the socket closes."""
            self.sessions += 1
            websocket = web.WebSocketResponse(heartbeat=15)
            session: SessionProcess | None = None
            try:
                await websocket.prepare(request)

                async def close_socket() -> None:
                    await websocket.close()

                session = SessionProcess(
                    self.command,
                    write_bytes=websocket.send_bytes,
                    write_str=websocket.send_str,
                    close=close_socket,
                    download_manager=self.download_manager,
                    debug=self.debug,
                )
                await session.start(size(request, "width", 80), size(request, "height", 24))
                await self._process_messages(websocket, session)
            except asyncio.CancelledError:
                await websocket.close()
                raise
            except Exception:
                logging.getLogger("textual-serve").exception("browser session failed")
            finally:
                try:
                    if session is not None:
                        await session.stop()
                finally:
                    self.sessions -= 1
            return websocket

        async def on_startup(self, app: web.Application) -> None:
            pass  # the URL is printed once, by serve(); the library's banner would add another

        def serve(self, debug: bool = False) -> None:
            import asyncio
            import signal

            self.debug = debug
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.request_exit)
            # access_log=None: a request line would carry the token of the first request
            web.run_app(
                self._make_app(), sock=sock, handle_signals=False, loop=loop, access_log=None, print=None
            )

    return TokenServer()


def cmd_serve(args: argparse.Namespace) -> int:
    host, port = args.host, args.port
    runs_dir = Path(args.runs_dir)
    if not runs_dir.is_dir():
        print(f"opencode-tui serve: {runs_dir} is not a directory (pass --runs-dir)", file=sys.stderr)
        return ExitCode.USAGE
    if args.max_sessions < 1:
        print("opencode-tui serve: --max-sessions must be at least 1", file=sys.stderr)
        return ExitCode.USAGE
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
    except OSError as exc:
        what = "is in use" if exc.errno == 98 else f"cannot be bound ({exc.strerror or exc})"
        print(
            f"opencode-tui serve: {host}:{port} {what}; choose another with --port (0: any free one)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    if not is_loopback(host):
        print(
            f"opencode-tui serve: warning: serving on {host}, not loopback: whoever reaches it and has the URL "
            "controls the app, and plain HTTP carries the token in clear (prefer an SSH tunnel to 127.0.0.1)",
            file=sys.stderr,
        )
    # The sessions' app processes inherit these (nothing secret).
    os.environ[read_only.SERVED_ENV] = "1"
    if args.read_only:
        os.environ[read_only.ENV] = "1"
    token = secrets.token_urlsafe(24)
    server = make_server(app_command(runs_dir), sock, token, args.max_sessions, "opencode-tui")
    mode = " (read-only)" if args.read_only else ""
    print(f"{server.public_url}/?token={token}{mode}", flush=True)
    server.serve()
    return ExitCode.OK
