"""A digest of the workspace before each agent model call (``workspace_digests.jsonl``, issue 28).

What the files were at step k is what a fork at step k must reproduce: the digest is taken while the
agent's request waits at the recording proxy (the workspace is still then: OpenCode runs no tool while
it waits for the model), as the proxy's ``CallGate`` in front of the debugger's. It is cheap after the
first call: a state file in the session directory keeps each file's size, mtime and mode with its hash,
so only files that changed are read again. Paths, permission bits and contents make the digest; mtimes
do not (a re-executed step writes the same bytes at another time), nor do ``__pycache__`` directories
(their bytecode embeds the source's mtime).

Observation only: a digest that cannot be taken (a timeout, no python yet) is recorded as an error and
the call goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from core.artifacts import RunDir, RunFiles
from core.model.hold import FORWARD, CallGate, HandAnswer, HeldCall, HoldVerdict
from core.sandbox.base import Sandbox

DIGEST_TIMEOUT_S = 20.0
STATE_FILE = "workspace-digest.json"

# Runs on the sandbox's interpreter (standard library only): argv = workdir, state file.
DIGEST_SCRIPT = r"""
import hashlib, json, os, stat, sys
root, state = sys.argv[1], sys.argv[2]
try:
    with open(state) as f:
        old = json.load(f)
except (OSError, ValueError):
    old = {}
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
tmp = state + ".tmp"
with open(tmp, "w") as f:
    json.dump(new, f)
os.replace(tmp, state)
print(json.dumps({"digest": total.hexdigest(), "files": len(new), "changed": changed}))
"""


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

    def attach(self, sandbox: Sandbox, python: str, workdir: str, state_dir: str) -> None:
        """Where to take digests from (the agent phase is starting)."""
        self._target = (sandbox, python, workdir, f"{state_dir}/{STATE_FILE}")

    async def hold(self, call: HeldCall) -> HoldVerdict:
        self.step += 1
        if self._target is not None:
            await self._digest(call.call_id)
        return FORWARD if self.inner is None else await self.inner.hold(call)

    async def hold_reply(self, call: HeldCall, reply: HandAnswer) -> HoldVerdict:
        """The debugger's edit of a reply (its second hold) is the inner gate's alone."""
        return FORWARD if self.inner is None else await self.inner.hold_reply(call, reply)

    async def _digest(self, call_id: str) -> None:
        sandbox, python, workdir, state = self._target  # type: ignore[misc]
        t0 = time.monotonic()
        line: dict[str, object] = {"step": self.step, "call_id": call_id}
        try:
            result = await sandbox.exec(
                [python, "-I", "-c", DIGEST_SCRIPT, workdir, state], timeout=DIGEST_TIMEOUT_S
            )
            if result.exit_code == 0:
                line.update(json.loads(result.stdout.decode().strip().splitlines()[-1]))
            else:
                words = result.stderr.decode("utf-8", "replace").strip().splitlines()
                line["error"] = words[-1] if words else f"exit status {result.exit_code}"
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
