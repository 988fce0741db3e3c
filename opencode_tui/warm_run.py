"""Running an app that prepares sandboxes ahead (issue 31): ``OpenCodeTUI(warm=WarmNext())``.

The pool's tasks, sockets and sandbox handles belong to the app's event loop, so the app runs in a
loop made here (``App.run`` would make one the same way) that first aims the pool at the first run's
task (its sandbox starts preparing before the screen is drawn), and after the app releases whatever
is left: the app's own ways out (``q``, Ctrl-C, a signal) have released it already, confirmed; this
covers the rest (a crash). Signals during that release are announced, not obeyed: it is bounded by
the pool's own deadlines.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from opencode_tui_core.signals import closing_signals

if TYPE_CHECKING:
    from opencode_tui.app import OpenCodeTUI
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.episode.pool import WarmCounts
    from opencode_tui_core.tasks import Task


def run_app(app: OpenCodeTUI, first: tuple[Task, AgentConfig] | None = None) -> WarmCounts | None:
    """Run ``app`` to its end; its warm counts (None: it prepared nothing ahead)."""
    warm = app.warm
    if warm is None:
        app.run()
        return None

    async def main() -> WarmCounts:
        try:
            if first is not None:
                await warm.aim(*first)
            await app.run_async()
        finally:
            with closing_signals(_still_releasing, announce=_announce):
                counts = await warm.close()
        return counts

    counts = asyncio.run(main())
    return counts if counts.active else None


def warm_line(counts: WarmCounts) -> str:
    """What the app says on stderr after it: what it prepared ahead, and that the release is confirmed."""
    confirmed = (
        f", {counts.released_confirmed} released unused, confirmed" if counts.released_confirmed else ""
    )
    return f"{counts.words()}{confirmed}"


async def _still_releasing(name: str) -> None:
    return None


def _announce(name: str, first: bool) -> None:
    print(
        f"opencode-tui: {name}: releasing the sandbox prepared ahead (cleanup is confirmed)",
        file=sys.stderr,
        flush=True,
    )
