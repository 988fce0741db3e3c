"""Read-only mode (`serve --read-only`): the app refuses every state-changing action and request."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from opencode_tui import read_only
from opencode_tui.app import OpenCodeTUI
from opencode_tui.messages import CancelWanted, KeepToggleWanted, ShellWanted
from opencode_tui.screens.runs import RunsScreen

SIZE = (160, 48)


def _said(app: OpenCodeTUI, text: str) -> bool:
    return any(text in str(n.message) for n in app._notifications)


@pytest.fixture
def runs(fixture_runs: Path, tmp_path: Path) -> Path:
    shutil.copytree(fixture_runs / "oom", tmp_path / "runs" / "oom")
    return tmp_path / "runs"


async def test_read_only_refuses_rerun_and_every_state_changing_request(runs: Path, monkeypatch) -> None:
    monkeypatch.setenv(read_only.ENV, "1")
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.read_only
        await pilot.press("r")  # re-run: refused, the browser stays
        await pilot.pause()
        assert app.rerun_request is None and isinstance(app.screen, RunsScreen)
        assert _said(app, "Read-only: rerun is disabled")
        # whatever posts them (a screen, a binding another branch adds), the requests are refused
        for message, what in (
            (ShellWanted("some-sandbox"), "the shell"),
            (CancelWanted(), "cancel"),
            (KeepToggleWanted(), "keep sandbox"),
        ):
            app.post_message(message)
            await pilot.pause()
            assert _said(app, f"Read-only: {what} is disabled"), what
        for action in sorted(read_only.REFUSED_ACTIONS):
            assert await app.run_action(action, app.screen)  # consumed: refused, not run
            await pilot.pause()
            assert _said(app, f"Read-only: {action.replace('_', ' ')} is disabled")


async def test_without_read_only_nothing_is_refused(runs: Path, monkeypatch) -> None:
    monkeypatch.delenv(read_only.ENV, raising=False)
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert not app.read_only
        app.post_message(ShellWanted(None))
        await pilot.pause()
        assert _said(app, "Shell unavailable in a replay") and not _said(app, "Read-only")


async def test_a_served_session_reruns_inside_the_app(runs: Path, monkeypatch, wait) -> None:
    """`serve` runs one app per process: `r` runs the re-run in this app (test_serve_browser runs one to
    its end), it does not exit with a request for a second app; a run that cannot be re-run as recorded
    (its task directory is gone) says so and the browser stays."""
    info = runs / "oom" / "run.json"
    info.write_text(info.read_text().replace('"task_dir": "', '"task_dir": "/nonexistent'))
    monkeypatch.delenv(read_only.ENV, raising=False)
    monkeypatch.setenv(read_only.SERVED_ENV, "1")
    app = OpenCodeTUI(runs_dir=runs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("r")
        await wait(pilot, lambda: _said(app, "oom cannot be re-run"), 10.0, "the refusal")
        assert app.rerun_request is None and isinstance(app.screen, RunsScreen) and app.is_running
        assert not _said(app, "Read-only")
        app.post_message(ShellWanted(None))
        await pilot.pause()
        assert _said(app, "Shell unavailable in a replay") and not _said(app, "Read-only")
