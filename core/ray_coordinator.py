"""The Ray batch's coordinator actor: cancels reach running workers, who runs which attempt where,
the sweeps owed to lost nodes, the workers' live phases.

A module of its own, with nothing but the standard library: the actor runs in a Ray worker process
of its own, which imports only this (not the engine) before the batch's first worker can ask it
anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Begin:
    """The coordinator's answer to a worker about to start an episode."""

    cancelled_by: str | None = None  # the batch was cancelled: start nothing
    # Lost attempts whose sandboxes may still be on this node (it was gone when they were lost):
    # the worker sweeps them first.
    sweep: list[str] = field(default_factory=list)


class Coordinator:
    """A Ray actor (async, no CPU) owned by the driver: dies with it."""

    def __init__(self) -> None:
        self.cancels: list[str] = []  # every cancel request in order (a second one hurries)
        self._changed = asyncio.Event()
        # run id → where its worker runs; kept after the attempt ends (a cancel must never
        # interrupt a finished task's return, see ``RayExecutor.cancel``).
        self.started: dict[str, dict[str, Any]] = {}
        self._ended: dict[str, asyncio.Event] = {}
        # node address → lost attempts (run ids) whose node could not be swept; and what the
        # workers that landed there since swept: (address, run ids, removed sandbox ids).
        self.pending: dict[str, set[str]] = {}
        self.swept_log: list[tuple[str, list[str], list[str]]] = []
        # run id → its episode's phase, as its worker reports it (for the driver's live progress).
        self.phases: dict[str, str] = {}
        self._phases_version = 0
        self._phase_changed = asyncio.Event()

    async def begin(self, run_id: str, where: dict[str, Any]) -> Begin:
        """A worker asks before it starts an episode."""
        if self.cancels:
            return Begin(cancelled_by=self.cancels[0])
        self.started[run_id] = where
        self._phases_changed()  # who watches the phases learns where it runs
        # Handed to one worker at a time: taken off until it reports (``swept``).
        sweep = sorted(self.pending.pop(where.get("ip", ""), set()))
        return Begin(sweep=sweep)

    async def pend(self, ip: str, run_id: str) -> None:
        """A lost attempt's node could not be swept: the next worker on a node at ``ip`` does it."""
        self.pending.setdefault(ip, set()).add(run_id)

    async def swept(self, ip: str, run_ids: list[str], removed: list[str] | None) -> None:
        """A worker swept (``removed``) or failed to sweep (None: pending again) lost attempts."""
        if removed is None:
            self.pending.setdefault(ip, set()).update(run_ids)
        else:
            self.swept_log.append((ip, run_ids, removed))

    async def phase(self, run_id: str, phase: str) -> None:
        self.phases[run_id] = phase
        self._phases_changed()

    def _phases_changed(self) -> None:
        self._phases_version += 1
        self._phase_changed.set()
        self._phase_changed = asyncio.Event()

    async def wait_phases(
        self, seen: int, timeout: float
    ) -> tuple[int, dict[str, str], dict[str, tuple[str, str]]]:
        """Long poll: (version, every attempt's phase, every started attempt's node: (id, address))
        once the version is past ``seen``, or after ``timeout`` seconds."""
        if self._phases_version <= seen:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._phase_changed.wait(), timeout)
        nodes = {
            run_id: (str(where.get("node_id", "")), str(where.get("ip", "")))
            for run_id, where in self.started.items()
        }
        return self._phases_version, dict(self.phases), nodes

    async def sweeps(self) -> list[tuple[str, list[str], list[str]]]:
        """What workers swept for lost attempts (address, run ids, removed): the driver's last pass."""
        return list(self.swept_log)

    async def end(self, run_id: str) -> None:
        """The attempt's episode is over: its long poll returns."""
        self._ended.setdefault(run_id, asyncio.Event()).set()

    async def where(self, run_id: str) -> dict[str, Any] | None:
        return self.started.get(run_id)

    async def cancel(self, by: str) -> list[str]:
        """Tell every running worker; returns the attempts that had started (the rest never will)."""
        self.cancels.append(by)
        self._changed.set()
        self._changed = asyncio.Event()
        return list(self.started)

    async def wait_cancel(self, run_id: str, seen: int) -> list[str]:
        """Long poll: the cancel requests after the first ``seen`` (none once the attempt ended)."""
        ended = self._ended.setdefault(run_id, asyncio.Event())
        while len(self.cancels) <= seen and not ended.is_set():
            waits = [asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(ended.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        if ended.is_set():
            self._ended.pop(run_id, None)
        return self.cancels[seen:]
