"""Which sandboxes ``sweep`` removes: the providers it asks, what they list, and the selection rules
(docs: opencode_tui/keep_commands.py's docstring says them as the user sees them).

Every sandbox considered carries our owner label. Named ids are taken as they are (a unique prefix of
``MIN_PREFIX``+ characters will do); ``--run``/``--batch`` take what carries those labels (a batch's
sandbox only once its creating process is gone); a bare sweep takes only leftovers: sandboxes whose
creating process is provably gone, not kept unless asked.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core import provider_registry as registry
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.invocation import Liveness, invocation_liveness
from opencode_tui_core.sandbox import kept
from opencode_tui_core.sandbox.base import (
    LABEL_BATCH,
    LABEL_INVOCATION,
    LABEL_POOL,
    LABEL_RUN,
    SandboxProvider,
    SandboxRecord,
)
from opencode_tui_core.sandbox.base import default_owner as default_owner
from opencode_tui_core.sandbox.providers import get_provider

MIN_PREFIX = 12  # the shortest id prefix a named sandbox may be given by (a Docker short id is 12)


class SweepRequest(BaseModel):
    """What the user asked to sweep."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(default_factory=list)
    run: str | None = None
    batch: str | None = None
    kept: bool = False  # a bare sweep also takes kept sandboxes

    @property
    def explicit(self) -> bool:
        return bool(self.ids or self.run or self.batch)


class SweepRefused(Exception):
    """Nothing is removed, for this reason (one line; ``{owner}`` stands for the owner label)."""


@dataclass(frozen=True)
class Found:
    """One sandbox of ours as listed, with the provider that removes it."""

    provider: SandboxProvider
    record: SandboxRecord

    @property
    def batch_id(self) -> str | None:
        return self.record.labels.get(LABEL_BATCH)

    @property
    def pool(self) -> str | None:
        """The batch whose warm pool prepared it (``opencode-tui.pool``); None: no pool's."""
        return self.record.labels.get(LABEL_POOL)

    @property
    def liveness(self) -> Liveness:
        """Whether the process that created it still runs."""
        return invocation_liveness(self.record.labels.get(LABEL_INVOCATION))


@dataclass
class Selection:
    chosen: list[Found] = field(default_factory=list)
    live: int = 0  # left: their creating process still runs
    elsewhere: int = 0  # left: made on another host or PID namespace (unknown liveness)
    kept: int = 0  # left: kept for debugging


def provider_names(choice: str) -> list[str]:
    """``all``: every provider whose listing needs nothing configured (a server is named explicitly)."""
    return registry.swept_by_default() if choice == "all" else [choice]


async def list_ours(
    names: list[str],
    owner: str | None,
    *,
    strict: bool = True,
    on_skip: Callable[[str, Exception], None] | None = None,
    config: AgentConfig | None = None,
) -> list[Found]:
    """Every sandbox the providers ``names`` (configured by ``config``) list for ``owner`` (None: any
    owner). A provider that cannot list raises when ``strict``, else is reported to ``on_skip`` and
    left out."""
    out: list[Found] = []
    for name in names:
        provider = get_provider(name, config)
        try:
            records = await provider.listed(owner=owner)
        except Exception as exc:
            if strict or on_skip is None:
                raise
            on_skip(name, exc)
            continue
        out.extend(Found(provider, r) for r in records)
    return out


def _match(ref: str, found: list[Found]) -> Found:
    exact = [item for item in found if item.record.sandbox_id == ref]
    if exact:
        return exact[0]
    prefixed = [item for item in found if len(ref) >= MIN_PREFIX and item.record.sandbox_id.startswith(ref)]
    if len(prefixed) == 1:
        return prefixed[0]
    if len(prefixed) > 1:
        raise SweepRefused(
            f"{ref!r} matches {len(prefixed)} sandboxes; give more of the id; nothing was removed"
        )
    raise SweepRefused(
        f"{ref!r} is not a sandbox of ours (owner label {{owner}}); list ours with "
        "`opencode-tui sweep --dry-run --kept`; nothing was removed"
    )


def of_batch(found: list[Found], batch_id: str, run_ids: Collection[str] | None = None) -> list[Found]:
    """What carries the batch's id (and, given ``run_ids``, one of those runs' ids)."""
    return [
        item
        for item in found
        if item.batch_id == batch_id and (run_ids is None or item.record.labels.get(LABEL_RUN) in run_ids)
    ]


def of_pools(found: list[Found]) -> list[Found]:
    """What a batch's warm pool prepared (used by an attempt or not)."""
    return [item for item in found if item.pool is not None]


def leftovers(found: list[Found]) -> list[Found]:
    """Those whose creating process is not known to run (a batch's sandbox while its worker lives,
    even one wrongly thought lost, is never a leftover)."""
    return [item for item in found if item.liveness is not Liveness.ALIVE]


def select(request: SweepRequest, found: list[Found]) -> Selection:
    """The sandboxes ``request`` removes among ``found``; raises SweepRefused."""
    out = Selection()
    if request.ids:
        chosen = [_match(ref, found) for ref in request.ids]
        out.chosen = list({id(item): item for item in chosen}.values())
        return out
    if request.batch:
        carried = of_batch(found, request.batch, [request.run] if request.run else None)
        if not carried:
            what = f"batch {request.batch!r}" + (f" and run {request.run!r}" if request.run else "")
            raise SweepRefused(f"no sandbox of ours carries {what}; nothing was removed")
        out.chosen = leftovers(carried)
        out.live = len(carried) - len(out.chosen)  # the batch is still running there: not leftovers
        return out
    if request.run:
        out.chosen = [item for item in found if item.record.labels.get(LABEL_RUN) == request.run]
        if not out.chosen:
            raise SweepRefused(f"no sandbox of ours carries run {request.run!r}; nothing was removed")
        return out
    for item in found:
        live = item.liveness
        if live is Liveness.ALIVE:
            out.live += 1
        elif live is Liveness.UNKNOWN:
            out.elsewhere += 1
        elif kept.is_kept(item.record.provider, item.record.sandbox_id) and not request.kept:
            out.kept += 1
        else:
            out.chosen.append(item)
    return out


async def remove(item: Found) -> None:
    """Destroy one selected sandbox and forget it was kept."""
    await item.provider.remove(item.record.sandbox_id)
    kept.forget(item.record.provider, item.record.sandbox_id)
