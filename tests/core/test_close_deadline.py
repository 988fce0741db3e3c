"""CloseDeadline: one budget for the whole close, a reserve for the release, a paused clock for
verification, and no step started once it is spent (real time, short budgets)."""

from __future__ import annotations

import asyncio
import time

import pytest

from opencode_tui_core.session import CloseBudgetSpent, CloseDeadline


async def test_steps_share_one_budget_and_keep_the_release_reserve():
    t0 = time.monotonic()
    d = CloseDeadline(1.0)
    t1 = time.monotonic()  # created between t0 and t1: a busy machine may pause us anywhere
    assert d.reserve_s == 0.25
    left, left_for_release = d.remaining(), d.remaining(for_release=True)
    since = time.monotonic() - t0
    assert 0.75 - since <= left <= 0.75 and 1.0 - since <= left_for_release <= 1.0
    with pytest.raises(CloseBudgetSpent, match="ran out"):
        await d.run(asyncio.sleep(10), step="stop")
    spent_at = time.monotonic()
    # The stalled step used what it was given; the next one starts with nothing, the release with the reserve.
    assert d.remaining() == 0.0 and d.expired()
    left_for_release = d.remaining(for_release=True)
    since = time.monotonic() - t0
    assert max(0.0, 1.0 - since) <= left_for_release <= 1.0 - (spent_at - t1)
    # The step was cut where the release reserve begins (0.75 s), not at the whole budget's end (1.0 s).
    assert 0.75 - 0.01 <= spent_at - t1 and spent_at - t0 < 1.0


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


def test_a_close_step_during_verification_counts_against_the_budget():
    """The OOM inspect after a failed verifier runs inside the verifier's paused span, yet spends the
    close budget (issue 25); the verifier's own time still does not."""
    now = [0.0]
    d = CloseDeadline(10.0, reserve_s=0.0, clock=lambda: now[0])
    with d.suspended():
        now[0] += 30.0  # the verifier
        with d.counting():
            now[0] += 4.0  # the inspect
        now[0] += 5.0  # the verifier's wrap-up
    assert d.remaining() == pytest.approx(6.0)
    with d.counting():  # outside a paused span: nothing changes
        now[0] += 1.0
    assert d.remaining() == pytest.approx(5.0)
