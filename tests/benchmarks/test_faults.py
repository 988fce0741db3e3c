"""The fault suite's rows (benchmarks/faults.py, issue 19), each a real episode with a real fault.

Every row runs the real CLI on a real provider (Docker or bubblewrap) with the real OpenCode binary
and the scripted model, and injects the fault for real: a private Docker daemon of the suite (its own
socket, data-root and exec-root; the shared daemon is never touched) stopped mid-agent and started
again; the local keeper SIGKILLed from outside; a 600 KB tmpfs as the runs directory; wrong bytes
in a copy of the OpenCode cache with a loopback npm mirror serving the genuine package; a closed
loopback port as the registry. Each row must end honest (its documented outcome, failure kind, exit
code and cleanup proof, no traceback, no reward), with 0 leaked sandboxes and 0 lost artifacts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("faults_bench", ROOT / "benchmarks" / "faults.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["faults_bench"] = module
    spec.loader.exec_module(module)
    return module


F = _load()


def _docker_ready() -> bool:
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        return False
    r = subprocess.run(["docker", "image", "inspect", F.IMAGE], capture_output=True, check=False)
    return r.returncode == 0


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    s = F.Suite(tmp_path_factory.mktemp("faults"))
    yield s
    s.close()


def _row(suite: Any, name: str, provider: str) -> Any:
    if provider == "docker" and not _docker_ready():
        pytest.skip("needs root, dockerd and the base image (scripts/start-dockerd, scripts/build-images)")
    if provider == "local" and shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    [fault] = [f for f in F.FAULTS if f.name == name]
    row = suite.run_row(fault, provider)
    print(F.table([row]))
    return row


QUICK = [(f.name, p) for f, p in F.selected(quick=True, only=None)]


@pytest.mark.parametrize(("name", "provider"), QUICK, ids=[f"{n}-{p}" for n, p in QUICK])
def test_quick_row_holds(suite: Any, name: str, provider: str) -> None:
    """The rows ``--quick`` prints: each holds its expectation (outcome, kind, exit, proof), with no
    traceback, no leaked sandbox and no lost artifact."""
    row = _row(suite, name, provider)
    seen = f"row {name}/{provider}:\n{F.table([row])}"  # which row, and what it saw
    assert row.problems == [] and row.ok, seen
    assert (row.leaked, row.lost) == (0, 0), seen
    expect = next(f for f in F.FAULTS if f.name == name).expect
    if expect is None:  # controller-kill: judged by the next run's report (see _kill_after)
        assert (row.outcome, row.kind) == ("keep_unknown", "run_interrupted"), seen
        return
    assert (row.outcome, row.exit_code) == (expect.outcome, expect.exit_code), seen
    assert row.kind in expect.kinds, seen
    if row.kind is not None:
        assert row.outcome != "scored", seen


def test_engine_restart_mid_agent_is_recorded_and_proven_by_the_dead_container(suite: Any) -> None:
    """The issue's reproduction: dockerd stopped a few seconds into sample_tasks/timeout, started
    again 3 s later. The record names the engine, the proof is the container found exited, the
    container is removed once the engine answers, and the policy would retry it."""
    if not _docker_ready():
        pytest.skip("needs root, dockerd and the base image")
    [fault] = [f for f in F.FAULTS if f.name == "engine-lost"]
    captured: dict[str, Any] = {}
    original = fault.after

    def keep_record(ctx: Any, row: Any, result: dict[str, Any]) -> None:
        run_dir = Path(result["run_dir"])
        captured["events"] = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
        captured["run"] = json.loads((run_dir / "run.json").read_text())
        captured["host"] = ctx.env["DOCKER_HOST"]
        captured["owner"] = ctx.owner

    fault.after = keep_record
    try:
        row = suite.run_row(fault, "docker")
    finally:
        fault.after = original
    print(F.table([row]))
    assert row.ok, row.problems
    assert (row.kind, row.cleanup, row.exit_code, row.policy) == (
        "sandbox_engine_lost",
        "found_dead",
        3,
        "retry",
    )
    failure = next(
        e["failure"]
        for e in captured["events"]
        if e["type"] == "failure" and e["failure"]["kind"] == "sandbox_engine_lost"
    )
    assert failure["stage"] == "agent"
    assert "docker engine went away" in failure["message"] or "the engine restarted" in failure["message"]
    sources = {e["source"] for e in failure["evidence"]}
    assert "docker.state" in sources  # the container as the engine reports it: exited
    [state] = [e for e in failure["evidence"] if e["source"] == "docker.state"]
    assert state["data"]["Status"] == "exited" and state["data"]["Running"] is False
    released = [e for e in captured["events"] if e["type"] == "cleanup" and e["step"] == "sandbox_released"]
    assert released and released[-1]["state"] == "ok"
    assert captured["run"]["counts"]["cleanup_proof"] == "found_dead"
    assert captured["run"]["outcome"]["failure_kind"] == "sandbox_engine_lost"
    # Removed from the engine that came back (the suite counted 0 leftovers on that daemon too).
    assert F.docker_leftovers(captured["owner"], captured["host"]) == []


def test_local_keeper_killed_from_outside(suite: Any) -> None:
    """The keeper (the sandbox's pid 1) SIGKILLed from outside: every process in its namespace died,
    which is the proof; the failure says so."""
    row = _row(suite, "engine-lost", "local")
    assert row.ok, row.problems
    assert (row.kind, row.cleanup, row.exit_code, row.policy) == (
        "sandbox_engine_lost",
        "found_dead",
        3,
        "retry",
    )


def test_a_failed_row_says_which_row_and_what_it_saw() -> None:
    """The suite's last lines name every row that did not hold with what it saw, so a CI log alone
    tells which fault flaked (the table above them may be cut short)."""
    held = F.Row("model-500", "local", ok=True)
    saw = "expected (...), got (...); phases seed > install > agent; failures sandbox_lost@agent"
    broke = F.Row("engine-lost", "local", problems=[saw])
    assert F.failed_lines([held, broke]) == [f"faults: FAILED engine-lost/local: {saw}"]
    assert f"engine-lost/local: {saw}" in F.table([held, broke])


def test_only_a_traceback_of_the_cli_fails_a_row() -> None:
    """A quoted "Traceback" (a command's output inside a failure's message) is not a crash; a real one
    is summarized by the line before it and the exception it ends with."""
    quoted = 'opencode-tui: fix-bug: verifier said "Traceback (most recent call last): ... AssertionError"\n'
    assert F._traceback_header(quoted) is None
    crashed = (
        "opencode-tui: closing the sandbox\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "OSError: [Errno 28] No space left on device\n"
    )
    assert F._traceback_header(crashed) == 1
    assert F._traceback_summary(crashed) == (
        "opencode-tui: closing the sandbox → OSError: [Errno 28] No space left on device"
    )
