"""Workspace digests (issue 28) in a real bubblewrap sandbox: the digest server answers what the
one-shot script would (a parent recorded either way matches its child), only changed files are read,
a server that dies is replaced by one process per digest, and none is left after ``close``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunDir, RunFiles
from opencode_tui_core.episode.digests import DIGEST_SCRIPT, DigestGate
from opencode_tui_core.model.hold import HeldCall
from opencode_tui_core.sandbox.base import SandboxError, SandboxSpec

pytestmark = pytest.mark.bwrap
WORK, STATE = "/tmp/dg-work", "/tmp/dg-state"


@pytest.fixture
async def sandbox(tmp_path: Path):
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    provider = LocalProvider(base_dir=tmp_path / "state")
    try:
        await provider.check()
    except SandboxError as exc:
        pytest.skip(f"bubblewrap cannot run here: {exc}")
    sb = await provider.create(SandboxSpec(run_id="test-workspace-digests"))
    try:
        await _sh(
            sb,
            f"mkdir -p {WORK}/pkg/__pycache__ {STATE} && echo a > {WORK}/a.txt && echo b > {WORK}/pkg/b.py",
        )
        yield sb
    finally:
        await sb.release()


async def _sh(sb, command: str) -> str:
    result = await sb.exec(["sh", "-c", command], timeout=30)
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


async def _one_shot(sb) -> str:
    """The digest as one process computes it, from scratch (its own state file)."""
    out = await sb.exec(["python3", "-I", "-c", DIGEST_SCRIPT, WORK, "/tmp/dg-oneshot.json"], timeout=30)
    assert out.exit_code == 0, out.stderr
    return json.loads(out.stdout)["digest"]


def _lines(run: RunDir) -> list[dict]:
    return [json.loads(ln) for ln in (run.path / RunFiles.WORKSPACE_DIGESTS).read_text().splitlines()]


async def _servers(sb) -> int:
    # the server's argv holds its script; this pattern is not in the pgrep's own sh -c line as is
    out = await sb.exec(["sh", "-c", "pgrep -fc '@@[d]igest' || true"], timeout=30)
    return int(out.stdout.decode().strip() or 0)


async def test_the_server_digests_as_the_script_does_and_reads_only_what_changed(sandbox, tmp_path):
    run = RunDir.create(tmp_path / "runs", "r1")
    seen: list[tuple[int, str | None]] = []
    gate = DigestGate(None, run, on_digest=lambda step, d: seen.append((step, d)))
    gate.attach(sandbox, "python3", WORK, STATE)
    await gate.hold(HeldCall(call_id="c1", kind="agent"))
    first = await _one_shot(sandbox)
    await _sh(sandbox, f"echo changed > {WORK}/a.txt && echo junk > {WORK}/pkg/__pycache__/b.pyc")
    await gate.hold(HeldCall(call_id="c2", kind="agent"))
    second = await _one_shot(sandbox)
    await _sh(sandbox, f"rm {WORK}/pkg/b.py")
    await gate.hold(HeldCall(call_id="c3", kind="agent"))
    third = await _one_shot(sandbox)
    lines = _lines(run)
    assert [ln.get("via") for ln in lines] == ["server"] * 3, lines
    assert [ln["digest"] for ln in lines] == [first, second, third]
    assert len({first, second, third}) == 3
    # the first reads both files; then only a.txt changed (__pycache__ is left out); then one is gone
    assert [(ln["files"], ln["changed"]) for ln in lines] == [(2, 2), (2, 1), (1, 0)]
    assert seen == [(1, first), (2, second), (3, third)]
    assert await _servers(sandbox) == 1
    await gate.close()
    assert await _servers(sandbox) == 0


async def test_a_dead_server_is_replaced_by_one_process_per_digest(sandbox, tmp_path):
    run = RunDir.create(tmp_path / "runs", "r2")
    gate = DigestGate(None, run)
    gate.attach(sandbox, "python3", WORK, STATE)
    await gate.hold(HeldCall(call_id="c1", kind="agent"))
    await _sh(sandbox, "pkill -f '@@[d]igest'")
    await _sh(sandbox, f"echo more > {WORK}/c.txt")
    await gate.hold(HeldCall(call_id="c2", kind="agent"))
    await gate.hold(HeldCall(call_id="c3", kind="agent"))
    lines = _lines(run)
    assert [ln.get("via") for ln in lines] == ["server", "exec", "exec"], lines
    assert lines[1]["digest"] == lines[2]["digest"] == await _one_shot(sandbox)
    assert lines[2]["changed"] == 0  # the state file the server kept: only changes are read again
    await gate.close()
    assert await _servers(sandbox) == 0
