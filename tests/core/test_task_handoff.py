"""The task handed to a runner started ahead through the model proxy (opencode_tui_core.episode.handoff): the real
serve runner's own code (``receive_task``, run as uid 1000 in a subprocess) against a real
``ModelProxy`` on loopback. No sandbox: what is under test is the line between the two, the
unpacking as the sandbox user and the access check it runs; the episodes on docker and local are in
test_warm_pool.py."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from opencode_tui_core.episode.handoff import HandoffLost, TaskHandoff, TaskOffer
from opencode_tui_core.inside.serve_runner import HANDOFF_PREFIX, HANDOFF_TASK_PATH
from opencode_tui_core.model.proxy import ModelProxy
from opencode_tui_core.model.scripted import ScriptedModel
from opencode_tui_core.model.trajectory import Trajectory
from opencode_tui_core.runtime import access
from opencode_tui_core.runtime.opencode import RUNNER_SOURCE
from opencode_tui_core.sandbox.base import SandboxUser
from opencode_tui_core.sandbox.tarsafe import tree_tar

UID = 1000
USER = SandboxUser(name="agent", uid=UID, gid=UID)
TOKEN = "handoff-token-0123456789abcdef"
# The runner's module as uploaded, imported from its session directory (its HERE).
RECEIVE = "import sys; sys.path.insert(0, sys.argv[1]); import serve_runner; serve_runner.receive_task(int(sys.argv[2]), sys.argv[3])"

# uid 1000 cannot reach the test's own interpreter (under /root): the system's, as in a sandbox.
PYTHON = shutil.which("python3", path="/usr/bin:/bin")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the runner as uid 1000 (needs root)"),
    pytest.mark.skipif(PYTHON is None, reason="no system python3 for uid 1000 (apt-get install python3)"),
]


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    """A session directory holding the runner and an empty workdir, both uid 1000's (outside the
    test's private tmp_path, which that user cannot enter)."""
    root = Path(tempfile.mkdtemp(prefix="octui-handoff-"))
    root.chmod(0o755)
    session, workdir = root / "session", root / "work"
    for d, mode in ((session, 0o700), (workdir, 0o755)):
        d.mkdir(mode=mode)
        os.chown(d, UID, UID)
    shutil.copy(RUNNER_SOURCE, session / "serve_runner.py")
    try:
        yield session, workdir
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _task_files(root: Path) -> Path:
    files = root / "files"
    (files / "sub").mkdir(parents=True)
    (files / "input.txt").write_text("hello\n")
    (files / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (files / "sub" / "run.sh").chmod(0o750)
    (files / "secret.txt").write_text("nobody may read this\n")
    (files / "secret.txt").chmod(0o000)
    return files


async def _runner(session: Path, port: int, token: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        PYTHON or "python3", "-I", "-c", RECEIVE, str(session), str(port), token,
        user=UID, group=UID, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.parametrize("ending", ["go", "withdrawn"])
async def test_the_runner_unpacks_and_checks_its_task_as_its_user_then_takes_its_prompt(
    tmp_path: Path, dirs: tuple[Path, Path], ending: str
) -> None:
    """A request without the token is refused and never handed anything. The runner (uid 1000) gets
    the task files with their modes, owned by itself, and its access check names the file it cannot
    read, judged as the provider's check would be. Then ``go`` gives it the prompt's files (the go
    file last) and it returns; a withdrawn task makes it exit with 3 instead. Nothing is recorded as
    a model call."""
    session, workdir = dirs
    handoff = TaskHandoff()
    async with (
        ScriptedModel(Trajectory.model_validate({"steps": [{"text": "unused"}]})) as model,
        ModelProxy(
            model.url, record_dir=tmp_path / "rec", access_token=TOKEN, side=(HANDOFF_PREFIX, handoff.serve)
        ) as proxy,
    ):
        assert proxy.port is not None
        async with httpx.AsyncClient(timeout=10) as c:
            refused = await c.get(f"http://127.0.0.1:{proxy.port}{HANDOFF_TASK_PATH}")
        assert refused.status_code == 401
        proc = await _runner(session, proxy.port, TOKEN)
        runner = asyncio.ensure_future(proc.wait())
        archive, inputs = await access.task_archive(_task_files(tmp_path), USER)
        offer = TaskOffer(
            workdir=str(workdir),
            listing=access.preflight_listing(inputs),
            check=access.PREFLIGHT_SH,
            socket="",
        )
        result = await handoff.stage(offer, archive, runner=runner, timeout=30)  # type: ignore[arg-type]
        with pytest.raises(access.SandboxPermissionDenied) as denied:
            access.judge_preflight(result, USER)
        assert f"cannot read {workdir}/secret.txt (mode 000, owner {UID}:{UID})" in str(denied.value)
        assert "(and" not in str(denied.value)  # the other files are readable
        script = workdir / "sub" / "run.sh"
        assert (script.read_text(), script.stat().st_mode & 0o777, script.stat().st_uid) == (
            "#!/bin/sh\n",
            0o750,
            UID,
        )
        assert (workdir / "input.txt").read_text() == "hello\n" and workdir.stat().st_mode & 0o777 == 0o755
        if ending == "go":
            prompt = {"prompt.txt": (b"Say hello.", 0o600), "go": (b"", 0o600)}
            handoff.go(tree_tar(prompt, owner=(UID, UID)))
        else:
            handoff.withdraw()
        code = await asyncio.wait_for(runner, 30)
        stderr = (await proc.stderr.read()).decode() if proc.stderr else ""
    if ending == "go":
        assert code == 0, stderr
        assert (session / "prompt.txt").read_text() == "Say hello." and (session / "go").exists()
        assert (session / "go").stat().st_uid == UID
    else:
        assert code == 3 and "the task was withdrawn (409)" in stderr
        assert not (session / "go").exists()
    assert proxy.records == [] and model.calls == []


async def test_a_runner_that_never_takes_its_task_is_said_to_have_ended(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    """A runner holding the wrong token is refused (it asks again and again); once it is gone, the
    episode's wait for its report ends with HandoffLost (the seed phase's failure) rather than at the
    check's deadline, and the offered files went nowhere."""
    session, workdir = dirs
    handoff = TaskHandoff()
    async with (
        ScriptedModel(Trajectory.model_validate({"steps": [{"text": "unused"}]})) as model,
        ModelProxy(model.url, access_token=TOKEN, side=(HANDOFF_PREFIX, handoff.serve)) as proxy,
    ):
        assert proxy.port is not None
        proc = await _runner(session, proxy.port, "not-the-token")
        runner = asyncio.ensure_future(proc.wait())
        archive, _ = await access.task_archive(_task_files(tmp_path), USER)
        offer = TaskOffer(workdir=str(workdir), listing="", check=access.PREFLIGHT_SH, socket="")
        staging = asyncio.ensure_future(handoff.stage(offer, archive, runner=runner, timeout=60))  # type: ignore[arg-type]
        await asyncio.sleep(1.5)  # refused three or four times meanwhile
        assert not staging.done()
        proc.kill()
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(HandoffLost, match="ended before it took its task"):
            await asyncio.wait_for(staging, 10)
        assert loop.time() - began < 5
    assert list(workdir.iterdir()) == []
    stdout = (await proc.stdout.read()).decode() if proc.stdout else ""
    assert '"runner.handoff_retry"' in stdout and "401" in stdout
