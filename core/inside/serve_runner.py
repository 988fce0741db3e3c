#!/usr/bin/env python3
"""One OpenCode session through ``opencode serve``, uploaded into the sandbox (stdlib only, Python >= 3.8).

``opencode run --format json`` prints a tool call only once it has finished; the server's event stream
(``GET /event``) also carries a running bash command's output so far and assistant text as it is
generated. This runner gets that stream and otherwise behaves like ``opencode run``:

1. starts ``BINARY serve`` on the sandbox's loopback (port chosen by the kernel, basic auth with a
   password only this process knows) in the current directory;
2. subscribes to ``/event`` before anything happens, so no event is missed;
3. creates a session with ``run``'s permission rules (no ``question``, no plan mode: nobody is there to
   answer) and sends the prompt read from stdin with ``prompt_async``;
4. writes every event that belongs to the session (or a sub-agent session it starts) to stdout, one JSON
   object per line; auto-rejects permission requests as ``run`` does; notes ``session.error``;
5. stops when the session goes idle, then stops the server.

Exit status: 0 when the turn ended without a session error, 1 after a session error or a failed request,
the server's own status (128+signal when killed) when it dies first, 3 when it never started listening.
Lines this runner adds itself have types starting with ``runner.``.

With ``--ahead`` it starts the server before its task exists (the warm pool, issue 31): once listening
(and with ``--ahead-session``, once its event stream is connected and the session open) it notes
``runner.ready`` and waits for its task. Given a token (``HANDOFF_TOKEN_ENV``), it asks the episode's
proxy for it through the relay (``receive_task``: the task files unpacked into the workdir and the
access check run, as the sandbox user, then the prompt); either way the prompt ends up in
``prompt.txt`` next to itself, signalled by ``go``.

Usage::

    python3 serve_runner.py OPENCODE_BINARY < prompt.txt
    python3 serve_runner.py --ahead[-session] OPENCODE_BINARY   # then prompt.txt and go
    python3 serve_runner.py --control say < message.txt   # the debugger (issue 27), a second process
    python3 serve_runner.py --control abort

While a session runs, the runner keeps where its server listens (port, credentials, session id) in
``control.json`` next to itself (mode 0600): ``--control`` reads it and posts a user message to the
live session (``prompt_async``, taken into its next turn) or aborts the turn (``abort``). Exit status of
``--control``: 0 done, 4 no live session, 1 the server refused.
"""

import base64
import http.client
import json
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import tarfile
import threading
import time

LISTEN_TIMEOUT_S = 120.0
# The model relay (started next to this runner by the harness) must accept within this long.
RELAY_TIMEOUT_S = 10.0
RELAY_PORT_ENV = "OPENCODE_TUI_RELAY_PORT"  # set by the harness (opencode_tui_core.runtime.opencode)
CONNECT_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
# After this long without events during a turn, the session's status is asked for directly.
STATUS_POLL_S = 15.0
# When OpenCode's event stream ends while the server still runs, reconnect this many times.
MAX_RECONNECTS = 5
# The same rules ``opencode run`` gives its session: tools that wait for a human are denied.
SESSION_PERMISSIONS = [
    {"permission": "question", "action": "deny", "pattern": "*"},
    {"permission": "plan_enter", "action": "deny", "pattern": "*"},
    {"permission": "plan_exit", "action": "deny", "pattern": "*"},
]
# Server-wide noise (plugin loading, file watcher, catalogues) is not forwarded.
FORWARDED_PREFIXES = ("session.", "message.", "permission.", "question.", "todo.", "file.edited")
LISTENING = re.compile(r"listening on https?://([^:/\s]+):(\d+)")


class RunnerError(Exception):
    """A request to the server failed; the message says which and why."""


def out(obj):
    sys.stdout.buffer.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def note(kind, **properties):
    out({"type": "runner." + kind, "properties": properties})
    sys.stdout.buffer.flush()


