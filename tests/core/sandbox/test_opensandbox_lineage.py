"""Rerun and fork (issue 28) with ``--provider opensandbox``: a fix-bug run on the real
``opensandbox-server`` (fixture) with our execd stand-in in the sandboxes (the real execd is not
obtainable here; see ``tests/fixtures/execd_standin``), the real OpenCode and the scripted model; its
rerun and its fork at step 2 are answered from its record in fresh OpenSandbox sandboxes."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode, child_inputs, load_parent
from opencode_tui_core.episode.digests import recorded_digests
from opencode_tui_core.sandbox.base import LABEL_OWNER
from opencode_tui_core.tasks import load_task
from tests.core.sandbox.conftest import OPENSANDBOX_KEY_ENV, opensandbox_agent_config

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.opensandbox, pytest.mark.timeout(900)]
SAMPLES = Path(__file__).resolve().parents[3] / "sample_tasks"
PROXY_HOST = "127.0.0.2"


@pytest.fixture(scope="module")
def family(opensandbox_server: Any, tmp_path_factory: pytest.TempPathFactory, test_run_id: str) -> Any:
    """The parent (digests on: the default), its rerun and its fork --at 2, one sandbox at a time."""
    owner = f"os-lineage-{test_run_id}"
    base = tmp_path_factory.mktemp("os-lineage")
    task = base / "task"
    shutil.copytree(SAMPLES / "fix-bug", task)
    # a file written at step 2 (as in tests/core/test_lineage.py): step 3's workspace is not step 1's
    steps = yaml.safe_load((task / "trajectory.yaml").read_text())["steps"]
    notes = {"name": "write", "arguments": {"filePath": "{workdir}/NOTES.md", "content": "bug in add\n"}}
    (task / "trajectory.yaml").write_text(
        yaml.safe_dump({"steps": [steps[0], {"tool_calls": [notes]}, *steps[1:]]})
    )
    config = opensandbox_agent_config(opensandbox_server).model_copy(deep=True)
    config.model.proxy_host = PROXY_HOST  # as the episodes test: the sandboxes reach it by address
    config = AgentConfig.model_validate(config.model_dump())

    async def child(parent_dir: Path, lineage: str, **kw: Any) -> Path:
        parent = load_parent(parent_dir)
        cfg, t, plan = child_inputs(parent, lineage=lineage, **kw)
        result = await Episode(t, cfg, runs_dir=parent_dir.parent, child_of=(plan, parent)).run()
        return Path(result.run_dir)

    async def runs() -> tuple[Path, Path, Path]:
        result = await Episode(load_task(task), config, runs_dir=base / "runs").run()
        parent = Path(result.run_dir)
        return parent, await child(parent, "rerun"), await child(parent, "fork", fork_step=2)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(OPENSANDBOX_KEY_ENV, opensandbox_server.api_key)
        mp.setenv("OPENCODE_TUI_OWNER", owner)
        made = asyncio.run(runs())
    leftovers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL_OWNER}={owner}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.split()
    if leftovers:
        subprocess.run(["docker", "rm", "-f", *leftovers], capture_output=True, timeout=60, check=False)
    return made, leftovers


def _info(run_dir: Path) -> Any:
    info = RunDirReader(run_dir).info()
    assert info is not None and info.outcome is not None
    return info


def _agent_calls(run_dir: Path) -> list[Any]:
    return sorted(
        (c for c in RunDirReader(run_dir).model_calls() if c.kind == "agent"), key=lambda c: c.started_at
    )


def test_the_parent_records_a_digest_before_every_agent_call(family):
    (parent, _, _), _ = family
    info = _info(parent)
    assert info.provider == "opensandbox" and info.outcome.reward == 1.0
    digests = recorded_digests((parent / RunFiles.WORKSPACE_DIGESTS).read_text().splitlines())
    assert sorted(digests) == list(range(1, len(_agent_calls(parent)) + 1))
    assert digests[1] == digests[2] != digests[3]  # NOTES.md, written at step 2


def test_the_rerun_reproduces_the_parent_with_the_same_workspace_at_every_step(family):
    (parent, rerun, _), _ = family
    info = _info(rerun)
    assert info.provider == "opensandbox" and info.lineage == "rerun" and info.parent is not None
    assert info.parent.run_id == _info(parent).run_id
    assert info.replay is not None and info.replay.reproduced is True, info.replay
    assert info.replay.divergence_step is None and info.replay.workspace_check == "matches at every step"
    assert info.outcome.reward == 1.0
    calls = _agent_calls(rerun)
    assert [c.replayed_from for c in calls] == [c.call_id for c in _agent_calls(parent)]


def test_the_fork_at_step_2_has_step_2s_files_then_goes_live(family):
    (parent, _, fork), _ = family
    info = _info(fork)
    assert info.provider == "opensandbox" and info.lineage == "fork" and info.fork_step == 2
    assert info.replay is not None and info.replay.workspace_check == "matches at step 3", info.replay
    assert info.replay.live_from == 3 and info.outcome.reward == 1.0
    calls = _agent_calls(fork)
    assert [c.replayed_from for c in calls[:2]] == [c.call_id for c in _agent_calls(parent)[:2]]
    assert calls[2:] and all(c.replayed_from is None for c in calls[2:])


def test_no_sandbox_left_behind(family):
    _, leftovers = family
    assert leftovers == []
