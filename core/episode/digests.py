"""A digest of the workspace before each agent model call (``workspace_digests.jsonl``, issue 28).

What the files were at step k is what a fork at step k must reproduce: the digest is taken while the
agent's request waits at the recording proxy (the workspace is still then: OpenCode runs no tool while
it waits for the model), as the proxy's ``CallGate`` in front of the debugger's. It is cheap: one
server process started on a terminal in the sandbox at the first call answers every digest (no
process start per call; one process per digest when the server cannot be had), and it keeps each
file's size, mtime and mode with its hash (in memory and in a state file in the session directory),
so only files that changed are read again. Paths, permission bits and contents make the digest; mtimes
do not (a re-executed step writes the same bytes at another time), nor do ``__pycache__`` directories
(their bytecode embeds the source's mtime).

Observation only: a digest that cannot be taken (a timeout, no python yet) is recorded as an error and
the call goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable

from opencode_tui_core.artifacts import RunDir, RunFiles
from opencode_tui_core.model.hold import FORWARD, CallGate, HandAnswer, HeldCall, HoldVerdict
from opencode_tui_core.sandbox.base import PtyHandle, Sandbox

DIGEST_TIMEOUT_S = 20.0
STATE_FILE = "workspace-digest.json"

# The digest itself (standard library only), shared by the one-shot script and the server below:
# ``digest(root, state_path, old) -> (line, new)``.
_DIGEST_FN = r"""
import hashlib, json, os, stat, sys
def digest(root, state, old):
    new, changed = {}, 0
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for name in sorted(files):
            p = os.path.join(d, name)
            rel = os.path.relpath(p, root)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            key = [st.st_size, st.st_mtime_ns, st.st_mode]
            prev = old.get(rel)
            if prev and prev[:3] == key:
                new[rel] = prev
                continue
            changed += 1
            if stat.S_ISLNK(st.st_mode):
                h = "link:" + os.readlink(p)
            elif not stat.S_ISREG(st.st_mode):
                h = "special"
            else:
                sha = hashlib.sha256()
                try:
                    with open(p, "rb") as f:
                        for block in iter(lambda: f.read(1 << 20), b""):
                            sha.update(block)
                    h = sha.hexdigest()
                except OSError:
                    h = "unreadable"
            new[rel] = key + [h]
    total = hashlib.sha256()
    for rel in sorted(new):
        total.update(("%s\0%o\0%s\n" % (rel, new[rel][2] & 0o7777, new[rel][3])).encode())
    if changed or len(new) != len(old):  # (a file removed changes nothing else)
        tmp = state + ".tmp"
        with open(tmp, "w") as f:
            json.dump(new, f)
        os.replace(tmp, state)
    return {"digest": total.hexdigest(), "files": len(new), "changed": changed}, new
def load(state):
    try:
        with open(state) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
"""

# One digest per run (argv = workdir, state file): the fallback when the server cannot be had.
DIGEST_SCRIPT = (
    _DIGEST_FN
    + r"""
print(json.dumps(digest(sys.argv[1], sys.argv[2], load(sys.argv[2]))[0]))
"""
)

# The digest server (argv = workdir, state file), started once on a terminal in the sandbox: each line
# read asks for a digest, each answer is one ``@@digest N {json}`` line (N: the request's number; a
# terminal echoes and rewrites line ends, so the answer is found by its mark). Its state stays in
# memory: a digest costs the walk and the hashes of the files that changed, not a process's start.
SERVER_SCRIPT = (
    _DIGEST_FN
    + r"""
import termios
try:
    attrs = termios.tcgetattr(0)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(0, termios.TCSANOW, attrs)
except (termios.error, OSError):
    pass
