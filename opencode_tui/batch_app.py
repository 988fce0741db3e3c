"""The TUI for several tasks: the batch engine (``opencode_tui_core.batch.run_batch``, the same one ``--batch`` runs:
one engine, two front ends) shown live on the batch screen, with any attempt opened on the run screen.

The app is ``OpenCodeTUI`` with one twist: its ``control`` is the episode opened from the batch screen
(None on the batch screen itself), so the live run screen, its shell, cancel and keep keys work on
that episode unchanged. Each running attempt's events are kept (``EpisodeFeed``) until it ends, so an
attempt opened mid-run shows from its start; a finished one opens as a replay of its run directory.

Cancel (``c``, confirmed), Ctrl-C, SIGINT/SIGTERM/SIGHUP and ``q`` (confirmed) while the batch runs all
take the path SIGINT takes in ``--batch``: ``BatchControl.cancel`` (queued episodes are not started,
running ones close with cleanup confirmed), then the app exits when ``run_batch`` has returned.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from textual import work
from textual.screen import Screen

from opencode_tui.app import INTERRUPT_KEY, OpenCodeTUI
from opencode_tui.batch_board import AttemptRow, BatchBoard
from opencode_tui.screens.batch import AttemptOpened, BatchCancelWanted, BatchScreen, BatchScreenResumed
from opencode_tui.screens.live import LiveRunScreen
from opencode_tui.screens.modals import ConfirmScreen
from opencode_tui.screens.replay import ReplayRunScreen
from opencode_tui_core.batch import (
    BatchControl,
    BatchSummary,
    Executor,
    ExecutorError,
    RunsDirError,
    run_batch,
)
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.control import CANCELLED_BY_USER
from opencode_tui_core.episode import Episode, EpisodeResult
from opencode_tui_core.events import Event
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.outcome import exit_code as outcome_exit_code
from opencode_tui_core.signals import closing_signals
from opencode_tui_core.tasks import Task


class EpisodeFeed:
    """One running attempt: its episode, its events so far (an opened run screen replays them first),
    and the queue of the run screen that shows it now (None: none does)."""

    def __init__(
        self, episode: Episode, row: AttemptRow, board: BatchBoard, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.episode = episode
        self.row = row
        self.board = board
        self.loop = loop
        self.events: list[Event] | None = []  # None once released
        self.queue: asyncio.Queue[Event] | None = None
        episode.bus.subscribe(self.put)

    def put(self, event: Event) -> None:
        """The bus's subscriber (any thread): handed to the app's loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self._add(event)
        else:
            self.loop.call_soon_threadsafe(self._add, event)

    def _add(self, event: Event) -> None:
        self.board.count(self.row, event)
        if self.events is not None:
            self.events.append(event)
        if self.queue is not None:
            self.queue.put_nowait(event)

    def open(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        for event in self.events or ():
            queue.put_nowait(event)
        self.queue = queue
        return queue

    def release(self) -> None:
        """The attempt has ended: its events are in its run directory (a replay shows them)."""
        self.events = None


class BatchTUI(OpenCodeTUI):
    def __init__(
        self,
        tasks: list[Task],
        config: AgentConfig,
        runs_dir: Path,
        *,
        jobs: int,
        attempts: int | None,
        executor: Executor,
        force: bool = False,
        board: BatchBoard | None = None,
        run: bool = True,
        remote: bool = False,
    ) -> None:
        super().__init__(runs_dir=runs_dir, theme=config.theme)
        self.tasks = tasks
        self.config = config
        self.jobs = jobs
        self.max_attempts = attempts
        self.executor = executor
        self.force = force
        self.batch = BatchControl()
        bound = attempts or config.policy.max_attempts or 3
        self.board = board or BatchBoard(
            [t.id for t in tasks], bound, batch_id=self.batch.batch_id, remote=remote
        )
        self.feeds: dict[str, EpisodeFeed] = {}  # run id → the running attempt's feed
        self.summary: BatchSummary | None = None
        self.error: str | None = None
        self.error_code: int = ExitCode.INFRA
        self.batch_done = asyncio.Event() if run else None
        self.start_batch = run
        self.opened: EpisodeFeed | None = None

    # -- screens -------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen:
        return BatchScreen(self.board)

    @property
    def batch_screen(self) -> BatchScreen:
        screen = self.screen_stack[0]
        assert isinstance(screen, BatchScreen)
        return screen

    def on_mount(self) -> None:
        if self.start_batch:
            self._run_batch()
            self._signals = closing_signals(self._on_signal)
            self._signals.__enter__()
        if self.FREEZE_HEAP:
            self.call_after_refresh(self._freeze_heap)

    # -- the engine's hooks --------------------------------------------------------------------

    def attach(self, episode: Episode) -> None:
        """``on_episode``: an attempt's episode was created (before it runs)."""
        self._forget_ended()
        row = self.board.start(
            episode.task.id, episode.attempt, episode.run_id, episode.config.sandbox.provider
        )
        self.feeds[episode.run_id] = EpisodeFeed(episode, row, self.board, asyncio.get_running_loop())

    # A remote executor's (Ray): its attempts' episodes run on other machines, their events stay there.

    def started_elsewhere(self, task_id: str, attempt: int, run_id: str) -> None:
        """``on_started``: an attempt was handed to the cluster (it runs once a worker takes it)."""
        row = self.board.start(task_id, attempt, run_id, self.config.sandbox.provider)
        row.phase = "submitted"

    def phase_elsewhere(self, run_id: str, phase: str) -> None:
        """``on_phase``: the phase its worker reports."""
        self.board.phase(run_id, phase)

    def placed(self, run_id: str, node_id: str, address: str) -> None:
        """``on_node``: the node whose worker started it."""
        self.board.placed(run_id, node_id, address)

    def finished(self, result: EpisodeResult) -> None:
        """``on_result``: a task's last attempt ended (or was resumed, or never started)."""
        self.board.finished(result)
        for run_id in [result.run_id, *(Path(p).name for p in result.previous_attempts)]:
            feed = self.feeds.get(run_id)
            if feed is not None and feed is not self.opened:
                feed.release()
        self._forget_ended()

    def _forget_ended(self) -> None:
        """Attempts that have ended (a retried one too) are opened from their run directory: their
        episodes and events are not held for the rest of the batch."""
        for run_id, feed in list(self.feeds.items()):
            if feed is not self.opened and not feed.episode.running:
                feed.release()
                del self.feeds[run_id]

    @work(exclusive=True, group="batch-run")
    async def _run_batch(self) -> None:
        try:
            self.summary = await run_batch(
                self.tasks,
                self.config,
                runs_dir=self.runs_dir or Path(self.config.runs_dir),
                jobs=self.jobs,
                max_attempts=self.max_attempts,
                on_result=self.finished,
                control=self.batch,
                executor=self.executor,
                force=self.force,
                on_warning=lambda words: self.notify(words, severity="warning", timeout=10),
            )
        except RunsDirError as exc:
            self.error = f"{exc.strerror}; free space or choose another --runs-dir"
        except ExecutorError as exc:
            self.error, self.error_code = str(exc), ExitCode.USAGE
        finally:
            await self.executor.close()
            self.board.ended = True
            assert self.batch_done is not None
            self.batch_done.set()
        if self.error:
            self.notify(f"The batch could not run: {self.error}", severity="error", timeout=10)
        if self.quitting:
            self.exit()
        elif self.summary is not None:
            self.notify(f"The batch has finished: {self.summary.line()}", timeout=6)

    @property
    def batch_running(self) -> bool:
        return self.batch_done is not None and not self.batch_done.is_set()

    def exit_code(self) -> int:
        """The process's exit code, as ``--batch`` would give it."""
        if self.error is not None:
            return self.error_code
        if self.summary is None:
            return ExitCode.INTERRUPTED if self.batch.cancelled_by else ExitCode.INFRA
        return outcome_exit_code(
            (r.exit_code for r in self.summary.results), cancelled_by=self.summary.cancelled_by
        )

    # -- drilling in ---------------------------------------------------------------------------

    def on_attempt_opened(self, message: AttemptOpened) -> None:
        row = message.row
        feed = self.feeds.get(row.run_id)
        if feed is not None and feed.episode.running and row.result is None:
            self._open_live(feed)
            return
        run_dir = (
            Path(row.run_dir)
            if row.run_dir
            else (self.runs_dir / row.run_id if self.runs_dir and row.run_id else None)
        )
        if run_dir is not None and (run_dir / "run.json").exists():
            self.push_screen(ReplayRunScreen(run_dir, from_browser=True))
        elif row.phase == "resumed":
            self.notify("Resumed: recorded earlier, not run again; its run directory is gone.", timeout=4)
        else:
            self.notify(f"{row.task_id} is {row.phase}: nothing to open yet.", timeout=3)

    def _open_live(self, feed: EpisodeFeed) -> None:
        self.control = feed.episode
        self.opened = feed
        self._queue = feed.open()
        self.set_reactive(OpenCodeTUI.keep, feed.episode.kept)
        self.episode_done = False
        screen = LiveRunScreen(feed.episode, in_batch=True).data_bind(keep=OpenCodeTUI.keep)
        self.push_screen(screen)
        self._watch_opened(feed)

    @work(exclusive=True, group="episode-wait")
    async def _watch_opened(self, feed: EpisodeFeed) -> None:
        with contextlib.suppress(Exception):  # its failure is in its events
            await feed.episode.wait()
        if self.opened is feed:
            self.episode_done = True

    def on_batch_screen_resumed(self, _message: BatchScreenResumed) -> None:
        """Back on the batch screen (Esc): no episode is the app's any more."""
        if self.opened is not None:
            feed, self.opened = self.opened, None
            feed.queue = None
            self._forget_ended()
            self.control = None
            self._queue = None
            self.episode_done = True

    def live_queue(self) -> asyncio.Queue[Event]:
        assert self._queue is not None, "no episode is open"
        return self._queue

    # -- cancel and quit: the batch's (the opened episode's own cancel is `c` on its screen) --------

    def on_batch_cancel_wanted(self, _message: BatchCancelWanted) -> None:
        if not self.batch_running:
            self.notify("The batch has already finished.", timeout=3)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._cancel_batch(CANCELLED_BY_USER, quit_after=False)

        self.push_screen(
            ConfirmScreen(
                "Cancel the batch?",
                "Queued episodes are not started; every running one is closed with cleanup confirmed.",
                yes="Cancel batch",
                no="Keep running",
            ),
            answered,
        )

    @work(group="batch-cancel")
    async def _cancel_batch(self, by: str, quit_after: bool = True) -> None:
        first = self.batch.cancelled_by is None
        if quit_after:
            self.quitting = True
        if first:
            self.batch_screen.cancelling = by
            self.notify(
                f"{by}: closing every running episode (cleanup is confirmed); again to hurry", timeout=6
            )
        await self.batch.cancel(by)
        if not self.batch_running and self.quitting:
            self.exit()

    async def _on_signal(self, name: str) -> None:
        if self.batch_running:
            self._cancel_batch(name)
        else:
            self.exit()

    async def action_interrupt(self) -> None:
        if self.batch_running:
            self._cancel_batch(INTERRUPT_KEY)
        else:
            self.exit()

    async def action_request_quit(self) -> None:
        if not self.batch_running:
            self.exit()
            return
        if self.quitting:
            self.notify("Waiting for every running episode's cleanup…", timeout=3)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._cancel_batch(CANCELLED_BY_USER)

        self.push_screen(
            ConfirmScreen(
                "Quit while the batch is running?",
                "The batch is cancelled and the app waits until every running episode's cleanup is confirmed.",
                yes="Cancel and quit",
                no="Stay",
            ),
            answered,
        )
