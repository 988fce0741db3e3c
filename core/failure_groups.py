"""A batch's failures grouped by kind × stage × a short evidence signature, with counts and run ids.

"27 of 200 failed: 21 model_stalled at agent (model.proxy status=504), 6 provider_oom_killed at agent"
is one glance. The same grouping feeds the batch summary on stderr, ``opencode-tui runs --batch ID``
(and its ``--json``) and the TUI's batch screen: they cannot disagree.

The signature is taken when the episode ends (``evidence_signature`` of the deciding failure's
evidence, recorded on the result as ``failure_evidence``): the source of the first observation and the
few fields of it that say *what* happened (a status, a signal, a timeout), never the ones that say
*which* call or container (ids, times, paths), so two episodes that failed the same way share it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from core.failures import Evidence

if TYPE_CHECKING:  # (the episode's record imports evidence_signature from here)
    from core.episode.record import EpisodeResult

# Evidence fields that say what happened (in this order), never which call, container or time.
SIGNATURE_FIELDS = (
    "status",
    "action",
    "signal",
    "exit_code",
    "return_code",
    "timed_out",
    "oom_killed",
    "oom_kill",
    "state",
    "exists",
    "reachable",
    "reason",
)
SIGNATURE_CHARS = 48  # a signature is a glance, not the evidence (that is in the run's events)


def _value(v: Any) -> str | None:
    if v is None or v == "" or isinstance(v, dict | list):
        return None
    if isinstance(v, bool):
        return "yes" if v else "no"
    text = str(v).split(":", 1)[0]  # an error's class, not its message (which names ids)
    return text[:16]


def evidence_signature(evidence: Sequence[Evidence]) -> str | None:
    """``model.proxy status=500``: the first observation's source and its stable fields (None: none)."""
    if not evidence:
        return None
    first = evidence[0]
    parts = [first.source]
    for name in SIGNATURE_FIELDS:
        v = _value(first.data.get(name))
        if v is not None:
            parts.append(f"{name}={v}")
    error = first.data.get("error")
    if isinstance(error, str) and error and len(parts) == 1:
        parts.append(error.split(":", 1)[0][:24])
    return " ".join(parts)[:SIGNATURE_CHARS]


class FailureGroup(BaseModel):
    """Episodes that failed the same way."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    stage: str | None = None
    signature: str | None = None
    failure_class: str | None = None  # "model", "infra", ...: the first episode's (a kind has one)
    count: int = 0
    run_ids: list[str] = Field(default_factory=list)  # "" for an episode that never started
    task_ids: list[str] = Field(default_factory=list)

    def words(self) -> str:
        """``21 model_stalled at agent (model.proxy status=504)``."""
        where = f" at {self.stage}" if self.stage else ""
        sig = f" ({self.signature})" if self.signature else ""
        return f"{self.count} {self.kind}{where}{sig}"


def group_failures(results: Iterable[EpisodeResult]) -> list[FailureGroup]:
    """The results that carry a failure kind, grouped; largest group first, then by kind, stage and
    signature (a stable order: the screen's rows do not jump between refreshes)."""
    groups: dict[tuple[str, str | None, str | None], FailureGroup] = {}
    for r in results:
        if not r.failure_kind:
            continue
        key = (r.failure_kind, r.failure_stage, r.failure_evidence)
        group = groups.get(key)
        if group is None:
            group = groups[key] = FailureGroup(
                kind=r.failure_kind,
                stage=r.failure_stage,
                signature=r.failure_evidence,
                failure_class=r.failure_class,
            )
        group.count += 1
        group.run_ids.append(r.run_id)
        group.task_ids.append(r.task_id)
    return sorted(groups.values(), key=lambda g: (-g.count, g.kind, g.stage or "", g.signature or ""))


def groups_line(results: Sequence[EpisodeResult]) -> str:
    """``failures in 2 of 6: 1 model_server_error at agent (model.proxy status=500), 1 ...`` ('' if none)."""
    groups = group_failures(results)
    if not groups:
        return ""
    failed = sum(g.count for g in groups)
    # "failures in", not "failed": an episode counted as zero (an oom) was scored, and has a failure.
    return f"failures in {failed} of {len(results)}: " + ", ".join(g.words() for g in groups)
