"""Sandboxes whose user is not root (issue 17), end to end: the real OpenCode binary, the scripted model,
real Docker with the non-root image (``opencode-tui/nonroot:bookworm``: USER agent, uid 1000, WORKDIR
/app, /app root-owned) and real bubblewrap with uid 1000 mapped in. Every test runs with the test
process's umask at 077, so staging cannot lean on the controller's umask. The task and the checks are
in tests/fixtures/nonroot_task.py (shared with the OpenSandbox test).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.events import VerificationFinished
from opencode_tui_core.tasks import load_task

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "nonroot_task", REPO / "tests" / "fixtures" / "nonroot_task.py"
)
assert _spec is not None and _spec.loader is not None
nonroot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nonroot)


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _need_nonroot_image() -> None:
    r = subprocess.run(["docker", "image", "inspect", nonroot.NONROOT_IMAGE], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"docker or {nonroot.NONROOT_IMAGE} is unavailable (scripts/build-images)")


def _run_then_shell(task: Path, runs: Path, provider: str, **sandbox: Any) -> tuple[Any, str]:
    """Run the episode keeping its sandbox, open the interactive shell in it, then release it."""
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": provider, "keep_sandbox": True, **sandbox}, "policy": {"max_attempts": 1}}
    )
    episode = Episode(load_task(task), config, runs_dir=runs)

    async def main() -> tuple[Any, str]:
        result = await episode.run()
        try:
            return result, await nonroot.shell_uid(episode)
        finally:
            if episode.sandbox is not None:
                await episode.sandbox.release()

    return asyncio.run(main())


@pytest.mark.docker
def test_docker_nonroot_image_runs_as_its_user(tmp_path: Path, umask_077: None) -> None:
    _need_nonroot_image()
    result, uid = _run_then_shell(nonroot.make_task(tmp_path), tmp_path / "runs", "docker")
    nonroot.check_scored_run(result, "agent", "image")
    assert uid == "1000"


@pytest.mark.docker
def test_docker_verifier_as_root_when_the_task_says_so(tmp_path: Path, umask_077: None) -> None:
    _need_nonroot_image()
    task = nonroot.make_task(tmp_path, verify_as_root=True)
    result, uid = _run_then_shell(task, tmp_path / "runs", "docker")
    nonroot.check_scored_run(result, "agent", "image", verifier="root")
    assert uid == "1000"  # only the verifier is root; the shell is the sandbox user's


@pytest.mark.bwrap
def test_local_with_a_mapped_user(tmp_path: Path, umask_077: None) -> None:
    """The local provider has no image: the config names the user, mapped into its user namespace."""
    task = nonroot.make_task(tmp_path, image=None)
    result, uid = _run_then_shell(task, tmp_path / "runs", "local", user="1000")
    try:
        name = pwd.getpwuid(1000).pw_name  # the local sandbox shows the host's users
    except KeyError:
        name = None
    nonroot.check_scored_run(result, name, "config")
    assert uid == "1000"


@pytest.mark.docker
def test_unreadable_input_fails_in_the_seed_phase_with_exit_code_3(tmp_path: Path, umask_077: None) -> None:
    _need_nonroot_image()
    task = nonroot.make_task(tmp_path, unreadable=True)
    runs = tmp_path / "runs"
    argv = ["run", str(task), "--batch", "--provider", "docker", "--attempts", "1", "--runs-dir", str(runs)]
    proc = subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: os.umask(0o077),
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (line["failure_kind"], line["failure_stage"], line["failure_class"], line["action"]) == (
        "sandbox_permission_denied",
        "seed",
        "evaluation",
        "mark_evaluation_error",
    )
    run_dir = Path(line["run_dir"])
    diagnostics = (run_dir / RunFiles.DIAGNOSTICS).read_text()
    assert "agent (uid 1000, gid 1000) cannot read /app/secret.txt (mode 000, owner 1000:1000)" in diagnostics
    events = list(RunDirReader(run_dir).events())
    assert not [e for e in events if isinstance(e, VerificationFinished)]  # the verifier never ran
    assert not (run_dir / "verify").exists()
    assert "exited with None" not in diagnostics
