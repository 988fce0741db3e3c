"""Sandboxes whose user is not root (issue 17), end to end: the real OpenCode binary, the scripted model,
real Docker with the non-root image (``opencode-tui/nonroot:bookworm``: USER agent, uid 1000, WORKDIR
/app, /app root-owned) and real bubblewrap with uid 1000 mapped in. Every test runs with the test
process's umask at 077, so staging cannot lean on the controller's umask.

The agent reverses its input into the workdir, and records the modes and owners of its workdir, its
session directory and the model socket; the verifier (running as the sandbox user) checks all of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from core.artifacts import RunDirReader
from core.config import AgentConfig
from core.episode import Episode
from core.events import SandboxReady, VerificationFinished
from core.tasks import load_task

pytestmark = pytest.mark.slow
NONROOT_IMAGE = "opencode-tui/nonroot:bookworm"
INPUT = "hello sandbox user\n"
REVERSED = "resu xobdnas olleh"
REPO = Path(__file__).resolve().parents[2]

# What the agent runs: the task itself, then the facts the verifier checks (its HOME is inside the
# session directory, so "$HOME/.." is the session directory).
AGENT_COMMAND = (
    "rev input.txt > output.txt && "
    "stat -c '%a %u' . > workdir.mode && "
    'stat -c \'%a %u\' "$HOME/.." > session.mode && '
    "stat -c '%a %u' /run/opencode-tui/model.sock > socket.mode"
)
VERIFY = (
    f'test "$(cat output.txt)" = "{REVERSED}" && test "$(id -u)" = 1000 '
    '&& test "$(stat -c %u output.txt)" = 1000 '
    '&& test "$(cat workdir.mode)" = "755 1000" '
    '&& test "$(cat session.mode)" = "700 1000" '
    '&& test "$(cat socket.mode)" = "600 1000"'
)


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _need_nonroot_image() -> None:
    r = subprocess.run(["docker", "image", "inspect", NONROOT_IMAGE], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"docker or {NONROOT_IMAGE} is unavailable (scripts/build-images)")


def make_task(root: Path, *, image: str | None = NONROOT_IMAGE, unreadable: bool = False) -> Path:
    """A task written under the test's umask 077 (task files 0600, directories 0700 on the host)."""
    task = root / "rev-input"
    files = task / "files"
    files.mkdir(parents=True)
    (files / "input.txt").write_text(INPUT)
    if unreadable:
        secret = files / "secret.txt"
        secret.write_text("nobody may read this\n")
        secret.chmod(0o000)
    data = {
        "id": "rev-input",
        "problem_statement": "Write input.txt reversed (rev) into output.txt.",
        "workdir": "/app",
        "files": "files",
        "verify": {"command": VERIFY, "timeout": 30},
        "model": {"trajectory": "trajectory.yaml"},
    }
    if image is not None:
        data["image"] = image
    (task / "task.yaml").write_text(yaml.safe_dump(data))
    steps = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": AGENT_COMMAND, "description": "rev"}}]},
        {"text": "output.txt holds the reversed input."},
    ]
    (task / "trajectory.yaml").write_text(yaml.safe_dump({"steps": steps}))
    return task


def _episode(task: Path, runs: Path, provider: str, **sandbox: object) -> Episode:
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": provider, **sandbox}, "policy": {"max_attempts": 1}}
    )
    return Episode(load_task(task), config, runs_dir=runs)


async def _shell_uid(episode: Episode) -> str:
    """``id -u`` typed into the episode's interactive shell (a real pty), as printed back."""
    pty = await episode.open_shell(cols=100, rows=20)
    try:
        await pty.write(b"echo UID=$(id -u)=END\n")
        seen = b""
        async with asyncio.timeout(30):
            while b"=END" not in seen.replace(b"$(id -u)=END", b""):
                chunk = await pty.read()
                if not chunk:
                    break
                seen += chunk
        text = seen.decode("utf-8", "replace")
        return text.rsplit("UID=", 1)[1].split("=END", 1)[0]
    finally:
        await pty.close()


def _check_scored_run(result, uid_name: str, source: str) -> None:
    assert (result.action, result.reward, result.failure_kind) == ("scored", 1.0, None), result.summary
    run_dir = Path(result.run_dir)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["sandbox_user"] == {"name": uid_name, "uid": 1000, "gid": 1000, "source": source}
    assert info["verifier_user"] == f"{uid_name} (uid 1000, gid 1000)"
    events = list(RunDirReader(run_dir).events())
    ready = [e for e in events if isinstance(e, SandboxReady)]
    assert ready and (ready[0].user, ready[0].uid, ready[0].user_source) == (
        f"{uid_name} (uid 1000, gid 1000)",
        1000,
        source,
    )
    verified = [e for e in events if isinstance(e, VerificationFinished)]
    assert verified and verified[0].passed and verified[0].user == f"{uid_name} (uid 1000, gid 1000)"
    exported = json.loads((run_dir / "opencode" / "export.json").read_text())
    assert exported  # the transcript was exported from the user's private data dir


@pytest.mark.docker
def test_docker_nonroot_image_runs_as_its_user(tmp_path: Path, umask_077: None) -> None:
    _need_nonroot_image()
    task = make_task(tmp_path)
    episode = _episode(task, tmp_path / "runs", "docker", keep_sandbox=True)

    async def main() -> tuple[object, str]:
        result = await episode.run()
        try:
            return result, await _shell_uid(episode)
        finally:
            assert episode.sandbox is not None
            await episode.sandbox.release()

    result, shell_uid = asyncio.run(main())
    _check_scored_run(result, "agent", "image")
    assert shell_uid == "1000"


@pytest.mark.bwrap
def test_local_with_a_mapped_user(tmp_path: Path, umask_077: None) -> None:
    """The local provider has no image: the config names the user, mapped into its user namespace."""
    task = make_task(tmp_path, image=None)
    episode = _episode(task, tmp_path / "runs", "local", keep_sandbox=True, user="1000")

    async def main() -> tuple[object, str]:
        result = await episode.run()
        try:
            return result, await _shell_uid(episode)
        finally:
            assert episode.sandbox is not None
            await episode.sandbox.release()

    result, shell_uid = asyncio.run(main())
    import pwd

    try:
        name = pwd.getpwuid(1000).pw_name
    except KeyError:
        name = None
    info = json.loads((Path(result.run_dir) / "run.json").read_text())
    _check_scored_run(result, info["sandbox_user"]["name"], "config")
    assert info["sandbox_user"]["name"] == name
    assert shell_uid == "1000"


@pytest.mark.docker
def test_unreadable_input_fails_in_the_seed_phase_with_exit_code_3(tmp_path: Path, umask_077: None) -> None:
    _need_nonroot_image()
    task = make_task(tmp_path, unreadable=True)
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "opencode_tui.cli", "run", str(task), "--batch", "--provider", "docker"]
        + ["--attempts", "1", "--runs-dir", str(runs)],
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
    diagnostics = (run_dir / "diagnostics.txt").read_text()
    assert "agent (uid 1000, gid 1000) cannot read /app/secret.txt (mode 000, owner 1000:1000)" in diagnostics
    events = list(RunDirReader(run_dir).events())
    assert not [e for e in events if isinstance(e, VerificationFinished)]  # the verifier never ran
    assert not (run_dir / "verify").exists()
    assert "exited with None" not in diagnostics
