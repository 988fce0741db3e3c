"""Read-only mode (``opencode-tui serve --read-only``) and the served app: the switches, what they refuse.

The served app runs in a process of its own per browser session; the server turns the mode on for it
through ``ENV``. The app refuses ``REFUSED_ACTIONS`` wherever they come from (a key, the footer, the
command palette: every action goes through ``App.run_action``) and the requests screens post for them.
"""

from __future__ import annotations

import os

ENV = "OPENCODE_TUI_READ_ONLY"

# The actions that change something: a shell in the sandbox, cancelling or keeping a live episode, acting
# on its agent through the debugger, and running a run again. (The run screen's and the runs browser's action names.)
REFUSED_ACTIONS = frozenset(
    {
        "open_shell",
        "cancel_episode",
        "toggle_keep",
        "rerun",
        # the debugger's acts on the agent (issue 27)
        "debug_break",
        "debug_continue",
        "debug_step",
        "debug_say",
        "debug_answer",
        "debug_edit",
        "debug_abort",
    }
)


# Set by `serve` for its sessions' app processes. A served session is one app in one process, ended
# when its socket closes (SIGTERM: a live run in it closes with cleanup confirmed); a re-run runs
# inside that app (``OpenCodeTUI.run_here``), not in a second app after it as in a terminal.
SERVED_ENV = "OPENCODE_TUI_SERVED"


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def served() -> bool:
    return os.environ.get(SERVED_ENV) == "1"


def refusal(what: str) -> str:
    return f"Read-only: {what} is disabled (opencode-tui serve --read-only)"
