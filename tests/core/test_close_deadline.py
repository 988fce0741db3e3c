"""CloseDeadline: one budget for the whole close, a reserve for the release, a paused clock for
verification, and no step started once it is spent (real time, short budgets)."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.session import CloseBudgetSpent, CloseDeadline


async def test_steps_share_one_budget_and_keep_the_release_reserve():
    d = CloseDeadline(1.0)
    assert d.reserve_s == 0.25
    assert 0.7 < d.remaining() <= 0.75 and 0.95 < d.remaining(for_release=True) <= 1.0
    with pytest.raises(CloseBudgetSpent, match="ran out"):
        await d.run(asyncio.sleep(10), step="stop")
    # The stalled step used what it was given; the next one starts with nothing, the release with the reserve.
    assert d.remaining() == 0.0 and d.expired()
    assert 0.15 < d.remaining(for_release=True) <= 0.25


async def test_a_spent_budget_starts_nothing():
    d = CloseDeadline(0.2, reserve_s=0.0)
    await asyncio.sleep(0.25)
    started = []

    async def request() -> None:
        started.append(True)

    with pytest.raises(CloseBudgetSpent, match="was not started"):
        await d.run(request(), step="inspect")
    assert started == []


async def test_verification_does_not_count_and_cap_bounds_a_step():
    d = CloseDeadline(1.0, reserve_s=0.0)
    with d.suspended():
        await asyncio.sleep(0.4)
    assert d.remaining() > 0.9
    t0 = time.monotonic()
    with pytest.raises(CloseBudgetSpent):
        await d.run(asyncio.sleep(10), step="inspect", cap=0.1)
    assert time.monotonic() - t0 < 0.5
    assert await d.run(asyncio.sleep(0, result="ok"), step="collect") == "ok"