def session_of(event):
    props = event.get("properties")
    if not isinstance(props, dict):
        return None
    for holder in (props, props.get("info"), props.get("part")):
        if isinstance(holder, dict) and isinstance(holder.get("sessionID"), str):
            return holder["sessionID"]
    info = props.get("info")
    if event.get("type", "").startswith("session.") and isinstance(info, dict):
        return info.get("id")
    return None


def repeated(event, last_running):
    """True for a running tool update identical to the last one forwarded for that part: once a
    command's output passes OpenCode's live window, its updates can repeat the same 30 KB."""
    if event.get("type") != "message.part.updated":
        return False
    part = (event.get("properties") or {}).get("part") or {}
    if part.get("type") != "tool":
        return False
    state = part.get("state") or {}
    if state.get("status") != "running":
        last_running.pop(part.get("id"), None)
        return False
    key = json.dumps(state, sort_keys=True)
    if last_running.get(part.get("id")) == key:
        return True
    last_running[part.get("id")] = key
    return False


class Server:
    """The ``opencode serve`` child and authenticated requests to it."""

    def __init__(self, binary):
        self.password = secrets.token_urlsafe(24)
        env = dict(os.environ)
        env["OPENCODE_SERVER_PASSWORD"] = self.password
        env["OPENCODE_SERVER_USERNAME"] = "opencode"
        self.auth = "Basic " + base64.b64encode(("opencode:" + self.password).encode()).decode()
        self.proc = subprocess.Popen(
            [binary, "serve", "--hostname", "127.0.0.1", "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
        )
        self.port = None
        self._listening = threading.Event()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self):
        # The server prints where it listens on stdout; anything else it prints goes to our stderr,
        # so stdout stays machine-readable.
        assert self.proc.stdout is not None  # started with stdout=PIPE
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            found = LISTENING.search(line) if self.port is None else None
            if found:
                self.port = int(found.group(2))
                self._listening.set()
            sys.stderr.write(line)
            sys.stderr.flush()
        self._listening.set()

    def wait_listening(self, timeout):
        self._listening.wait(timeout)
        return self.port

    def request(self, method, path, body=None, expect=(200, 204)):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Authorization": self.auth, "Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        except OSError as exc:
            raise RunnerError(f"{method} {path} failed: {exc}") from exc
        finally:
            conn.close()
        if resp.status not in expect:
            text = payload.decode("utf-8", "replace")[:500]
            raise RunnerError(f"{method} {path} answered {resp.status}: {text}")
        return json.loads(payload) if payload.strip() else None

    def stop(self):
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def read_events(server, events, connected):
    """Feed ``/event`` into ``events`` as parsed objects; reconnect while the server lives."""
    attempts = 0
    while server.proc.poll() is None and attempts <= MAX_RECONNECTS:
        attempts += 1
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=CONNECT_TIMEOUT_S)
        try:
            conn.request(
                "GET", "/event", headers={"Authorization": server.auth, "Accept": "text/event-stream"}
            )
            resp = conn.getresponse()
            if resp.status != 200:
                raise RunnerError(f"GET /event answered {resp.status}")
            conn.sock.settimeout(None)  # a quiet session is not a broken stream
            data = []
            for raw in iter(resp.readline, b""):
                line = raw.rstrip(b"\r\n")
                if line.startswith(b"data:"):
                    data.append(line[5:].lstrip())
                elif not line and data:
                    try:
                        event = json.loads(b"\n".join(data))
                    except ValueError:
                        event = None
                    data = []
                    if isinstance(event, dict):
                        if event.get("type") == "server.connected":
                            connected.set()
                        events.put(event)
            events.put({"type": "runner.stream_ended", "properties": {"attempt": attempts}})
        except (OSError, RunnerError, http.client.HTTPException) as exc:
            events.put(
                {"type": "runner.stream_error", "properties": {"attempt": attempts, "error": str(exc)}}
            )
            time.sleep(0.5)
        finally:
            conn.close()
    events.put(None)


def connect(server):
    """The server's event stream as a queue, once it is connected (None: it did not connect)."""
    events: queue.Queue[dict | None] = queue.Queue()
    connected = threading.Event()
    threading.Thread(target=read_events, args=(server, events, connected), daemon=True).start()
    if not connected.wait(CONNECT_TIMEOUT_S):
        sys.stderr.write("opencode-tui runner: the server's event stream did not connect\n")
        return None
    return events


