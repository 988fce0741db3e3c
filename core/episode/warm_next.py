"""One sandbox prepared ahead for the episode a front end expects to run next (issue 31, the TUI).

A single run (``opencode-tui run TASK``) starts preparing its sandbox as soon as its task is admitted,
before the screen is drawn, and its episode takes it. When an episode ends by itself, the next
sandbox is prepared for the same task and configuration, so a re-run takes it. It is a
``WarmPool`` of depth 1 aimed at one task at a time: an episode is given it only when its own
``pool_key`` equals the pool's (same image, user, limits, OpenCode runtime). Aimed at another key,
the one there is released first; ``close`` (every way out of the front end) releases what is left
and confirms it, and ``counts`` says what was prepared, used and discarded.

Where it applies: a provider that declares the ``warm`` capability, an owned sandbox from an image
(``pool_key``), and ``batch.warm`` not 0 (0 turns preparing ahead off here too).
"""

from __future__ import annotations

import asyncio
import time

from opencode_tui_core import provider_registry
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode.pool import WarmCounts, WarmPool, pool_key
from opencode_tui_core.tasks import Task


def warm_key(task: Task, config: AgentConfig) -> str | None:
    """What a sandbox prepared ahead for ``task`` under ``config`` must match; None: none is prepared."""
    if config.batch.warm == 0:
        return None
    if not provider_registry.get(config.sandbox.provider).capabilities.warm:
        return None
    return pool_key(task, config)


class WarmNext:
    """The front end's one sandbox prepared ahead: for its first run, then for a re-run."""

    def __init__(self) -> None:
        self._pool: WarmPool | None = None
        self._key: str | None = None
        self._spent: list[WarmCounts] = []  # the pools already closed
        self._lock = asyncio.Lock()  # one aim or release at a time
        self._closing: set[asyncio.Future[WarmCounts]] = set()  # releases under way
        self._closed = False

    def pool_for(self, task: Task, config: AgentConfig) -> WarmPool | None:
        """The pool an episode of ``task`` under ``config`` takes its sandbox from (made here when there
        is none yet; ``aim`` starts its preparing). None when nothing is prepared ahead for it, or when
        the pool is aimed at another configuration (``aim`` replaces it)."""
        key = warm_key(task, config)
        if key is None or self._closed:
            return None
        if self._pool is None:
            self._pool, self._key = WarmPool(config, depth=1, batch_id=None), key
        return self._pool if self._key == key else None

    async def aim(self, task: Task, config: AgentConfig) -> WarmPool | None:
        """Prepare a sandbox for the next episode, of ``task`` under ``config`` (in the running loop):
        one prepared or being prepared for the same key is kept for it, one for another key released
        (confirmed) first. Returns the pool that episode takes from (None: it prepares its own)."""
        async with self._lock:
            if self._pool is not None and self._key != warm_key(task, config):
                await self._close_pool()
            pool = self.pool_for(task, config)
            if pool is not None:
                pool.plan([task])  # this task object: the episode's ``take`` waits for one in preparation
            return pool

    async def prepared(self, before: int, timeout_s: float) -> bool:
        """Wait until a preparation finished after ``before`` (``counts.prepared`` then); False when none
        did within ``timeout_s`` (it failed, was released, or is still under way)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._pool is not None:
            if self.counts.prepared > before:
                return True
            await asyncio.sleep(0.2)
        return False

    async def discard(self) -> None:
        """Release the prepared, unused sandbox (confirmed); a later ``aim`` prepares again."""
        async with self._lock:
            await self._close_pool()

    async def close(self) -> WarmCounts:
        """Every way out: prepare nothing more, release what is unused (confirmed); the counts. Returns
        once every release is done, one whose caller was cancelled meanwhile included."""
        self._closed = True
        await self.discard()
        while self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        return self.counts

    @property
    def holding(self) -> bool:
        """A pool is open (a sandbox may be prepared or being prepared)."""
        return self._pool is not None

    @property
    def counts(self) -> WarmCounts:
        """Everything prepared ahead so far, over every pool (one per configuration aimed at)."""
        parts = [*self._spent, *([self._pool.counts] if self._pool is not None else [])]
        total = WarmCounts(depth=1)
        for c in parts:
            for name in WarmCounts.model_fields:
                if name != "depth":
                    setattr(total, name, getattr(total, name) + getattr(c, name))
        return total

    async def _close_pool(self) -> None:
        pool, self._pool, self._key = self._pool, None, None
        if pool is None:
            return
        self._spent.append(pool.counts)  # the same object the close counts its releases in
        # Shielded: a caller cancelled meanwhile does not cut the release short (the pool bounds it;
        # ``close`` waits for it).
        closing = asyncio.ensure_future(pool.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        await asyncio.shield(closing)
