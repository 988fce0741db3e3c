"""What an episode left behind on this machine (shared by the tests that close episodes)."""

from __future__ import annotations

import subprocess

from opencode_tui_core.episode import EpisodeResult


def left_behind(provider: str, result: EpisodeResult) -> list[str]:
    """What an ended episode left on this machine: its containers (docker), or processes and the state
    directory of its local sandbox; empty when everything was released."""
    return left_by(provider, result.run_id, result.sandbox_id)


def left_by(provider: str, run_id: str, sandbox_id: str | None) -> list[str]:
    """``left_behind`` by the run's id and sandbox id (a result read from a JSON line)."""
    if provider == "docker":
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=opencode-tui.run={run_id}"],
            capture_output=True,
            text=True,
        )
        return out.stdout.split()
    # A local sandbox's keeper and every process in it carry the run's sandbox id on their command line
    # or in their environment; pgrep over the command lines of this machine finds none of them.
    out = subprocess.run(["pgrep", "-af", sandbox_id or run_id], capture_output=True, text=True)
    left = [line for line in out.stdout.splitlines() if "pgrep" not in line]
    # A released sandbox leaves no state directory either (a release cut short once did).
    from opencode_tui_core.sandbox.local.provider import _default_base_dir

    if sandbox_id and (_default_base_dir() / sandbox_id).exists():
        left.append(f"state directory {_default_base_dir() / sandbox_id}")
    return left
