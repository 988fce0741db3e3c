"""SandboxSession: run one harness under the supervisor and close it with confirmed cleanup.

States: ``new → staging → launched → finalizing → closing → closed``.

- Staging uploads the supervisor and the run inputs. A close during staging prevents the launch.
- ``finalize()`` requests a stop and waits for the supervisor's receipt within the close budget.
  Only a positive receipt confirms cleanup; only then the ``collect`` hook runs (exactly once).
  No transcript snapshot, export or verification may happen before that.
- Unconfirmed cleanup keeps the session closing and retryable; for an owned sandbox the caller falls
  back to destroying it (``release()``), which is the authority.
- ``finalize``/``release``/``close`` are idempotent: concurrent or retried calls share one task.
- A closed or invalid session refuses work: nothing ever falls back to running on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from core.events import CleanupObserved, CleanupStep, Event, StepState
from core.runtime.access import SESSION_DIR_MODE
from core.runtime.supervisor_client import (
    SUPERVISOR_FILE,
    CleanupReceipt,
    ReceiptError,
    SessionPaths,
    budgets,
    launch_script,
    parse_receipt,
    remove_session_dir_script,
    stop_script,
    supervisor_source,
)
from core.sandbox.base import ExecResult, OutputCallback, Sandbox, SandboxError, describe_exit
from core.sandbox.tarsafe import tree_tar


class SessionState(StrEnum):
    NEW = "new"
    STAGING = "staging"
    LAUNCHED = "launched"
    FINALIZING = "finalizing"
    CLOSING = "closing"
    CLOSED = "closed"


class SessionRefused(RuntimeError):
    """The session cannot do this (closed, closing, already executed): nothing ran."""


class ClosedBeforeLaunch(RuntimeError):
    """Close was requested while inputs were being staged; the harness never started."""


class CleanupUnconfirmed(RuntimeError):
    """No positive cleanup receipt within the close budget; the launch outcome is unknown."""

    def __init__(self, message: str, receipt_text: str = "") -> None:
        super().__init__(message)
        self.receipt_text = receipt_text


Stage = Callable[[Sandbox], Awaitable[None]]
Collect = Callable[[Sandbox, CleanupReceipt], Awaitable[None]]
Emit = Callable[[Event], Any]


class SandboxSession:
    """One harness run inside one sandbox (owned or borrowed), with a supervisor and a receipt."""

    def __init__(
        self,
        sandbox: Sandbox,
        session_dir: str,
        *,
        run_timeout_s: float,
        close_timeout_s: float,
        python: str = "python3",
        emit: Emit | None = None,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.sandbox = sandbox
        # The sandbox user's (uid, gid): the session dir and its files are staged as theirs, 0700.
        self.owner = owner
        self.paths = SessionPaths.of(session_dir)
        self.budgets = budgets(run_timeout_s, close_timeout_s)
        self.python = python
        self._emit = emit or (lambda _e: None)
        self.state = SessionState.NEW
        self.launch_started = False
        self.receipt: CleanupReceipt | None = None
        self.collect_error: BaseException | None = None
        self.released = False
        self._staging: asyncio.Task[None] | None = None
        self._finalize_task: asyncio.Task[CleanupReceipt] | None = None
        self._release_task: asyncio.Task[None] | None = None
        self._collect: Collect | None = None
        self._collected = False
        self._close_requested = False

    # ---- execute -------------------------------------------------------------------------------

    async def execute(
        self,
        harness_argv: Sequence[str],
        *,
        stage: Stage | None = None,
        collect: Collect | None = None,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Stage, launch the harness under the supervisor, and wait for it (within the exec deadline).

        A non-zero harness exit does not raise: the receipt and artifacts tell what happened. On any
        error or cancellation the session is finalized (stop, confirm, collect) before re-raising.
        """
        if self.state is not SessionState.NEW or self._close_requested:
            raise SessionRefused(
                f"session is {self.state.value}; a session runs one harness and is then closed"
            )
        self._collect = collect
        self.state = SessionState.STAGING
        # Staging is shielded: a cancelled caller must not leave a half-uploaded session behind
        # that a close could race with; close joins it instead.
        self._staging = asyncio.ensure_future(self._stage(stage, stdin))
        try:
            await asyncio.shield(self._staging)
            if self._close_requested:
                raise ClosedBeforeLaunch("the session was closed while its inputs were staged; nothing ran")
            self.state = SessionState.LAUNCHED
            self.launch_started = True
            argv = launch_script(
                self.paths.session_dir,
                self.python,
                harness_argv,
                self.budgets.run_timeout,
                self.budgets.cleanup_timeout,
                stdin_file="stdin" if stdin is not None else None,
            )
            return await self.sandbox.exec(
                argv, cwd=cwd, env=env, timeout=self.budgets.exec_timeout, on_output=on_output
            )
        except BaseException:
            with contextlib.suppress(BaseException):
                await asyncio.shield(self.finalize())
            raise

    async def _stage(self, stage: Stage | None, stdin: bytes | None) -> None:
        # One upload creates the session dir with the supervisor and the harness input.
        files: dict[str, tuple[bytes | None, int]] = {SUPERVISOR_FILE: (supervisor_source(), 0o644)}
        if stdin is not None:
            files["stdin"] = (stdin, 0o600)
        root_mode = SESSION_DIR_MODE if self.owner is not None else None
        await self.sandbox.upload_tar(
            self.paths.session_dir, tree_tar(files, owner=self.owner, root_mode=root_mode)
        )
        if stage is not None:
            await stage(self.sandbox)

    # ---- finalize / release / close ------------------------------------------------------------

    async def finalize(self) -> CleanupReceipt:
        """Stop the harness and confirm cleanup; then collect artifacts once. Idempotent and shared.

        Raises CleanupUnconfirmed when no positive receipt arrived; the session stays closing and a
        later call retries (a collect that already ran is not repeated).
        """
        self._close_requested = True
        task = self._finalize_task
        # A second caller joins the close under way (it returns only once collect has finished); a
        # failed or cancelled close is started again.
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            self._finalize_task = asyncio.ensure_future(self._finalize())
        return await asyncio.shield(self._finalize_task)

    async def _finalize(self) -> CleanupReceipt:
        if self.state in (SessionState.NEW, SessionState.STAGING, SessionState.LAUNCHED):
            self.state = SessionState.FINALIZING
        if self._staging is not None and not self._staging.done():
            # Let an in-flight upload finish (bounded) so the fence below sees a consistent dir.
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self._staging), self.budgets.cleanup_timeout)
        if self.receipt is None:
            self.receipt = await self._stop_and_confirm()
        if self.launch_started and not self._collected and self._collect is not None:
            self._collected = True  # once, even if it fails: a failed collect is recorded, not retried
            try:
                await asyncio.wait_for(self._collect(self.sandbox, self.receipt), self.budgets.close_timeout)
            except Exception as exc:
                self.collect_error = exc
        self._collected = True
        self.state = SessionState.CLOSING
        return self.receipt

    async def _stop_and_confirm(self) -> CleanupReceipt:
        try:
            r = await self.sandbox.exec(
                stop_script(self.paths.session_dir, self.budgets.stop_timeout),
                timeout=self.budgets.stop_exec_timeout,
            )
        except SandboxError as exc:
            self._cleanup_event(StepState.FAILED, f"stop request failed: {exc}")
            raise CleanupUnconfirmed(f"cleanup not confirmed: the stop request failed: {exc}") from exc
        text = r.stdout.decode("utf-8", "replace")
        try:
            receipt = parse_receipt(text)
        except ReceiptError as exc:
            why = r.stderr.decode("utf-8", "replace").strip() or str(exc)
            if not self.launch_started and "session directory is missing" in why:
                # Staging never created the directory, so the launch script (which exits when the
                # directory is missing) cannot have started anything: nothing ran, nothing to clean.
                receipt = CleanupReceipt(cleanup_confirmed=True, return_code=None)
                self._emit(
                    CleanupObserved(
                        step=CleanupStep.RECEIPT,
                        state=StepState.OK,
                        reason="nothing was launched",
                        data=receipt.model_dump(),
                    )
                )
                return receipt
            if not r.observed:
                why = f"the stop request did not finish within {self.budgets.stop_exec_timeout:g}s ({why})"
            self._cleanup_event(StepState.FAILED, why)
            raise CleanupUnconfirmed(f"cleanup not confirmed: {why}", text) from exc
        data = receipt.model_dump()
        self._emit(CleanupObserved(step=CleanupStep.RECEIPT, state=StepState.OK, data=data))
        self._emit(
            CleanupObserved(
                step=CleanupStep.DESCENDANTS,
                state=StepState.OK if receipt.error is None else StepState.FAILED,
                reason=receipt.error,
                data={"descendants_killed": receipt.descendants_killed},
            )
        )
        return receipt

    def _cleanup_event(self, state: StepState, reason: str) -> None:
        self._emit(CleanupObserved(step=CleanupStep.RECEIPT, state=state, reason=reason))

    async def release(self) -> None:
        """Owned: destroy the sandbox. Borrowed: remove our session dir, then disconnect. Idempotent."""
        self._close_requested = True
        if self.released:
            return
        if self._release_task is None or (self._release_task.done() and self._release_task.exception()):
            self._release_task = asyncio.ensure_future(self._release())
        await asyncio.shield(self._release_task)

    async def _release(self) -> None:
        if not self.sandbox.owned:
            r = await self.sandbox.exec(remove_session_dir_script(self.paths.session_dir), timeout=30)
            if not r.ok:
                reason = r.stderr.decode("utf-8", "replace").strip() or describe_exit(r.exit_code, r.signal)
                self._emit(
                    CleanupObserved(step=CleanupStep.SANDBOX_RELEASED, state=StepState.FAILED, reason=reason)
                )
                raise SandboxError(
                    f"could not remove the session directory from the borrowed sandbox: {reason}"
                )
        await self.sandbox.release()
        self.released = True
        self.state = SessionState.CLOSED
        self._emit(
            CleanupObserved(
                step=CleanupStep.SANDBOX_RELEASED,
                state=StepState.OK,
                data={
                    "owned": self.sandbox.owned,
                    "action": "destroyed" if self.sandbox.owned else "disconnected",
                },
            )
        )

    async def close(self) -> CleanupReceipt | None:
        """Finalize, then release. An owned sandbox whose cleanup is unconfirmed is destroyed anyway
        (the provider's teardown is the authority) and the error is re-raised; a borrowed one stays
        closing so the close can be retried."""
        try:
            receipt = await self.finalize()
        except CleanupUnconfirmed:
            if self.sandbox.owned:
                await self.release()
            raise
        await self.release()
        return receipt
