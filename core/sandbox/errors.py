"""Every exception of the sandbox layer, in one module: catching one of these catches it from any provider.

Providers raise these (never a look-alike of their own), so ``except SandboxFileNotFoundError`` in the
engine means the same thing for every provider. Provider-internal control flow (a retry signal that
never leaves the provider) may use private exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opencode_tui_core.failures import Evidence, FailureCause, FailureDetails, FailureEvent, FailureStage

# A failure's message is one line of a report, not a log: longer ones are cut here.
MESSAGE_CHARS = 2000


class SandboxError(Exception):
    """A provider operation failed; ``failure`` carries the structured FailureEvent when one applies."""

    def __init__(self, message: str, *, failure: FailureEvent | None = None):
        super().__init__(message)
        self.failure = failure


def sandbox_failure(
    kind: str,
    *,
    stage: FailureStage,
    operation: str,
    message: str,
    cause: BaseException | None = None,
    http_status: int | None = None,
    evidence: Sequence[Evidence] = (),
    details: FailureDetails | None = None,
) -> FailureEvent:
    """The FailureEvent a provider attaches to a ``SandboxError`` (every provider builds it here).

    ``stage`` is the provider's best knowledge (``seed`` for create/connect, ``agent`` on a running
    sandbox); the episode re-stamps it (``failure_of``). ``cause`` is the exception behind it.
    """
    return FailureEvent(
        kind=kind,
        stage=stage,
        operation=operation,
        message=message[:MESSAGE_CHARS],
        http_status=http_status,
        cause=FailureCause.from_exception(cause) if cause is not None else None,
        evidence=list(evidence),
        details=details,
    )


def sandbox_error(failure: FailureEvent, cause: BaseException | None = None) -> SandboxError:
    """A ``SandboxError`` carrying ``failure`` (its message), chained to ``cause``."""
    error = SandboxError(failure.message, failure=failure)
    if cause is not None:
        error.__cause__ = cause
    return error


def failure_of(exc: BaseException, *, kind: str, stage: FailureStage, operation: str) -> FailureEvent:
    """The one translation of an exception into a FailureEvent: a sandbox exception's own failure
    (kind, cause, evidence as the provider knew them) or, for an untyped exception, one of ``kind``
    at ``stage``. Callers that know the stage better re-stamp the typed one."""
    failure = getattr(exc, "failure", None)
    if isinstance(failure, FailureEvent):
        return failure
    return FailureEvent.from_exception(exc, kind=kind, stage=stage, operation=operation)


class SandboxClosedError(SandboxError):
    """The sandbox was released or never created: the operation is refused (no host fallback)."""


class ExpectedRefusal(SandboxError):
    """The provider confirmed, **before launching anything**, that it refuses the request.

    Example: the sandbox does not allow running commands as root (execd answers 403
    ``ROOT_NOT_ALLOWED`` to a submission that asked for uid 0, before any event). Nothing ran, so
    this is control flow, not a failure: ``failure`` is always ``None``, nothing is added to the
    sandbox's failures, and the caller may try again differently (e.g. without a user). Callers
    that catch ``SandboxError`` must test for this class first.
    """

    def __init__(self, message: str, *, operation: str, code: str | None, http_status: int | None):
        super().__init__(message, failure=None)
        self.operation = operation
        self.code = code
        self.http_status = http_status


class UnsafeArchiveError(SandboxError, ValueError):
    """A tar archive holds a member that could write outside its target."""


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """A path asked for (e.g. by ``download_tar``) does not exist inside the sandbox."""


# How much of a failed image build's log goes into the failure's evidence.
BUILD_LOG_TAIL_CHARS = 4000


class ImageBuildFailed(SandboxError):
    """Building a task's image failed or timed out (``image_build_failed`` at stage seed)."""


def image_build_failure(task: Any, message: str, log: str, *, source: str, **data: Any) -> ImageBuildFailed:
    """The typed failure of a task image's build, the end of the build log as evidence."""
    failure = FailureEvent(
        kind="image_build_failed",
        stage=FailureStage.SEED,
        operation="build task image",
        message=message,
        evidence=[
            Evidence(source=source, scope=task.image, data={"log_tail": log[-BUILD_LOG_TAIL_CHARS:], **data})
        ],
    )
    return ImageBuildFailed(message, failure=failure)
