"""SandboxSession: run one harness under the supervisor and close it with confirmed cleanup.

States: ``new → staging → launched → finalizing → closing → closed``.

- Staging uploads the supervisor and the run inputs. A close during staging prevents the launch.
- ``finalize()`` requests a stop and waits for the supervisor's receipt within the close budget.
  One :class:`CloseDeadline` bounds the whole close (stop, collect, release and whatever the caller
  does in between): it is computed once, at the first close step, and every step gets what remains;
  no request starts once it is spent (a retried finalize then fails at once).
  Only a positive receipt confirms cleanup; only then the ``collect`` hook runs (exactly once).
  No transcript snapshot, export or verification may happen before that.
- Unconfirmed cleanup keeps the session closing and retryable; for an owned sandbox the caller falls
  back to destroying it (``release()``), which is the authority. A borrowed sandbox is never
  destroyed: its release keeps the session directory (stop file, claim, pid) in the sandbox, and a
  later close retries from it (``SandboxSession.reattach``).
- ``finalize``/``release``/``close`` are idempotent: concurrent or retried calls share one task.
- A closed or invalid session refuses work: nothing ever falls back to running on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import TypeVar

from opencode_tui_core.events import CleanupObserved, CleanupStep, Event, StepState
from opencode_tui_core.runtime.access import SESSION_DIR_MODE
from opencode_tui_core.runtime.supervisor_client import (
    RELEASE_RESERVE_SHARE,
    SUPERVISOR_FILE,
    CleanupReceipt,
    ReceiptError,
    SessionPaths,
    budgets,
    confirmed,
    launch_script,
    parse_receipt,
    remove_session_dir_script,
    stop_script,
    stop_window,
    supervisor_source,
)
from opencode_tui_core.sandbox.base import (
    ExecResult,
    OutputCallback,
    Sandbox,
    SandboxError,
    SingleFlight,
    describe_exit,
)
from opencode_tui_core.sandbox.tarsafe import tree_tar

T = TypeVar("T")

# The least time an owned sandbox's destruction gets, even when the close budget is spent.
RELEASE_FLOOR_S = 1.0
# A stop request is not started with less close budget than this left: it could not even start.
STOP_MIN_WINDOW_S = 0.5


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


class CloseBudgetSpent(TimeoutError):
    """A close step found no close budget left (it did not start) or ran out of it."""

    def __init__(self, step: str, budget_s: float, started: bool) -> None:
        when = "ran out of it" if started else "was not started"
        super().__init__(f"the close budget of {budget_s:g}s was spent: {step} {when}")
        self.step = step
        self.started = started


class CloseDeadline:
    """One budget for the whole close, computed once; every step gets what remains.

    ``remaining()`` is what a step before the release may use: the release keeps a reserve
    (``RELEASE_RESERVE_SHARE`` of the budget) so that a stalled stop cannot leave no time to destroy
    an owned sandbox. ``remaining(for_release=True)`` is everything left. Time spent inside
    ``suspended()`` (verification, which has its own deadline) does not count.
    """

    def __init__(
        self,
        budget_s: float,
        *,
        reserve_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_s = float(budget_s)
        self.reserve_s = self.budget_s * RELEASE_RESERVE_SHARE if reserve_s is None else float(reserve_s)
        self._clock = clock
        self._started = clock()
        self._suspended_total = 0.0
        self._suspended_at: float | None = None

    @property
    def spent_s(self) -> float:
        now = self._clock()
        paused = self._suspended_total + (now - self._suspended_at if self._suspended_at is not None else 0.0)
        return now - self._started - paused

    def remaining(self, *, for_release: bool = False) -> float:
        left = self.budget_s - self.spent_s
        if not for_release:
            left -= self.reserve_s
        return max(left, 0.0)

    def expired(self, *, for_release: bool = False) -> bool:
        return self.remaining(for_release=for_release) <= 0.0

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Stop the clock, e.g. while the verifier runs under its own deadline."""
        if self._suspended_at is not None:
            yield
            return
        self._suspended_at = self._clock()
        try:
            yield
        finally:
            self._suspended_total += self._clock() - self._suspended_at
            self._suspended_at = None

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Let the clock run inside a ``suspended()`` span: a close-side step taken during
        verification (the OOM inspect after a failed verifier) spends the close budget."""
        if self._suspended_at is None:
            yield
            return
        self._suspended_total += self._clock() - self._suspended_at
        self._suspended_at = None
        try:
            yield
        finally:
            self._suspended_at = self._clock()

    async def run(
        self, aw: Awaitable[T], *, step: str, for_release: bool = False, cap: float | None = None
    ) -> T:
        """Await ``aw`` within what remains (and ``cap``); raise CloseBudgetSpent when nothing is
        left, without starting it."""
        left = self.remaining(for_release=for_release)
        if cap is not None:
            left = min(left, cap)
        if left <= 0.0:
            if asyncio.iscoroutine(aw):
                aw.close()  # never started: no request goes out after the deadline
            raise CloseBudgetSpent(step, self.budget_s, started=False)
        try:
            return await asyncio.wait_for(aw, left)
        except TimeoutError as exc:
            if isinstance(exc, CloseBudgetSpent):
                raise
            raise CloseBudgetSpent(step, self.budget_s, started=True) from exc


Stage = Callable[[Sandbox], Awaitable[None]]
Collect = Callable[[Sandbox, CleanupReceipt], Awaitable[None]]
Emit = Callable[[Event], object]


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
        self._release_once = SingleFlight(self._release)  # one release in flight, see SingleFlight
        self._collect: Collect | None = None
        self._collected = False
        self._close_requested = False
        self.close_deadline: CloseDeadline | None = None

    def begin_close(self, deadline: CloseDeadline | None = None) -> CloseDeadline:
        """The close deadline: the first call fixes it (``deadline``, or the session's close budget
        from now); later calls return the same one, so a retried close never gets a fresh budget."""
        if self.close_deadline is None:
            self.close_deadline = deadline or CloseDeadline(self.budgets.close_timeout)
        return self.close_deadline

    # ---- execute -------------------------------------------------------------------------------

    async def execute(
        self,
        harness_argv: Sequence[str],
        *,
        stage: Stage | None = None,
        files: Mapping[str, tuple[bytes | None, int]] | None = None,
        collect: Collect | None = None,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_output: OutputCallback | None = None,
        clock: tuple[str, float] | None = None,
    ) -> ExecResult:
        """Stage, launch the harness under the supervisor, and wait for it (within the exec deadline).

        ``clock`` (a file in the session dir, a wait cap): the harness is started ahead of its task and
        its run deadline starts when that file appears (``launch_script``); the exec's own deadline
        grows by the wait cap.

        ``files`` (relative path → (content or None for a directory, mode)) go into the session dir
        in the same upload as the supervisor; ``stage`` runs after it, for anything else.

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
        self._staging = asyncio.ensure_future(self._stage(stage, stdin, files))
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
                clock=clock,
            )
            timeout = self.budgets.exec_timeout + (clock[1] if clock else 0.0)
            return await self.sandbox.exec(argv, cwd=cwd, env=env, timeout=timeout, on_output=on_output)
        except BaseException:
            with contextlib.suppress(BaseException):
                await asyncio.shield(self.finalize())
            raise

    async def _stage(
        self, stage: Stage | None, stdin: bytes | None, extra: Mapping[str, tuple[bytes | None, int]] | None
    ) -> None:
        # One upload creates the session dir with the supervisor, the harness's files and its input.
        files: dict[str, tuple[bytes | None, int]] = dict(extra or {})
        files[SUPERVISOR_FILE] = (supervisor_source(), 0o644)
        if stdin is not None:
            files["stdin"] = (stdin, 0o600)
        root_mode = SESSION_DIR_MODE if self.owner is not None else None
        await self.sandbox.upload_tar(
            self.paths.session_dir, tree_tar(files, owner=self.owner, root_mode=root_mode)
        )
        if stage is not None:
            await stage(self.sandbox)

    def handover(self, emit: Emit, collect: Collect | None) -> None:
        """A session launched ahead of its task (the warm pool) becomes an episode's: its events and
        its collect hook are that episode's from now on."""
        self._emit = emit
        self._collect = collect

    # ---- finalize / release / close ------------------------------------------------------------

    async def finalize(self) -> CleanupReceipt:
        """Stop the harness and confirm cleanup; then collect artifacts once. Idempotent and shared.

        Raises CleanupUnconfirmed when no positive receipt arrived; the session stays closing and a
        later call retries (a collect that already ran is not repeated).
        """
        self._close_requested = True
        self.begin_close()
        task = self._finalize_task
        # A second caller joins the close under way (it returns only once collect has finished); a
        # failed or cancelled close is started again.
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._finalize_task = asyncio.ensure_future(self._finalize())
        return await asyncio.shield(task)

    async def _finalize(self) -> CleanupReceipt:
        deadline = self.begin_close()
        if self.state in (SessionState.NEW, SessionState.STAGING, SessionState.LAUNCHED):
            self.state = SessionState.FINALIZING
        if self._staging is not None and not self._staging.done():
            # Let an in-flight upload finish (bounded) so the fence below sees a consistent dir.
            with contextlib.suppress(BaseException):
                await deadline.run(
                    asyncio.shield(self._staging), step="wait for staging", cap=self.budgets.cleanup_timeout
                )
        if self.receipt is None:
            self.receipt = await self._stop_and_confirm(deadline)
        if self.launch_started and not self._collected and self._collect is not None:
            self._collected = True  # once, even if it fails: a failed collect is recorded, not retried
            try:
                await deadline.run(self._collect(self.sandbox, self.receipt), step="collect")
            except Exception as exc:
                self.collect_error = exc
        self._collected = True
        self.state = SessionState.CLOSING
        return self.receipt

    async def _stop_and_confirm(self, deadline: CloseDeadline) -> CleanupReceipt:
        available = deadline.remaining()
        if available < STOP_MIN_WINDOW_S:
            # A retried close after the budget was spent: no stop request starts past the deadline
            # (nor one that could not even start an exec in what is left).
            why = (
                f"the close budget of {deadline.budget_s:g}s was spent ({available:.2f}s left before "
                "the release); no stop request was started"
            )
            self._cleanup_event(StepState.FAILED, why)
            raise CleanupUnconfirmed(f"cleanup not confirmed: {why}")
        script_wait, exec_deadline = stop_window(available)
        try:
            r = await self.sandbox.exec(
                stop_script(self.paths.session_dir, max(script_wait, 0.1)), timeout=exec_deadline
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
                why = f"the stop request did not finish within {exec_deadline:.3g}s ({why})"
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
        """Owned: destroy the sandbox. Borrowed: remove our session dir, then disconnect; when cleanup is
        unconfirmed the session dir stays (see :attr:`keeps_session_dir`). Idempotent."""
        self._close_requested = True
        if self.released:
            return
        self.begin_close()
        await self._release_once()

    @property
    def keeps_session_dir(self) -> bool:
        """Borrowed, launched and not confirmed: the session directory (stop file, claim, pid, a
        late receipt) stays in the sandbox, so a later close can retry (:meth:`reattach`)."""
        return not self.sandbox.owned and self.launch_started and not confirmed(self.receipt)

    async def _release(self) -> None:
        deadline = self.begin_close()
        kept = self.keeps_session_dir
        if not self.sandbox.owned and not kept:
            left = min(deadline.remaining(for_release=True), 30.0)
            if left <= 0.0:
                raise CloseBudgetSpent("removing the session directory", deadline.budget_s, started=False)
            r = await self.sandbox.exec(remove_session_dir_script(self.paths.session_dir), timeout=left)
            if not r.ok:
                reason = r.stderr.decode("utf-8", "replace").strip() or describe_exit(r.exit_code, r.signal)
                self._emit(
                    CleanupObserved(step=CleanupStep.SANDBOX_RELEASED, state=StepState.FAILED, reason=reason)
                )
                raise SandboxError(
                    f"could not remove the session directory from the borrowed sandbox: {reason}"
                )
        # Destroying an owned sandbox is the authority when cleanup is unconfirmed: it is attempted
        # even with the budget spent, for at most RELEASE_FLOOR_S.
        await asyncio.wait_for(
            self.sandbox.release(), max(deadline.remaining(for_release=True), RELEASE_FLOOR_S)
        )
        self.released = True
        self.state = SessionState.CLOSED
        self._emit(
            CleanupObserved(
                step=CleanupStep.SANDBOX_RELEASED,
                state=StepState.OK,
                data={
                    "owned": self.sandbox.owned,
                    "action": "destroyed" if self.sandbox.owned else "disconnected",
                    **({"session_dir_kept": self.paths.session_dir} if kept else {}),
                },
                reason="cleanup is unconfirmed: the session directory stays for a later close"
                if kept
                else None,
            )
        )

    @classmethod
    def reattach(
        cls,
        sandbox: Sandbox,
        session_dir: str,
        *,
        close_timeout_s: float,
        emit: Emit | None = None,
    ) -> SandboxSession:
        """A later close of a session whose directory was kept (borrowed, cleanup unconfirmed): the
        stop protocol runs again on the same directory (its stop file and claim are still there, and
        a receipt the supervisor wrote since is found); nothing is ever launched from it."""
        session = cls(
            sandbox, session_dir, run_timeout_s=close_timeout_s, close_timeout_s=close_timeout_s, emit=emit
        )
        session.state = SessionState.LAUNCHED
        session.launch_started = True
        session._close_requested = True
        return session

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
