"""Read-only mode (``opencode-tui serve --read-only``): the one switch and what it refuses.

The served app runs in a process of its own per browser session; the server turns the mode on for it
through ``ENV``. The app refuses ``REFUSED_ACTIONS`` wherever they come from (a key, the footer, the
command palette: every action goes through ``App.run_action``) and the requests screens post for them.
"""

from __future__ import annotations

import os

ENV = "OPENCODE_TUI_READ_ONLY"

# The actions that change something: a shell in the sandbox, cancelling or keeping a live episode, and
# running a run again. (The run screen's and the runs browser's action names.)
REFUSED_ACTIONS = frozenset({"open_shell", "cancel_episode", "toggle_keep", "rerun"})


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def refusal(what: str) -> str:
    return f"Read-only: {what} is disabled (opencode-tui serve --read-only)"
