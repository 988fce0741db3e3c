"""SIGINT, SIGTERM and SIGHUP turned into a graceful close of whatever is running.

What `timeout`, Slurm, Kubernetes and systemd send must close the sandbox, confirm cleanup and write
the record, exactly like `c` in the TUI. The handler forwards the signal's name to ``cancel``; a
second signal calls it again, which hurries the close. Only SIGKILL can leave work for ``sweep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator

from opencode_tui_core.control import CLOSING_SIGNALS


@contextlib.contextmanager
def closing_signals(
    cancel: Callable[[str], Awaitable[object]],
    *,
    announce: Callable[[str, bool], object] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Iterator[None]:
    """While inside, each closing signal schedules ``cancel(signal name)`` on the running loop."""
    loop = loop or asyncio.get_running_loop()
    seen: list[str] = []
    pending: set[asyncio.Task[object]] = set()

    def on_signal(sig: signal.Signals) -> None:
        name = sig.name
        if announce is not None:
            announce(name, not seen)
        seen.append(name)
        task = loop.create_task(_call(cancel, name))
        pending.add(task)
        task.add_done_callback(pending.discard)

    installed = []
    for sig in CLOSING_SIGNALS:
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal
            continue
        installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def _call(cancel: Callable[[str], Awaitable[object]], name: str) -> object:
    return await cancel(name)
