"""Failure records: stage, class, cause chain, typed details and the FailureEvent itself."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from opencode_tui_core.failures.evidence import Evidence, utcnow
from opencode_tui_core.failures.kinds import check_kind


class FailureStage(StrEnum):
    """Where in the episode the failure happened; classification depends on it.

    The episode stamps the stage it is in on every failure it receives (a provider only knows what
    failed, not what the episode was doing). ``cleanup`` is what records written before the close was
    split into closing, transcript and release carry; it is still read, and means "after the agent".
    """

    ADMISSION = "admission"
    SEED = "seed"
    INSTALL = "install"
    AGENT = "agent"
    CLOSING = "closing"
    TRANSCRIPT = "transcript"
    VERIFICATION = "verification"
    RELEASE = "release"
    CLEANUP = "cleanup"

    @property
    def after_agent_cleanup(self) -> bool:
        """A stage about closing the sandbox rather than about the task or the agent."""
        return self in _CLOSE_STAGES


_CLOSE_STAGES = frozenset(
    {FailureStage.CLOSING, FailureStage.TRANSCRIPT, FailureStage.RELEASE, FailureStage.CLEANUP}
)


class FailureClass(StrEnum):
    """Who the failure is attributed to.

    ``model``: the agent/model's own behaviour (e.g. it exhausted memory or its time budget).
    ``evaluation``: the evaluation apparatus (sandbox, network, verifier, model endpoint) failed.
    ``unknown``: the evidence does not allow a decision; kept unknown on purpose.
    """

    MODEL = "model"
    EVALUATION = "evaluation"
    UNKNOWN = "unknown"


class Delivery(StrEnum):
    """Whether a command submission reached the sandbox: only NOT_SENT may ever be resubmitted."""

    NOT_SENT = "not_sent"
    POSSIBLY_DELIVERED = "possibly_delivered"
    DELIVERED = "delivered"


class FailureCause(BaseModel):
    """An exception, flattened: type, message, and the chain of causes behind it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    message: str
    cause: FailureCause | None = None

    @classmethod
    def from_exception(cls, exc: BaseException, _depth: int = 0) -> FailureCause:
        inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        return cls(
            type=f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
            message=str(exc)[:2000],
            cause=cls.from_exception(inner, _depth + 1) if inner is not None and _depth < 8 else None,
        )

    def chain(self) -> list[FailureCause]:
        out: list[FailureCause] = []
        node: FailureCause | None = self
        while node is not None:
            out.append(node)
            node = node.cause
        return out


class _Details(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OomVictim(StrEnum):
    """What the OOM kill took: a command the agent ran (OpenCode survived and finished its turn), the
    agent itself (OpenCode or its supervisor died), or not known (no receipt)."""

    COMMAND = "command"
    AGENT = "agent"
    UNKNOWN = "unknown"


class OomDetails(_Details):
    detail_type: Literal["oom"] = "oom"
    container_id: str | None = None
    memory_limit_bytes: int | None = None
    exit_code: int | None = None
    victim: OomVictim | None = None


class DeadlineDetails(_Details):
    detail_type: Literal["deadline"] = "deadline"
    budget_s: float
    elapsed_s: float | None = None
    timed_out_observed: bool = False


class CommandDetails(_Details):
    detail_type: Literal["command"] = "command"
    execution_id: str | None = None
    delivery: Delivery = Delivery.POSSIBLY_DELIVERED
    submissions: int = 1
    exit_code: int | None = None


class HttpDetails(_Details):
    detail_type: Literal["http"] = "http"
    method: str
    url: str
    status: int | None = None
    body_excerpt: str | None = None


class CleanupDetails(_Details):
    detail_type: Literal["cleanup"] = "cleanup"
    receipt: dict[str, Any] | None = None
    fallback: str | None = None


class VerificationDetails(_Details):
    detail_type: Literal["verification"] = "verification"
    exit_code: int | None = None
    output_excerpt: str | None = None


class ModelCallDetails(_Details):
    detail_type: Literal["model_call"] = "model_call"
    call_id: str
    status: int | None = None
    attempts: int = 1


class PermissionDetails(_Details):
    """A permission OpenCode asked for that nobody could grant (``agent_permission_rejected``)."""

    detail_type: Literal["permission"] = "permission"
    permission: str  # OpenCode's permission name, e.g. ``external_directory``
    patterns: list[str] = Field(default_factory=list)  # what it was asked for, e.g. ``/etc/*``
    profile: str  # ``runtime.permissions`` in effect
    call_id: str | None = None  # the tool call that asked, when known
    rejected_total: int = 1  # rejections in the run (the first one is named above)


class GenericDetails(_Details):
    detail_type: Literal["generic"] = "generic"
    data: dict[str, Any] = Field(default_factory=dict)


FailureDetails = Annotated[
    OomDetails
    | DeadlineDetails
    | CommandDetails
    | HttpDetails
    | CleanupDetails
    | VerificationDetails
    | ModelCallDetails
    | PermissionDetails
    | GenericDetails,
    Field(discriminator="detail_type"),
]


class FailureEvent(BaseModel):
    """One failure, as observed: what failed, where, why, and what was seen.

    ``failure_class`` is optional: a producer that knows better (e.g. a provider that saw
    authoritative evidence) may supply it; otherwise the classifier decides from (kind, stage).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    stage: FailureStage
    operation: str
    message: str
    http_status: int | None = Field(default=None, ge=100, le=599)
    cause: FailureCause | None = None
    evidence: list[Evidence] = Field(default_factory=list)
    details: FailureDetails | None = None
    failure_class: FailureClass | None = None
    occurred_at: datetime = Field(default_factory=utcnow)

    @field_validator("kind")
    @classmethod
    def _known_or_warned(cls, value: str) -> str:
        return check_kind(value)

    @classmethod
    def from_exception(cls, exc: BaseException, **fields: Any) -> FailureEvent:
        fields.setdefault("message", str(exc)[:2000] or type(exc).__name__)
        return cls(cause=FailureCause.from_exception(exc), **fields)


class Recovery(StrEnum):
    """How a provider went on after a failure it did not raise (see ``Sandbox.on_recovered``)."""

    FOLLOWED_EXECUTION_ID = "followed_execution_id"  # output stream lost; the exit was read by execution id
    RESUBMITTED = "resubmitted"  # a submission proven not to have started was sent again
    RETURNED_UNOBSERVED = "returned_unobserved"  # the hard cap expired; exec returned, its exit unknown
    REATTACHED = "reattached"  # a terminal's socket dropped; re-attached from where its output stopped
    # A terminal's socket broke for good (the shell is gone; its read ended): nothing else was affected.
    TERMINAL_ENDED = "terminal_ended"
