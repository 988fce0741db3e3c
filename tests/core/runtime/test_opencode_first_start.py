"""What OpenCode is spared at each start: its first-run state (opencode_tui_core.runtime.first_run), the migrated, empty
database built once per cached binary by the in-sandbox builder and staged into each episode's data
directory, so OpenCode skips its migrations; and its compiled-in models.dev catalogue, replaced by an empty
one (opencode_tui_core.runtime.opencode.MODELS_PATH_ENV) since the config defines our provider in full.

Real parts: the builder program (core/inside/first_run.py) run from its file on this host with the real
pinned OpenCode binary from the installer cache (skipped when it is not cached yet), a failing binary
(/bin/false), a real hello-file episode on each provider whose collected database shows the staged
migrations were kept (their completion times are the cached file's, not the episode's), and the real
binary's `opencode models` under the harness's environment.
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

from opencode_tui_core.failures import Outcome
from opencode_tui_core.inside import INSIDE_DIR
from opencode_tui_core.runtime import first_run
from opencode_tui_core.runtime.opencode import OPENCODE_ENV
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


@pytest.mark.slow
def test_the_harness_gives_opencode_a_catalogue_with_our_provider_only(tmp_path: Path) -> None:
    """With the harness's environment and staged files, the real binary knows the configured model and
    nothing from its compiled-in models.dev snapshot (which it would otherwise build at the first
    prompt): `opencode models` lists ours alone."""
    import shutil
    from types import SimpleNamespace

    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.runtime.opencode import OpenCodeHarness
    from opencode_tui_core.tasks import load_task
    from tests.core.runtime.conftest import SAMPLES

    binary = _cached_binary()
    endpoint = SimpleNamespace(tcp_url="http://127.0.0.1:9", unix_path=None)
    config = AgentConfig.model_validate({"sandbox": {"provider": "local", "network": "host"}})
    harness = OpenCodeHarness(f"catalogue-{os.getpid()}", load_task(SAMPLES / "hello-file"), config, endpoint)
    root = Path(harness.layout.session_dir)
    try:
        for rel, (data, mode) in harness.staged_files().items():
            path = root / rel
            if data is None:
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                path.chmod(mode)
        _argv, env = harness.command(SimpleNamespace(python=sys.executable, binary=str(binary)))
        r = subprocess.run(
            [str(binary), "models"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert r.returncode == 0, r.stderr[-1000:]
    assert r.stdout.split() == [f"opencode-tui/{config.model.name}"]


async def test_a_short_install_budget_skips_the_build_with_a_warning(tmp_path: Path) -> None:
    """Best effort never spends the install phase's budget: with 5 s left nothing is started (the
    sandbox is never asked, hence None here) and the episode is told OpenCode migrates by itself."""
    from types import SimpleNamespace

    from opencode_tui_core.events import Warning_

    binary = tmp_path / "opencode"
    binary.write_bytes(b"")
    seen: list[object] = []
    got = await first_run.ensure(
        None,  # type: ignore[arg-type]
        python="python3",
        binary="/opt/opencode",
        installed=SimpleNamespace(path=binary, sha256="ef" * 32),
        env={},
        emit=seen.append,
        budget_s=5.0,
    )
    assert got == []
    assert [w.code for w in seen if isinstance(w, Warning_)] == ["opencode_first_run_state"]
