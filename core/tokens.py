"""One definition of an episode's token totals, used by the batch line, run.json and the TUI.

``tokens``: every model call the recording proxy saw (title and compaction calls included).
``agent tokens``: what OpenCode's own transcript counts (its assistant messages only).
Unknown is ``None``, never 0: a sum covers only the calls that reported the field.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.events import ModelCall


class TokenTotals(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_cache_read: int | None = None
    tokens_reasoning: int | None = None


def _sum_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def token_totals(calls: Iterable[ModelCall]) -> TokenTotals:
    calls = list(calls)
    return TokenTotals(
        **{field: _sum_known(getattr(c, field) for c in calls) for field in TokenTotals.model_fields}
    )