def open_session(server):
    session = server.request("POST", "/session", {"permission": SESSION_PERMISSIONS})
    sid = session["id"]
    note("session", sessionID=sid)
    publish_control(server, sid)
    return sid


def drive(server, events, sid, prompt):
    """Send the prompt and run the session to its end; the exit status."""
    ours = {sid}
    server.request("POST", f"/session/{sid}/prompt_async", {"parts": [{"type": "text", "text": prompt}]})
    note("prompt_sent", sessionID=sid, chars=len(prompt))
    errors = 0
    started = False
    last_running: dict[str, str] = {}
    quiet_since = time.monotonic()
    while True:
        try:
            event = events.get(timeout=1.0)
        except queue.Empty:
            sys.stdout.buffer.flush()
            if server.proc.poll() is not None:
                return None
            if started and time.monotonic() - quiet_since >= STATUS_POLL_S:
                # A safety net for an idle event lost with a dropped stream: ask the server.
                quiet_since = time.monotonic()
                busy = server.request("GET", "/session/status") or {}
                if (busy.get(sid) or {}).get("type", "idle") == "idle":
                    note("idle_by_status", sessionID=sid)
                    return 1 if errors else 0
            continue
        quiet_since = time.monotonic()
        if event is None:
            return None if server.proc.poll() is not None else 1
        etype = str(event.get("type", ""))
        props = v if isinstance(v := event.get("properties"), dict) else {}
        if etype == "session.created":
            info = props.get("info") or {}
            if info.get("parentID") in ours:
                ours.add(info.get("id"))
        owner = session_of(event)
        if etype.startswith("runner."):
            out(event)
        elif owner in ours and etype.startswith(FORWARDED_PREFIXES) and not repeated(event, last_running):
            out(event)
        else:
            continue
        if etype == "permission.asked":
            # Nobody can answer: reject, as ``opencode run`` does without its skip flag.
            server.request("POST", f"/permission/{props.get('id')}/reply", {"reply": "reject"})
            # What was asked for, so the engine can name it in the failure: the permission, its path
            # patterns (e.g. ``/etc/*`` for ``external_directory``), the tool call and the session.
            tool = v if isinstance(v := props.get("tool"), dict) else {}
            note(
                "permission_rejected",
                id=props.get("id"),
                permission=props.get("permission"),
                patterns=props.get("patterns") if isinstance(props.get("patterns"), list) else [],
                metadata=props.get("metadata") if isinstance(props.get("metadata"), dict) else {},
                callID=tool.get("callID"),
                sessionID=owner,
            )
        elif etype == "question.asked":
            server.request("POST", f"/question/{props.get('id')}/reject", {})
            note("question_rejected", id=props.get("id"))
        elif etype == "session.error" and owner == sid:
            errors += 1
        elif etype == "session.status" and owner == sid:
            status = (props.get("status") or {}).get("type")
            if status == "busy":
                started = True
            elif status == "idle" and (started or errors):
                sys.stdout.buffer.flush()
                return 1 if errors else 0
        if events.empty():
            sys.stdout.buffer.flush()


HERE = os.path.dirname(os.path.abspath(__file__))
CONTROL_FILE = os.path.join(HERE, "control.json")
# Started ahead of its task (issue 31): the prompt arrives in PROMPT_FILE, and GO_FILE (written after it
# in the same upload, so the prompt is complete once it exists) says the task is there. The supervisor
# starts the run deadline on the same file.
AHEAD = "--ahead"
# Also connect to the event stream and open the session ahead: OpenCode then settles the project of
# its working directory before the task's files arrive, so only for tasks whose files hold no repository.
AHEAD_SESSION = "--ahead-session"
PROMPT_NAME = "prompt.txt"
GO_NAME = "go"
PROMPT_FILE = os.path.join(HERE, PROMPT_NAME)
GO_FILE = os.path.join(HERE, GO_NAME)
GO_POLL_S = 0.01  # about 0.5% of a core while it waits; the task waits 5 ms on average
# The task handed over through the relay (opencode_tui_core.episode.handoff): with the episode's token, GET the task
# (a JSON line, then the task files as a tar), unpack and check it, POST the check's result; the answer
# is the prompt's files as a tar (PROMPT_NAME, GO_NAME) once the agent phase starts.
HANDOFF_PREFIX = "/opencode-tui/"
HANDOFF_TASK_PATH = HANDOFF_PREFIX + "task"
HANDOFF_STAGED_PATH = HANDOFF_PREFIX + "staged"
HANDOFF_TOKEN_ENV = "OPENCODE_TUI_HANDOFF_TOKEN"
HANDOFF_RETRY_S = 0.5  # the model socket is not served yet (or no more): ask again
CHECK_TIMEOUT_S = 60.0


