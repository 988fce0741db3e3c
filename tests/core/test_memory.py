"""The batch's reclaim between episodes (core/memory.py): cyclic garbage freed every N episodes."""

from __future__ import annotations

import gc
import weakref

from opencode_tui_core.memory import Reclaimer, _malloc_trim


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_cyclic_garbage_is_freed_at_every_nth_episode_and_not_before() -> None:
    was_enabled = gc.isenabled()
    gc.disable()  # the automatic collector would free it at a time of its own
    try:
        reclaimer = Reclaimer(every=3)
        node = _Node()
        alive = weakref.ref(node)
        del node
        reclaimer.episode_ended()
        reclaimer.episode_ended()
        assert alive() is not None
        reclaimer.episode_ended()
        assert alive() is None
    finally:
        if was_enabled:
            gc.enable()


def test_glibc_trim_is_found_here() -> None:
    """This machine's Python runs on glibc: the trim is there (elsewhere it is None, not an error)."""
    trim = _malloc_trim()
    assert trim is not None and trim(0) in (0, 1)
