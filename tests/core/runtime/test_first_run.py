"""OpenCode's first-run state (core.runtime.first_run): its migrated, empty database, built once per cached
binary by the in-sandbox builder and staged into each episode's data directory, so OpenCode skips its
migrations.

Real parts: the builder program (core/inside/first_run.py) run from its file on this host with the real
pinned OpenCode binary from the installer cache (skipped when it is not cached yet), a failing binary
(/bin/false), and a real hello-file episode on each provider whose collected database shows the staged
migrations were kept (their completion times are the cached file's, not the episode's).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from core.failures import Outcome
from core.inside import INSIDE_DIR
from core.runtime import first_run
from core.runtime.opencode import OPENCODE_ENV
from tests.core.runtime.test_serve_runner_relay import _cached_binary

BUILDER = INSIDE_DIR / "first_run.py"


def _build(binary: str, tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-I", str(BUILDER), binary, json.dumps(OPENCODE_ENV), "60"]
    return subprocess.run(argv, capture_output=True, env=env, timeout=120)


def _migrations(db: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(db) as c:
        return sorted(c.execute("SELECT id, time_completed FROM migration").fetchall())


@pytest.mark.slow
def test_the_builder_returns_a_migrated_empty_database_and_leaves_nothing(tmp_path: Path) -> None:
    r = _build(str(_cached_binary()), tmp_path)
    assert r.returncode == 0, r.stderr[-1000:]
    files = first_run._decode(r.stdout)
    assert list(files) == ["opencode.db"]
    db = tmp_path / "state.db"
    db.write_bytes(files["opencode.db"])
    assert len(_migrations(db)) > 10
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT count(*) FROM session").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM project").fetchone() == (0,)
    assert not list(tmp_path.glob(".opencode-tui-first-run-*"))  # its working directory is gone


def test_a_failing_binary_is_an_error_with_its_status_and_leaves_nothing(tmp_path: Path) -> None:
    r = _build("/bin/false", tmp_path)
    assert r.returncode == 1
    assert b"opencode db exited with 1" in r.stderr and r.stdout == b""
    assert not list(tmp_path.glob(".opencode-tui-first-run-*"))


@pytest.mark.parametrize(
    "answer",
    [
        {"../opencode.db": "U1FMaXRlIGZvcm1hdCAzAA=="},
        {"opencode.db": "bm90IGEgZGF0YWJhc2U="},  # "not a database"
        {},
    ],
)
def test_an_answer_that_is_not_a_plain_database_is_refused(answer: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        first_run._decode(json.dumps(answer).encode())


def test_a_cached_state_with_a_damaged_file_is_not_used(tmp_path: Path) -> None:
    binary = tmp_path / "opencode"
    binary.write_bytes(b"")
    stored = first_run._store(binary, "ab" * 32, {"opencode.db": first_run.SQLITE_MAGIC + b"rest"})
    assert [p.name for p in stored] == ["opencode.db"]
    assert first_run.cached_files(binary, "ab" * 32) == stored
    stored[0].write_bytes(b"truncated")
    assert first_run.cached_files(binary, "ab" * 32) == []
    assert first_run.cached_files(binary, "cd" * 32) == []  # another binary: its own state


@pytest.mark.slow
def test_an_episode_starts_opencode_on_the_staged_database(episode_provider, task_copy, episode_on) -> None:
    """OpenCode kept the staged migration records (a database it migrated itself would carry this
    episode's completion times), and the episode is the same scored one. The state is built by the
    install phase when it is not cached yet, so one episode shows it either way."""
    ep = episode_on(task_copy(), sandbox={"provider": episode_provider})
    result = asyncio.run(ep.run())
    assert result.action is Outcome.SCORED and result.reward == 1.0, result.summary
    staged = ep.installed.runtime.first_run_files
    assert [Path(p).name for p in staged] == ["opencode.db"]
    collected = Path(result.run_dir) / "opencode" / "data" / "opencode" / "opencode.db"
    assert _migrations(collected) == _migrations(Path(staged[0]))