def wait_for_task(started):
    """Ahead of the task: say the server is ready, then wait for the task's prompt (the supervisor
    caps the wait); the prompt. With a relay and a token, the task comes through the relay (its files
    unpacked here, as the sandbox user); without, somebody else uploads it and writes GO_FILE."""
    note("ready", seconds=round(time.monotonic() - started, 3))
    sys.stdout.buffer.flush()
    ready = time.monotonic()
    relay_port, token = os.environ.get(RELAY_PORT_ENV), os.environ.get(HANDOFF_TOKEN_ENV)
    if relay_port and token:
        receive_task(int(relay_port), token)
    while not os.path.exists(GO_FILE):
        time.sleep(GO_POLL_S)
    with open(PROMPT_FILE, "rb") as f:
        prompt = f.read().decode("utf-8", "replace")
    note("task", chars=len(prompt), waited=round(time.monotonic() - ready, 3))
    return prompt


def receive_task(port, token):
    """Take the task through the relay: its files into the workdir, the access check's result back,
    then the prompt's files into this directory (GO_FILE last). Returns once they are here; exits
    (status 3) when the episode withdrew the task or the line broke after the task was taken."""
    headers = {"Authorization": "Bearer " + token}
    failures = 0
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=None)  # held until the task comes
        try:
            conn.request("GET", HANDOFF_TASK_PATH, headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise RunnerError(f"GET {HANDOFF_TASK_PATH} answered {resp.status}")
            head = json.loads(resp.readline())
            report = stage_task(head, resp)
            break
        except (OSError, ValueError, RunnerError, http.client.HTTPException) as exc:
            failures += 1
            if failures == 1:
                note("handoff_retry", error=str(exc))
            time.sleep(HANDOFF_RETRY_S)
        finally:
            conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=None)  # held until the agent phase
    try:
        body = json.dumps(report).encode()
        conn.request(
            "POST", HANDOFF_STAGED_PATH, body=body, headers={**headers, "Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        if resp.status != 200:
            sys.stderr.write(f"opencode-tui runner: the task was withdrawn ({resp.status})\n")
            sys.exit(3)
        unpack(resp, HERE)
    except (OSError, tarfile.TarError, http.client.HTTPException) as exc:
        sys.stderr.write(f"opencode-tui runner: the prompt did not arrive: {exc}\n")
        sys.exit(3)
    finally:
        conn.close()


def stage_task(head, stream):
    """Unpack the task files into the workdir and run the access check there: the report."""
    workdir = head["workdir"]
    try:
        unpack(stream, workdir)
    except (OSError, tarfile.TarError) as exc:
        return {"error": f"unpacking the task files into {workdir} failed: {exc}"}
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", head["check"], "sh", workdir, head["socket"]],
            input=head["listing"].encode(),
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"the access check did not run: {exc}"}
    text = {"encoding": "utf-8", "errors": "replace"}
    return {
        "exit_code": done.returncode,
        "stdout": done.stdout.decode(**text),
        "stderr": done.stderr.decode(**text),
    }


def unpack(stream, where):
    """A tar (made by the engine: trusted, modes kept as given) read from ``stream`` into ``where``."""
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        if hasattr(tarfile, "fully_trusted_filter"):
            tar.extractall(where, filter="fully_trusted")
        else:
            tar.extractall(where)


def publish_control(server, sid):
    """Where the live session can be reached, for ``--control`` (owner only)."""
    tmp = CONTROL_FILE + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"port": server.port, "auth": server.auth, "session": sid, "pid": os.getpid()}, f)
    os.replace(tmp, CONTROL_FILE)