root, state = sys.argv[1], sys.argv[2]
old = load(state)
sys.stdout.write("@@digest 0 {}\n")
sys.stdout.flush()
for line in sys.stdin:
    n = line.strip()
    try:
        out, old = digest(root, state, old)
    except Exception as exc:
        out = {"error": "%s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write("@@digest %s %s\n" % (n, json.dumps(out)))
    sys.stdout.flush()
"""
)
SERVER_START_S = 10.0  # the server's first line (its interpreter's start) comes within this
_MARK = re.compile(rb"@@digest (\d+) (\{.*\})")


class _Server:
    """The digest server on a terminal: ``ask()`` is one digest."""

    def __init__(self, pty: PtyHandle) -> None:
        self.pty = pty
        self.asked = 0
        self._buf = b""

    @classmethod
    async def start(cls, sandbox: Sandbox, python: str, workdir: str, state: str) -> _Server:
        pty = await sandbox.pty([python, "-I", "-c", SERVER_SCRIPT, workdir, state], cwd=workdir, cols=400)
        server = cls(pty)
        try:
            await asyncio.wait_for(server._answer(0), SERVER_START_S)
        except BaseException:
            await server.close()
            raise
        return server

    async def ask(self, timeout: float) -> dict[str, object]:
        self.asked += 1
        await self.pty.write(b"%d\n" % self.asked)
        return await asyncio.wait_for(self._answer(self.asked), timeout)

    async def _answer(self, n: int) -> dict[str, object]:
        while True:
            for m in _MARK.finditer(self._buf):
                if int(m[1]) == n:
                    self._buf = self._buf[m.end() :]
                    return json.loads(m[2])
            data = await self.pty.read()
            if not data:
                tail = self._buf.decode("utf-8", "replace").strip().splitlines()
                raise RuntimeError("the digest server ended" + (f": {tail[-1]}" if tail else ""))
            self._buf = (self._buf + data)[-(1 << 20) :]

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.pty.close(), 5.0)


class DigestGate:
    """The proxy's gate when digests are recorded: digest, then the inner gate (the debugger).

    ``on_digest(step, digest or None)`` is told each one (a fork compares it with its parent's)."""

    def __init__(
        self,
        inner: CallGate | None,
        run_dir: RunDir,
        *,
        on_digest: Callable[[int, str | None], None] | None = None,
    ) -> None:
        self.inner = inner
        self.run_dir = run_dir
        self.on_digest = on_digest
        self.step = 0
        self.spent_s = 0.0  # time the digests held calls (their cost on the agent phase)
        self._target: tuple[Sandbox, str, str, str] | None = None
        self._server: _Server | None = None
        self._starting: asyncio.Future[_Server] | None = None
        self._server_error: str | None = None  # why digests are taken one process each

    def attach(self, sandbox: Sandbox, python: str, workdir: str, state_dir: str) -> None:
        """Where to take digests from (the agent phase is starting)."""
        self._target = (sandbox, python, workdir, f"{state_dir}/{STATE_FILE}")
        # The server starts while OpenCode does (it only reads its state file: no digest yet), so the
        # first call does not wait for an interpreter's start.
        self._starting = asyncio.ensure_future(_Server.start(sandbox, python, workdir, self._target[3]))

    async def _take(self) -> dict[str, object]:
        """One digest: from the server (started at the first), else one process for it."""
        sandbox, python, workdir, state = self._target  # type: ignore[misc]
        if self._starting is not None:
            starting, self._starting = self._starting, None
            try:
                self._server = await starting
            except Exception as exc:  # a provider without terminals, a slow start: one process each
                self._server_error = f"{type(exc).__name__}: {exc}"
        if self._server is not None:
            try:
                return {**await self._server.ask(DIGEST_TIMEOUT_S), "via": "server"}
            except Exception as exc:  # a server that died or hangs is not asked again
                self._server_error = f"{type(exc).__name__}: {exc}"
                server, self._server = self._server, None
                await server.close()
        result = await sandbox.exec(
            [python, "-I", "-c", DIGEST_SCRIPT, workdir, state], timeout=DIGEST_TIMEOUT_S
        )
        if result.exit_code != 0:
            words = result.stderr.decode("utf-8", "replace").strip().splitlines()
            raise RuntimeError(words[-1] if words else f"exit status {result.exit_code}")
        return {**json.loads(result.stdout.decode().strip().splitlines()[-1]), "via": "exec"}

    async def close(self) -> None:
        """The agent phase is over: the server goes (no digest is taken after)."""
        self._target = None
        if self._starting is not None:  # the agent phase ended before its first call
            starting, self._starting = self._starting, None
            starting.cancel()
            with contextlib.suppress(BaseException):
                self._server = await starting
        server, self._server = self._server, None
        if server is not None:
            await server.close()

    async def hold(self, call: HeldCall) -> HoldVerdict:
        self.step += 1
        if self._target is not None:
            await self._digest(call.call_id)
        return FORWARD if self.inner is None else await self.inner.hold(call)

    async def hold_reply(self, call: HeldCall, reply: HandAnswer) -> HoldVerdict:
        """The debugger's edit of a reply (its second hold) is the inner gate's alone."""
        return FORWARD if self.inner is None else await self.inner.hold_reply(call, reply)

    async def _digest(self, call_id: str) -> None:
        t0 = time.monotonic()
        line: dict[str, object] = {"step": self.step, "call_id": call_id}
        try:
            line.update(await self._take())
        except Exception as exc:  # observation only: the call goes on
            line["error"] = f"{type(exc).__name__}: {exc}"
        elapsed = time.monotonic() - t0
        self.spent_s += elapsed
        line["elapsed_s"] = round(elapsed, 4)
        self.run_dir.append_text(RunFiles.WORKSPACE_DIGESTS, json.dumps(line) + "\n")
        if self.on_digest is not None:
            digest = line.get("digest")
            self.on_digest(self.step, digest if isinstance(digest, str) else None)


def recorded_digests(lines: list[str]) -> dict[int, str]:
    """step → digest, from ``workspace_digests.jsonl`` lines (errors and torn lines skipped)."""
    out: dict[int, str] = {}
    for text in lines:
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if (
            isinstance(line, dict)
            and isinstance(line.get("digest"), str)
            and isinstance(line.get("step"), int)
        ):
            out.setdefault(line["step"], line["digest"])
    return out
