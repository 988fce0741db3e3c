"""What ``opencode-tui doctor`` says of the warm pool (issue 31): for the recent batches of a runs
directory that prepared sandboxes ahead (their record, core/batch_record.py), how many were prepared,
used, discarded, failed or released unconfirmed; and which prepared sandboxes exist now (listed the way
``sweep`` lists them, by the ``opencode-tui.pool`` label), with the command that removes the leftovers.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core import provider_registry as registry
from opencode_tui_core import sweep_selection as sweeping
from opencode_tui_core.batch_record import BATCHES_FILE, BatchRecord, recent_batches
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.invocation import Liveness, pid_of
from opencode_tui_core.provider_registry import Check
from opencode_tui_core.resume import recorded_results

LIST_S = 60.0  # listing one provider's sandboxes
SHOWN = 5  # batches shown
LOOKED_AT = 50  # recent batches looked at for those that prepared ahead


class PoolSandbox(BaseModel):
    """A sandbox a warm pool prepared, as listed now."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str
    sandbox_id: str
    batch_id: str | None
    liveness: Liveness  # whether the process that prepared it still runs


class WarmCheck(Check):
    """A doctor line about the warm pool; ``--json`` carries the facts behind its words."""

    batch: BatchRecord | None = None  # a batch's line: its record
    used_by_results: int | None = None  # a batch with no end record: attempts its result lines say got one
    sandboxes: list[PoolSandbox] = Field(default_factory=list)  # the leftovers line: what exists now
    remove: str | None = None  # the command that removes the leftovers


def _when(record: BatchRecord) -> str:
    return record.started_at.astimezone().strftime("%Y-%m-%d %H:%M")


def batch_check(record: BatchRecord, runs_dir: Path) -> WarmCheck:
    """One batch that was to prepare ahead (or could not): its counts, or why they are unknown."""
    head = (
        f"batch {record.batch_id} (started {_when(record)}, {record.executor} executor, "
        f"{record.provider} sandboxes)"
    )
    if record.warm_not_used is not None:
        return WarmCheck(
            name="warm pool",
            status="warn",
            detail=f"{head}: warm-ahead not used: {record.warm_not_used}",
            batch=record,
        )
    if record.ended:
        counts = record.warm
        if counts is None or not counts.active:
            words = f"nothing prepared ahead (depth {record.warm_depth}: no task was left to prepare for)"
            return WarmCheck(name="warm pool", status="ok", detail=f"{head}: {words}", batch=record)
        bad = []
        if counts.failed:
            bad.append(f"{counts.failed} preparation(s) failed (those attempts made their own sandbox)")
        if counts.released_unconfirmed:
            bad.append(f"{counts.released_unconfirmed} release(s) unconfirmed (see `warm leftovers` below)")
        return WarmCheck(
            name="warm pool",
            status="warn" if bad else "ok",
            detail=f"{head}: {counts.words()}" + (f"; {'; '.join(bad)}" if bad else ""),
            batch=record,
        )
    used = sum(1 for _, r in recorded_results(runs_dir) if r.batch_id == record.batch_id and r.warm)
    if record.running:
        return WarmCheck(
            name="warm pool",
            status="ok",
            detail=f"{head}: running (pid {pid_of(record.controller)}), up to {record.warm_depth} prepared "
            f"ahead; {used} used so far; its counts are recorded when it ends",
            batch=record,
            used_by_results=used,
        )
    return WarmCheck(
        name="warm pool",
        status="warn",
        detail=f"{head}: ended without its end record (its process, pid {pid_of(record.controller)}, is "
        f"gone: killed?): {used} attempt(s) got a prepared sandbox; prepared and discarded unknown; "
        "what it left is under `warm leftovers`",
        batch=record,
        used_by_results=used,
    )


