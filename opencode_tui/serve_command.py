"""``opencode-tui serve [--host 127.0.0.1] [--port P] [--read-only] [--runs-dir DIR] [--run TASK...]``:
the TUI in a browser.

``textual-serve`` runs the app (the runs browser, and from it replays, diffs and live re-runs; with
``--run TASK...`` the batch screen running those tasks) in a process of its own for each browser
session. A session ends when its websocket closes, and every session ends when the server is stopped
(SIGINT, SIGTERM, SIGHUP): its app gets SIGTERM, the signal a terminal's app closes a live episode on,
so a running episode is closed with its cleanup confirmed and recorded before the app exits
(``CLOSE_DEADLINE_S``; only then is it killed). Around it:

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

from opencode_tui import read_only
from opencode_tui_core.exit_codes import ExitCode

COOKIE = "opencode_tui_session"
DEFAULT_MAX_SESSIONS = 4


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# A session's app, sent SIGTERM, has this long to close (a live episode's close budget, 60 s by
# default, and its record); then it is killed (what it leaves is `sweep`'s).
CLOSE_DEADLINE_S = 150.0
END_DEADLINE_S = 5.0


def app_command(
    runs_dir: Path, run: list[str] | None = None, jobs: int | None = None, provider: str | None = None
) -> str:
    """The command each session runs: the runs browser, or (``run``: tasks) the batch screen running
    them. textual-serve starts it through the shell: ``exec`` makes the app the process the server
    holds, so a signal to that process reaches the app."""
    argv = [sys.executable, "-m", "opencode_tui.cli"]
    if run:
        # `run` opens the batch screen for two or more tasks (the run screen for one): asked for here.
        argv += ["run", *run, "--runs-dir", str(runs_dir), "--batch-screen"]
        if jobs is not None:
            argv += ["--jobs", str(jobs)]
        if provider is not None:
            argv += ["--provider", provider]
    else:
        argv += ["runs", "--runs-dir", str(runs_dir)]
    return "exec " + shlex.join(argv)


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
        """One session's app process, which ends with the session: SIGTERM (a live episode in it closes
        with cleanup confirmed), then, past the deadline, SIGKILL. Its output is read to the end even
        after the socket closed: an app blocked on a full pipe could not finish its cleanup."""

        _stopping: asyncio.Task[None] | None = None

        async def _open_app_process(self, width: int = 80, height: int = 24):
            # Its own session: a terminal's Ctrl-C reaches the server only, which sends the app one SIGTERM.
            env = self._build_environment(width=width, height=height)
            self._process = process = await asyncio.create_subprocess_shell(
                self.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
            assert process.stdin is not None
            self._stdin = process.stdin
            return process

        def signal(self) -> None:
            """SIGTERM to the app: it closes what runs in it (a second one hurries that close)."""
            proc = self._process
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()

        async def stop(self) -> None:
            """End the app (once, however many ask) and wait until it has."""
            if self._stopping is None:
                self._stopping = asyncio.ensure_future(self._stop())
            await asyncio.shield(self._stopping)

        async def _stop(self) -> None:
            await self._download_manager.cancel_app_downloads(app_service_id=self.app_service_id)
            proc = self._process
            if proc is not None and proc.returncode is None:
                self.signal()
                try:
                    await asyncio.wait_for(proc.wait(), CLOSE_DEADLINE_S)
                except TimeoutError:
                    logging.getLogger("textual-serve").error(
                        "a session's app did not close within %.0f s of SIGTERM: killed "
                        "(`opencode-tui sweep` removes what it left)",
                        CLOSE_DEADLINE_S,
                    )
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), END_DEADLINE_S)
            if self._task is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._task, END_DEADLINE_S)  # the output's end

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
            self.open: set[SessionProcess] = set()  # the sessions whose app runs
            self.closing = False
            self.ending: asyncio.Future[None] | None = None

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
                if self.closing:
                    raise web.HTTPServiceUnavailable(text="the server is stopping\n")
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

                # Once the socket has closed the app's output is read and dropped, not an error.
                async def write_bytes(data: bytes) -> None:
                    if not websocket.closed:
                        with contextlib.suppress(ConnectionError):
                            await websocket.send_bytes(data)

                async def write_str(data: str) -> None:
                    if not websocket.closed:
                        with contextlib.suppress(ConnectionError):
                            await websocket.send_str(data)

                session = SessionProcess(
                    self.command,
                    write_bytes=write_bytes,
                    write_str=write_str,
                    close=close_socket,
                    download_manager=self.download_manager,
                    debug=self.debug,
                )
                self.open.add(session)
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
                    self.open.discard(session)
                    self.sessions -= 1
            return websocket

        def on_signal(self, name: str) -> None:
            """SIGINT/SIGTERM/SIGHUP: every session's app is ended (what runs in it closes, cleanup
            confirmed), then the server stops; a second signal hurries the apps' close."""
            if self.closing:
                print(
                    f"opencode-tui serve: {name} again: hurrying the sessions' close",
                    file=sys.stderr,
                    flush=True,
                )
                for session in list(self.open):
                    session.signal()
                return
            self.closing = True
            if self.open:
                print(
                    f"opencode-tui serve: {name}: ending {len(self.open)} session(s); a running episode "
                    "closes with its cleanup confirmed (send it again to hurry)",
                    file=sys.stderr,
                    flush=True,
                )
            self.ending = asyncio.ensure_future(self._end_sessions())  # held: a task may not vanish

        async def _end_sessions(self) -> None:
            try:
                await asyncio.gather(*(s.stop() for s in list(self.open)), return_exceptions=True)
            finally:
                asyncio.get_running_loop().call_soon(self.request_exit)  # raises GracefulExit in the loop

        async def on_startup(self, app: web.Application) -> None:
            pass  # the URL is printed once, by serve(); the library's banner would add another

        def serve(self, debug: bool = False) -> None:
            import asyncio
            import signal

            self.debug = debug
            self.initialize_logging()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.add_signal_handler(sig, self.on_signal, sig.name)
            # access_log=None: a request line would carry the token of the first request
            web.run_app(
                self._make_app(), sock=sock, handle_signals=False, loop=loop, access_log=None, print=None
            )

    return TokenServer()


