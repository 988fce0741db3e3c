"""OpenCode's first-run state: its database, migrated and empty, built once per cached binary and
staged into every episode's data directory.

Every episode starts OpenCode on an empty data directory (its XDG dirs live in the session directory).
On an empty directory OpenCode creates its database and applies every migration before it listens:
measured on 1.18.32 (hello-file, serve harness, host), about 0.5 CPU-s on its main thread, the path to
the first model call, and 0.7 CPU-s in all, in every episode. The database it leaves holds nothing but
the migration records, so the one the same binary builds once (core/inside/first_run.py, run in a
sandbox the binary was placed in) is staged instead: OpenCode finds every migration applied.

The state is kept in the installer's cache beside the binary, keyed by the binary's sha256, so a new
binary (a new pin, a re-fetched file) builds its own. Best effort throughout: when it cannot be built
or read, the episode goes on and OpenCode migrates by itself (a warning says so).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opencode_tui_core.events import Event, Warning_
from opencode_tui_core.inside import INSIDE_DIR
from opencode_tui_core.sandbox.base import Sandbox, SandboxError, describe_exit

BUILDER_SOURCE = INSIDE_DIR / "first_run.py"
BUILD_TIMEOUT_S = 60.0
# Never started with less than this (1.18.32 needs ~2 s of a loaded machine); the exec's own deadline
# exceeds the builder's by the slack, so the builder reports a timeout itself.
BUILD_MIN_S = 10.0
BUILD_SLACK_S = 5.0
# A database beyond this is not the empty one (1.18.32's is 250 KB): not cached, not staged.
MAX_BYTES = 16 * 1024 * 1024
SQLITE_MAGIC = b"SQLite format 3\x00"


def state_dir(binary: Path, sha256: str) -> Path:
    """Where the state of this exact binary is kept: beside it, named by its digest."""
    return Path(binary).parent / f"first-run-{sha256[:16]}"


def _valid(path: Path) -> bool:
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return False
        with path.open("rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def cached_files(binary: Path, sha256: str) -> list[Path]:
    """The state's files when a complete one is cached (every file a database), else []."""
    d = state_dir(binary, sha256)
    try:
        files = sorted(p for p in d.iterdir() if p.name.endswith(".db"))
    except OSError:
        return []
    return files if files and all(_valid(p) for p in files) else []


def _store(binary: Path, sha256: str, files: dict[str, bytes]) -> list[Path]:
    """Write the state atomically (a temporary directory renamed into place); two episodes building
    at once keep the first one's."""
    final = state_dir(binary, sha256)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        try:
            os.rename(tmp, final)
        except OSError:
            if not cached_files(binary, sha256):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cached_files(binary, sha256)


def _decode(stdout: bytes) -> dict[str, bytes]:
    """The builder's JSON (name → base64), checked: plain ``*.db`` names, SQLite files, bounded size."""
    data = json.loads(stdout.decode("utf-8"))
    if not isinstance(data, dict) or not data:
        raise ValueError("no database in the builder's answer")
    out: dict[str, bytes] = {}
    for name, text in data.items():
        if not isinstance(name, str) or "/" in name or name.startswith(".") or not name.endswith(".db"):
            raise ValueError(f"unexpected file name {name!r}")
        content = base64.b64decode(str(text), validate=True)
        if len(content) > MAX_BYTES or not content.startswith(SQLITE_MAGIC):
            raise ValueError(f"{name} is not an empty OpenCode database")
        out[name] = content
    return out


async def ensure(
    sandbox: Sandbox,
    *,
    python: str,
    binary: str,
    installed: Any,
    env: dict[str, str],
    emit: Callable[[Event], Any],
    budget_s: float | None = None,
) -> list[str]:
    """Host paths of the state's files, building it in ``sandbox`` first when it is not cached
    (``binary``: the OpenCode binary as the sandbox sees it; ``installed``: its cache entry).
    [] when it cannot be had: OpenCode then migrates by itself. ``budget_s``: what is left of the
    install phase's budget; the build never takes it all (it is best effort, the install is not)."""
    host_binary, sha256 = Path(installed.path), str(installed.sha256)
    files = await asyncio.to_thread(cached_files, host_binary, sha256)
    if files:
        return [str(p) for p in files]
    timeout = BUILD_TIMEOUT_S if budget_s is None else min(BUILD_TIMEOUT_S, budget_s / 2)
    if timeout < BUILD_MIN_S:
        emit(_not_prepared(f"{budget_s:.0f}s of the install budget left"))
        return []
    argv = [python, "-I", "-c", BUILDER_SOURCE.read_text(), binary, json.dumps(env), f"{timeout:g}"]
    try:
        r = await sandbox.exec(argv, cwd="/tmp", timeout=timeout + BUILD_SLACK_S)
        if not r.ok:
            why = r.stderr.decode("utf-8", "replace").strip()[-300:] or describe_exit(r.exit_code, r.signal)
            raise ValueError(why)
        built = _decode(r.stdout)
        files = await asyncio.to_thread(_store, host_binary, sha256, built)
    except (SandboxError, OSError, ValueError, binascii.Error) as exc:
        emit(_not_prepared(str(exc)))
        return []
    return [str(p) for p in files]


def _not_prepared(why: str) -> Warning_:
    return Warning_(
        code="opencode_first_run_state",
        message=f"OpenCode's empty database could not be prepared ({why}); OpenCode creates it itself "
        "(a slower start)",
    )
