"""A batch's failures grouped by kind × stage × a short evidence signature, with counts and run ids.

"27 of 200 failed: 21 model_stalled at agent (model.proxy status=504), 6 provider_oom_killed at agent"
is one glance. The same grouping feeds the batch summary on stderr, ``opencode-tui runs --batch ID``
(and its ``--json``), the TUI's batch screen and ``opencode-tui report --batch ID``: they cannot disagree.

A task is grouped once, by what decided it: the deciding failure of its deciding (last) attempt. A task
whose first attempt failed with X and whose retry failed with Y is one Y; one whose retry scored is in
no group (its attempts are still listed, each on its own row, where attempts are listed).

The signature is taken when the episode ends (``evidence_signature`` of the deciding failure's
evidence, recorded on the result as ``failure_evidence``): the source of the first observation and the
few fields of it that say *what* happened (a status, a signal, a timeout), never the ones that say
*which* call or container (ids, times, paths), so two episodes that failed the same way share it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.failures import Evidence

if TYPE_CHECKING:  # (the episode's record imports evidence_signature from here)
    from opencode_tui_core.artifacts import RunInfo
    from opencode_tui_core.events import OutcomeDecided

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


class Decided(Protocol):
    """What grouping reads of an attempt: an ``EpisodeResult`` (a result line), or ``RecordedAttempt``
    (an attempt's run directory read back)."""

    @property
    def task_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def run_id(self) -> str: ...
    @property
    def failure_kind(self) -> str | None: ...
    @property
    def failure_stage(self) -> str | None: ...
    @property
    def failure_class(self) -> str | None: ...
    @property
    def failure_evidence(self) -> str | None: ...


@dataclass(frozen=True)
class RecordedAttempt:
    """One attempt as its run directory recorded it: run.json's outcome, the signature of the outcome
    event's evidence (the deciding failure's, as on the result line)."""

    task_id: str
    attempt: int
    run_id: str
    failure_kind: str | None
    failure_stage: str | None
    failure_class: str | None
    failure_evidence: str | None

    @classmethod
    def of(cls, info: RunInfo, outcome: OutcomeDecided | None) -> RecordedAttempt:
        o = info.outcome
        kind = o.failure_kind if o is not None else None
        # The outcome event's evidence is the deciding failure's (one the controller did not live to
        # decide, ``run_interrupted``, has none).
        evidence = outcome.evidence if outcome is not None and outcome.failure_kind == kind else []
        return cls(
            task_id=info.task_id,
            attempt=info.attempt,
            run_id=info.run_id,
            failure_kind=kind,
            failure_stage=o.failure_stage if o is not None else None,
            failure_class=o.failure_class if o is not None else None,
            failure_evidence=evidence_signature(evidence),
        )


D = TypeVar("D", bound=Decided)


def deciding(results: Iterable[D]) -> list[D]:
    """Each task's deciding attempt: its last (the highest attempt number; of two with the same number,
    the one given later, so a result line given after its run directory's record wins), in the order
    the tasks first appear."""
    last: dict[str, D] = {}
    for r in results:
        seen = last.get(r.task_id)
        if seen is None or r.attempt >= seen.attempt:
            last[r.task_id] = r
    return list(last.values())


def group_failures(results: Iterable[Decided]) -> list[FailureGroup]:
    """Each task's deciding failure (``deciding``: of its last attempt), grouped, the tasks whose last
    attempt carries no failure kind left out; largest group first, then by kind, stage and signature
    (a stable order: the screen's rows do not jump between refreshes)."""
    groups: dict[tuple[str, str | None, str | None], FailureGroup] = {}
    for r in deciding(results):
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


def groups_line(results: Sequence[Decided]) -> str:
    """``failures in 2 of 6: 1 model_server_error at agent (model.proxy status=500), 1 ...`` ('' if none);
    6: the tasks."""
    groups = group_failures(results)
    if not groups:
        return ""
    failed = sum(g.count for g in groups)
    # "failures in", not "failed": an episode counted as zero (an oom) was scored, and has a failure.
    return f"failures in {failed} of {len(deciding(results))}: " + ", ".join(g.words() for g in groups)