def _admitted_tasks(args: argparse.Namespace) -> list[str] | None:
    """``--run``'s tasks admitted as `run` admits them (here, once: a bad task is one line and exit 2,
    not a session that fails in the browser), as absolute paths; None after saying what was wrong."""
    from opencode_tui.run_command import admit
    from opencode_tui_core.api import RunRefused

    run_args = argparse.Namespace(
        tasks=args.run,
        config=None,
        provider=args.provider,
        keep_sandbox=False,
        model_url=None,
        model=None,
        api_key_env=None,
        attempts=None,
        runs_dir=args.runs_dir,
        executor=None,
        ray_address=None,
        ray_num_cpus_per_episode=None,
        batch=False,
        jobs=args.jobs,
    )
    try:
        tasks = admit(run_args).tasks
    except RunRefused as exc:
        print(f"opencode-tui serve: {exc}", file=sys.stderr)
        return None
    return [str(t.root.resolve()) for t in tasks]


def cmd_serve(args: argparse.Namespace) -> int:
    host, port = args.host, args.port
    runs_dir = Path(args.runs_dir)
    if not runs_dir.is_dir() and not (args.run and not runs_dir.exists()):  # a run makes its own
        print(f"opencode-tui serve: {runs_dir} is not a directory (pass --runs-dir)", file=sys.stderr)
        return ExitCode.USAGE
    if args.max_sessions < 1:
        print("opencode-tui serve: --max-sessions must be at least 1", file=sys.stderr)
        return ExitCode.USAGE
    if args.run and args.read_only:
        print("opencode-tui serve: --read-only starts no runs; drop --run or --read-only", file=sys.stderr)
        return ExitCode.USAGE
    if (args.jobs is not None or args.provider) and not args.run:
        print("opencode-tui serve: --jobs and --provider are for --run TASK...", file=sys.stderr)
        return ExitCode.USAGE
    if args.run:
        tasks = _admitted_tasks(args)
        if tasks is None:
            return ExitCode.USAGE
        args.run = tasks
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
    command = app_command(runs_dir, args.run, args.jobs, args.provider)
    server = make_server(command, sock, token, args.max_sessions, "opencode-tui")
    mode = " (read-only)" if args.read_only else ""
    print(f"{server.public_url}/?token={token}{mode}", flush=True)
    server.serve()
    return ExitCode.OK
