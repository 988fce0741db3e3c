"""A non-root sandbox user on OpenSandbox (issue 17), end to end: the real ``opensandbox-server``, our
execd stand-in (the real execd is not obtainable here; the stand-in honours the ``uid``/``gid`` of a
command submission as execd does, via setuid/setgid), the real OpenCode binary and the scripted model,
with the test process's umask at 077.

Its user model: execd runs commands as the uid/gid each submission names. ``sandbox.user`` becomes
those ids for every command (the harness, OpenCode and the verifier), uploads are extracted as root so
the archive's owners and modes apply, and the terminal (execd's ``/pty`` takes no uid) drops to the
user itself. The model is reached over TCP
here (no bound Unix socket), so the socket's owner is not part of this task's checks.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode import Episode
from opencode_tui_core.tasks import load_task

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.opensandbox, pytest.mark.timeout(600)]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
KEY_ENV = "OPENCODE_TUI_TEST_OPENSANDBOX_KEY"
_spec = importlib.util.spec_from_file_location("nonroot_task", FIXTURES / "nonroot_task.py")
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


def test_opensandbox_runs_everything_as_the_configured_user(
    opensandbox_server: Any, tmp_path: Path, umask_077: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, opensandbox_server.api_key)
    task = nonroot.make_task(tmp_path, image="opencode-tui/base:bookworm", socket=False)
    config = AgentConfig.model_validate(
        {
            "sandbox": {
                "provider": "opensandbox",
                "user": "1000:1000",
                "keep_sandbox": True,
                "opensandbox": {
                    "url": opensandbox_server.url,
                    "api_key_env": KEY_ENV,
                    "sandbox_timeout_s": 900,
                    "execd_port": opensandbox_server.execd_port,
                },
            },
            "policy": {"max_attempts": 1},
        }
    )
    episode = Episode(load_task(task), config, runs_dir=tmp_path / "runs")

    async def main() -> tuple[Any, str]:
        result = await episode.run()
        try:
            return result, await nonroot.shell_uid(episode)
        finally:
            if episode.sandbox is not None:
                await episode.sandbox.release()

    result, uid = asyncio.run(main())
    # The base image has no passwd entry for uid 1000: the user has no name.
    nonroot.check_scored_run(result, None, "config")
    assert uid == "1000"