def control(action):
    """``--control say|abort``: act on the live session through its server; the exit status."""
    try:
        with open(CONTROL_FILE) as f:
            where = json.load(f)
        os.kill(int(where["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        sys.stderr.write("no live OpenCode session in this sandbox\n")
        return 4
    server = Server.__new__(Server)
    server.port, server.auth = where["port"], where["auth"]
    sid = where["session"]
    try:
        if action == "say":
            text = sys.stdin.buffer.read().decode("utf-8", "replace")
            server.request(
                "POST", f"/session/{sid}/prompt_async", {"parts": [{"type": "text", "text": text}]}
            )
        elif action == "abort":
            server.request("POST", f"/session/{sid}/abort", {})
        else:
            sys.stderr.write(f"unknown control action {action!r}\n")
            return 2
    except RunnerError as exc:
        if action == "abort" and session_ended(where, ABORT_SETTLE_S):
            return 0  # the turn ended and the runner stopped its server before the server answered
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0


ABORT_SETTLE_S = 5.0


def session_ended(where, timeout):
    """True once the runner that published ``where`` is gone or has withdrawn its control file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(int(where["pid"]), 0)
        except OSError:
            return True
        if not os.path.exists(CONTROL_FILE):
            return True
        time.sleep(0.1)
    return False


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--control":
        return control(sys.argv[2])
    ahead = len(sys.argv) == 3 and sys.argv[1] in (AHEAD, AHEAD_SESSION)
    if len(sys.argv) != 2 and not ahead:
        sys.stderr.write(f"usage: serve_runner.py [{AHEAD}|{AHEAD_SESSION}] OPENCODE_BINARY < prompt\n")
        return 2
    ahead_session = ahead and sys.argv[1] == AHEAD_SESSION
    # Ahead of its task, the prompt comes later in a file (``wait_for_task``), not on stdin.
    prompt = None if ahead else sys.stdin.buffer.read().decode("utf-8", "replace")
    started = time.monotonic()
    note("starting", binary=sys.argv[-1], ahead=ahead)
    server = Server(sys.argv[-1])

    def on_term(signum, frame):
        server.stop()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        if server.wait_listening(LISTEN_TIMEOUT_S) is None:
            code = server.proc.poll()
            why = f"exited with {code}" if code is not None else f"did not listen in {LISTEN_TIMEOUT_S:g}s"
            sys.stderr.write(f"opencode-tui runner: `opencode serve` {why}\n")
            return 3 if code is None else exit_status(code)
        note("listening", port=server.port, seconds=round(time.monotonic() - started, 3))
        relay_port = os.environ.get(RELAY_PORT_ENV)
        if relay_port and not wait_for_port(int(relay_port), RELAY_TIMEOUT_S):
            sys.stderr.write("opencode-tui: the model relay did not start\n")
            return 3
        try:
            if ahead and not ahead_session:
                # OpenCode decides the project of its working directory (a git repository or not)
                # on the first request there, the event stream included: only once the files are in.
                prompt = wait_for_task(started)
            events = connect(server)
            if events is None:
                return 3
            sid = open_session(server)
            if prompt is None:
                prompt = wait_for_task(started)
            status = drive(server, events, sid, prompt)
        except RunnerError as exc:
            note("error", message=str(exc))
            status = 1
        if status is None:  # the server died under the session
            code = server.proc.wait()
            note("server_exited", returncode=code)
            return exit_status(code) or 1
        return status
    finally:
        server.stop()
        try:
            os.unlink(CONTROL_FILE)
        except OSError:
            pass
        sys.stdout.buffer.flush()


def wait_for_port(port, timeout):
    """True once something accepts on 127.0.0.1:port, False after ``timeout`` seconds."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def exit_status(code):
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
