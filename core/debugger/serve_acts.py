"""``say`` and ``abort`` through OpenCode's own server in the sandbox.

The serve runner (core/inside/serve_runner.py) knows where ``opencode serve`` listens and its
credentials; its ``--control`` mode, run as a second process in the sandbox (as the sandbox user),
posts to the live session: ``POST /session/{id}/prompt_async`` (a user message OpenCode takes into its
next turn) or ``POST /session/{id}/abort`` (the turn ends; the runner then sees the session idle).
"""

from __future__ import annotations

from typing import Any

from opencode_tui_core.sandbox.base import Sandbox

ACT_TIMEOUT_S = 30.0
NO_SESSION = 4  # serve_runner --control: no live session


class ServeActError(Exception):
    pass


def serve_acts(sandbox: Sandbox, installed: Any) -> Any:
    """The debugger's ``ServeAct`` for this sandbox, or None when the harness is not ``serve``."""
    harness = installed.harness
    if getattr(harness, "mode", None) != "serve":
        return None
    python = installed.runtime.python
    runner = harness.layout.runner_file

    async def act(action: str, text: str) -> None:
        result = await sandbox.exec(
            [python, "-I", runner, "--control", action],
            stdin=text.encode(),
            timeout=ACT_TIMEOUT_S,
        )
        if result.exit_code == 0:
            return
        words = result.stderr.decode("utf-8", "replace").strip().splitlines()
        if result.exit_code == NO_SESSION:
            raise ServeActError("OpenCode has no live session (the turn is over)")
        if not result.observed or result.deadline_expired:
            raise ServeActError(f"no answer from the sandbox within {ACT_TIMEOUT_S:g} s")
        raise ServeActError(words[-1] if words else f"exit status {result.exit_code}")

    return act