def _remove_command(left: list[PoolSandbox]) -> str:
    """``sweep`` by batch (it removes what carries the batch's id and whose process is gone), naming a
    provider a bare sweep does not list; by id for one that carries no batch id."""
    default = set(registry.swept_by_default())
    commands = []
    for (provider, batch_id), _n in sorted(Counter((s.provider, s.batch_id or "") for s in left).items()):
        where = "" if provider in default else f" --provider {provider}"
        if batch_id:
            commands.append(f"opencode-tui sweep{where} --batch {batch_id}")
        else:
            ids = " ".join(s.sandbox_id for s in left if s.provider == provider and not s.batch_id)
            commands.append(f"opencode-tui sweep --provider {provider} {ids}")
    return "; ".join(commands)


async def leftovers_check(config: AgentConfig) -> WarmCheck:
    """The prepared sandboxes that exist now (this owner's, on the providers that prepare ahead)."""
    names = [n for n in sweeping.provider_names("all") if _prepares_ahead(n)]
    owner = sweeping.default_owner()
    skipped: list[str] = []

    def skip(name: str, exc: Exception) -> None:
        skipped.append(f"{name} not listed: {' '.join(str(exc).split())[:160] or type(exc).__name__}")

    found: list[sweeping.Found] = []
    for name in names:
        try:
            found += await asyncio.wait_for(
                sweeping.list_ours([name], owner, strict=False, on_skip=skip, config=config),
                LIST_S,
            )
        except TimeoutError:
            skipped.append(f"{name} not listed: no answer within {LIST_S:.0f} s")
        except Exception as exc:  # the provider cannot even be made here: said, the others still listed
            skip(name, exc)
    pool = [
        PoolSandbox(
            provider=item.record.provider,
            sandbox_id=item.record.sandbox_id,
            batch_id=item.batch_id,
            liveness=item.liveness,
        )
        for item in sweeping.of_pools(found)
    ]
    note = f" ({'; '.join(skipped)})" if skipped else ""
    left = [s for s in pool if s.liveness in (Liveness.GONE, Liveness.UNLABELLED)]
    live = [s for s in pool if s.liveness is Liveness.ALIVE]
    elsewhere = [s for s in pool if s.liveness is Liveness.UNKNOWN]
    words: list[str] = []
    status: Literal["ok", "warn"] = "ok"
    remove: str | None = None
    if left:
        status, remove = "warn", _remove_command(left)
        batches = ", ".join(sorted({s.batch_id or "?" for s in left}))
        words.append(
            f"{len(left)} prepared sandbox(es) left by batch {batches}, whose process is gone; "
            f"remove them with: {remove}"
        )
    if live:
        batches = ", ".join(sorted({s.batch_id or "?" for s in live}))
        words.append(f"{len(live)} held by running batch {batches} (released when it ends)")
    if elsewhere:
        status = "warn"
        ids = " ".join(s.sandbox_id for s in elsewhere)
        words.append(
            f"{len(elsewhere)} made on another host or PID namespace: remove them there, or by id "
            f"(`opencode-tui sweep {ids}`) once their batch has ended"
        )
    if not words:
        words.append(f"no prepared sandbox of owner {owner} exists")
    return WarmCheck(
        name="warm leftovers", status=status, detail="; ".join(words) + note, sandboxes=pool, remove=remove
    )


def _prepares_ahead(name: str) -> bool:
    try:
        return registry.get(name).capabilities.warm
    except registry.PluginLoadError:
        return False


async def warm_checks(config: AgentConfig, runs_dir: Path) -> list[WarmCheck]:
    """The recent batches of ``runs_dir`` that were to prepare ahead, latest first, then the leftovers."""
    records = [
        r
        for r in recent_batches(runs_dir, LOOKED_AT)
        if r.warm_depth > 0 or r.warm_not_used is not None or (r.warm is not None and r.warm.active)
    ]
    checks = [batch_check(r, runs_dir) for r in records[:SHOWN]]
    if not checks:
        where = runs_dir / BATCHES_FILE
        words = (
            f"no recent batch in {runs_dir} prepared sandboxes ahead"
            if where.exists()
            else f"no batch recorded in {runs_dir} ({BATCHES_FILE}; --runs-dir names another)"
        )
        checks.append(WarmCheck(name="warm pool", status="ok", detail=words))
    checks.append(await leftovers_check(config))
    return checks
