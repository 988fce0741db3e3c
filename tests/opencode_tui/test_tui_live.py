"""Live mode: the app driven by an EpisodeControl whose events arrive over time on a real EventBus.

``EngineDouble`` below is a test double of the engine (``core/episode.py`` is written separately): it
plays a short episode on a real ``opencode_tui_core.events.EventBus`` from a coroutine, honours ``cancel()`` by emitting
the cleanup steps and an outcome, and opens a real shell on a local pseudo-terminal for ``open_shell``.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import struct
import subprocess
import termios
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from opencode_tui.app import OpenCodeTUI
from opencode_tui.messages import (
    CancelRequested,
    EpisodeFinished,
    EventsReceived,
    KeepSandboxChanged,
    ShellStateChanged,
)
from opencode_tui.screens.modals import CleanupWaitScreen, ConfirmScreen
from opencode_tui.screens.run import RunScreen
from opencode_tui.screens.shell import ShellScreen
from opencode_tui.widgets.cleanup import CleanupPanel
from opencode_tui.widgets.header import RunHeader
from opencode_tui.widgets.model_calls import ModelCallsTable
from opencode_tui.widgets.pty import PtyTerminal
from opencode_tui_core.control import EpisodeControl
from opencode_tui_core.events import (
    CleanupObserved,
    CleanupStep,
    EpisodeStarted,
    EventBus,
    ModelCall,
    OutcomeDecided,
    Phase,
    PhaseChanged,
    SandboxReady,
    StepState,
    TerminalOutput,
    ToolCall,
)
from opencode_tui_core.sandbox.base import PtyHandle


class LocalPty(PtyHandle):
    """A real ``/bin/sh`` on a local pseudo-terminal, standing in for a sandbox PTY."""

    def __init__(self, cols: int, rows: int) -> None:
        self.fd, slave = os.openpty()
        self._size(cols, rows, slave)
        self.proc = subprocess.Popen(
            ["/bin/sh", "-i"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env={"PS1": "sandbox$ ", "TERM": "xterm", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
        os.close(slave)
        self.closed = False

    @staticmethod
    def _size(cols: int, rows: int, fd: int) -> None:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    async def read(self, max_bytes: int = 65536) -> bytes:
        if self.closed:
            return b""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()

        def ready() -> None:
            loop.remove_reader(self.fd)
            try:
                data = os.read(self.fd, max_bytes)
            except OSError:
                data = b""
            if not fut.done():
                fut.set_result(data)

        loop.add_reader(self.fd, ready)
        try:
            return await fut
        finally:
            if not self.closed:
                loop.remove_reader(self.fd)

    async def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    async def resize(self, cols: int, rows: int) -> None:
        self._size(cols, rows, self.fd)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=5)
        asyncio.get_running_loop().remove_reader(self.fd)
        os.close(self.fd)


class EngineDouble(EpisodeControl):
    """Test double of the engine: a real EventBus fed by a coroutine emitting an episode over time."""

    def __init__(self, ticks: int = 120) -> None:
        self.bus = EventBus()
        self.max_ticks = ticks
        self.cancel_calls = 0
        self.keep_calls: list[bool] = []
        self.shells: list[LocalPty] = []
        self._cancel = asyncio.Event()
        self._done = asyncio.Event()
        self.ticks = 0
        self.task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    async def cancel(self, by: str = "user") -> None:
        self.cancel_calls += 1
        self._cancel.set()

    @property
    def kept(self) -> bool:
        return bool(self.keep_calls and self.keep_calls[-1])

    @property
    def keep_changeable(self) -> bool:
        return self.running

    def keep_sandbox(self, keep: bool = True) -> None:
        self.keep_calls.append(keep)

    async def open_shell(self, cols: int = 80, rows: int = 24) -> PtyHandle:
        pty = LocalPty(cols, rows)
        self.shells.append(pty)
        return pty

    async def wait(self) -> object:
        await self._done.wait()
        return "cancelled"

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._play())

    async def _play(self) -> None:
        emit = self.bus.emit
        emit(
            EpisodeStarted(
                run_id="live-1",
                task_id="live-task",
                provider="local",
                opencode_version="1.18.32",
                run_budget_s=600,
                close_budget_s=30,
                model="scripted",
            )
        )
        emit(SandboxReady(sandbox_id="bwrap-live01", provider="local", owned=True, network="model-only"))
        emit(PhaseChanged(phase=Phase.AGENT))
        await asyncio.sleep(0.05)
        now = datetime.now(UTC)
        emit(
            ModelCall(
                call_id="c1",
                method="POST",
                path="/v1/chat/completions",
                status=200,
                started_at=now,
                latency_s=0.2,
                kind="agent",
                message_id="msg_1",
                tokens_in=100,
                tokens_out=10,
            )
        )
        emit(ToolCall(call_id="t1", tool="bash", status="running", input={"command": "echo hello"}))
        await asyncio.sleep(0.05)
        emit(
            ToolCall(
                call_id="t1",
                tool="bash",
                status="completed",
                input={"command": "echo hello"},
                output="hello\n",
            )
        )
        # Output streams for a while, then the agent "thinks" quietly until cancelled (a quiet app lets
        # Pilot's key presses settle quickly).
        while not self._cancel.is_set() and self.ticks < self.max_ticks:
            self.ticks += 1
            emit(TerminalOutput(stream="pty", data=f"\x1b[32mtick {self.ticks}\x1b[0m\n"))
            try:
                await asyncio.wait_for(self._cancel.wait(), 0.01)
            except TimeoutError:
                pass
        await self._cancel.wait()
        emit(PhaseChanged(phase=Phase.CLOSING))
        for step in (
            CleanupStep.RECEIPT,
            CleanupStep.DESCENDANTS,
            CleanupStep.TRANSCRIPT_SNAPSHOT,
            CleanupStep.SANDBOX_RELEASED,
        ):
            await asyncio.sleep(0.05)
            emit(CleanupObserved(step=step, state=StepState.OK, reason="confirmed"))
        emit(OutcomeDecided(action="keep_unknown", reward=None, summary="cancelled by the user"))
        emit(PhaseChanged(phase=Phase.DONE, state=StepState.OK))
        self._done.set()


@pytest.fixture
async def engine():
    double = EngineDouble()
    yield double
    if double.task is not None and not double.task.done():
        double._cancel.set()
        await asyncio.wait_for(double.task, 5)
    for pty in double.shells:
        await pty.close()


def _screen(app) -> RunScreen:
    return next(s for s in app.screen_stack if isinstance(s, RunScreen))


async def test_live_screen_updates_and_quit_cancels_then_waits_for_cleanup(engine, wait):
    messages: list = []
    app = OpenCodeTUI(control=engine)
    async with app.run_test(size=(140, 40), message_hook=messages.append) as pilot:
        engine.start()
        screen = _screen(app)
        await wait(pilot, lambda: len(screen.state.model_calls) == 1, what="the model call")
        await wait(pilot, lambda: screen.terminal.rendered.count > 10, what="terminal output")
        header = app.screen.query_one(RunHeader)
        text = header.plain
        assert "live-task" in text and "bwrap-live01 (owned)" in text and "LIVE" in text
        assert screen.query_one(ModelCallsTable).row_count == 1
        lines = screen.terminal.rendered.lines
        assert any("$" in line and "echo hello" in line for line in lines)
        # the screen keeps updating while the episode runs
        seen = screen.terminal.rendered.count
        await wait(pilot, lambda: screen.terminal.rendered.count > seen + 5, what="more output")
        live_batches = [m for m in messages if isinstance(m, EventsReceived)]
        assert live_batches and all(m.source == "live" for m in live_batches)
        assert any(len(m.events) > 1 for m in live_batches), "events are batched, not one refresh per event"
        # quitting asks first
        await pilot.press("q")
        await wait(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the quit confirmation")
        assert engine.cancel_calls == 0
        await pilot.press("y")
        await wait(pilot, lambda: engine.cancel_calls == 1, what="cancel()")
        assert any(isinstance(m, CancelRequested) and m.reason == "quit" for m in messages)
        await wait(
            pilot,
            lambda: any(isinstance(s, CleanupWaitScreen) for s in app.screen_stack) or not engine.running,
            what="the cleanup wait dialog",
        )
        # the app exits only once the engine says the episode (with its cleanup) is done
        await wait(pilot, lambda: app._exit, what="the app to exit")
        assert not engine.running
        states = screen.query_one(CleanupPanel).step_states(screen.state)
        assert set(states.values()) == {"ok"}, states


async def test_live_cancel_and_keep(engine, wait, fixture_runs):
    engine.max_ticks = 5
    engine.run_dir = SimpleNamespace(
        path=fixture_runs / "hello-file"
    )  # like opencode_tui_core.artifacts.RunDir
    messages: list = []
    # the app starts the episode itself once it is subscribed to the bus (run_episode)
    app = OpenCodeTUI(control=engine, run_episode=engine._play)
    async with app.run_test(size=(140, 40), message_hook=messages.append) as pilot:
        screen = _screen(app)
        assert screen.bodies_dir == fixture_runs / "hello-file"
        await wait(pilot, lambda: screen.state.sandbox is not None, what="sandbox ready")
        await pilot.press("k")
        assert engine.keep_calls == [True]
        assert any(isinstance(m, KeepSandboxChanged) and m.keep for m in messages)
        assert "keep sandbox: on" in screen.query_one(RunHeader).plain
        await pilot.press("c")
        await wait(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the cancel confirmation")
        await pilot.press("n")
        await pilot.pause()
        assert engine.cancel_calls == 0
        await pilot.press("c")
        await wait(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the cancel confirmation")
        await pilot.press("y")
        await wait(pilot, lambda: engine.cancel_calls == 1, what="cancel()")
        await wait(pilot, lambda: screen.state.outcome is not None, what="the outcome")
        assert any(isinstance(m, CancelRequested) and m.reason == "cancel" for m in messages)
        await wait(pilot, lambda: app.episode_done, what="the episode to finish")
        # finished: quitting no longer asks
        await pilot.press("q")
        await wait(pilot, lambda: app._exit, what="the app to exit")


async def test_live_shell_is_interactive_and_keys_reach_it(engine, wait):
    engine.max_ticks = 5
    messages: list = []
    app = OpenCodeTUI(control=engine)
    async with app.run_test(size=(120, 36), message_hook=messages.append) as pilot:
        engine.start()
        screen = _screen(app)
        await wait(pilot, lambda: screen.state.sandbox is not None, what="sandbox ready")
        await pilot.press("s")
        await wait(pilot, lambda: isinstance(app.screen, ShellScreen), what="the shell screen")
        pty = app.screen.query_one(PtyTerminal)
        await wait(pilot, lambda: any("sandbox$" in line for line in pty.display_lines()), what="the prompt")
        # q, t, y and ? are app keys elsewhere: inside the shell they are typed into it
        await pilot.press(*"echo q-t-y-?-$((40+2))", "enter")
        await wait(
            pilot,
            lambda: any(line.strip() == "q-t-y-?-42" for line in pty.display_lines()),
            what="the command's output",
        )
        assert not any(isinstance(s, ConfirmScreen) for s in app.screen_stack)
        assert any(isinstance(m, ShellStateChanged) and m.state == "open" for m in messages)
        await pilot.press("ctrl+right_square_bracket")
        await wait(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        assert engine.shells[0].closed
        # the episode kept streaming meanwhile
        assert screen.terminal.rendered.count > 3


async def test_live_episode_crash_is_reported_and_quit_does_not_hang(wait):
    engine = EngineDouble()

    async def crashing_run() -> None:
        engine.bus.emit(
            EpisodeStarted(
                run_id="c",
                task_id="crash-task",
                provider="local",
                opencode_version="1.18.32",
                run_budget_s=60,
                close_budget_s=5,
                model="m",
            )
        )
        await asyncio.sleep(0.05)
        raise RuntimeError("boom")

    messages: list = []
    app = OpenCodeTUI(control=engine, run_episode=crashing_run)
    async with app.run_test(size=(120, 36), message_hook=messages.append) as pilot:
        await wait(
            pilot, lambda: any(isinstance(m, EpisodeFinished) for m in messages), what="the crash report"
        )
        finished = next(m for m in messages if isinstance(m, EpisodeFinished))
        assert "RuntimeError: boom" in finished.error
        assert _screen(app).state.task_id == "crash-task"
        await pilot.press("q")  # the episode is over (crashed): no confirmation, no waiting
        await wait(pilot, lambda: app._exit, what="the app to exit")


def _offered(app, action: str) -> bool:
    """Whether the footer offers ``action`` (check_action False hides it; None would grey it)."""
    return any(b.enabled for b in app.active_bindings.values() if b.binding.action == action)


def _footer_keys(app) -> set[str]:
    """The keys the footer shows right now (its FooterKey widgets)."""
    from textual.widgets._footer import FooterKey

    return {k.key for k in app.screen.query(FooterKey)}


async def test_live_actions_that_no_longer_apply_are_hidden(engine, wait):
    """Cancel is hidden once the outcome is decided; the shell once the sandbox has been released; keep
    once the sandbox's fate is decided: the footer of a finished run offers none of them."""
    engine.max_ticks = 5
    app = OpenCodeTUI(control=engine)
    async with app.run_test(size=(140, 40)) as pilot:
        engine.start()
        screen = _screen(app)
        await wait(pilot, lambda: screen.state.sandbox is not None, what="sandbox ready")
        await pilot.pause()
        assert (
            _offered(app, "cancel_episode") and _offered(app, "open_shell") and _offered(app, "toggle_keep")
        )
        assert {"s", "c", "k"} <= _footer_keys(app)
        await engine.cancel()
        await wait(pilot, lambda: screen.state.outcome is not None, what="the outcome")
        await wait(pilot, lambda: not _offered(app, "cancel_episode"), what="cancel hidden")
        assert not _offered(app, "open_shell")  # SandboxReleased ok, not kept
        assert screen.check_action("cancel_episode", ()) is False
        assert screen.check_action("open_shell", ()) is False
        await wait(pilot, lambda: app.episode_done, what="the episode to finish")
        await pilot.pause()
        assert not _offered(app, "toggle_keep")  # the engine no longer takes a change
        await wait(
            pilot, lambda: not {"s", "c", "k"} & _footer_keys(app), what="s, c, k gone from the footer"
        )
        await pilot.press("c")  # not offered: nothing asks to cancel a finished episode
        assert not isinstance(app.screen, ConfirmScreen)
        # the header states the outcome, never "done ok"
        await wait(pilot, lambda: app.episode_done, what="the episode to finish")
        await pilot.pause()
        header = screen.query_one(RunHeader).plain
        assert header.startswith("done · keep_unknown"), header
        assert "done ok" not in header


async def test_a_flood_of_output_reaches_the_screen_one_slice_at_a_time(engine, wait, monkeypatch):
    """20 MB emitted at once (faster than any pane draws), and the screen busy for 0.3 s in the middle
    (an awaited handler: it takes no message meanwhile): the screen never has more than one batch
    waiting (a screen drains its queue in one go, and keys bubble through it: a backlog of batches
    held them), and batches are cut to the measured ingest rate's slice, far below the old 2 MB."""
    import opencode_tui.screens.run as run_module

    app = OpenCodeTUI(control=engine)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = _screen(app)
        await pilot.pause()
        waiting = [0]
        most = [0]
        sizes: list[int] = []
        post, ingest = screen.post_message, screen.ingest

        def counting_post(message):
            if isinstance(message, EventsReceived):
                waiting[0] += 1
                most[0] = max(most[0], waiting[0])
                sizes.append(sum(len(e.data) for e in message.events if isinstance(e, TerminalOutput)))
            return post(message)

        def counting_ingest(events):
            waiting[0] -= 1
            return ingest(events)

        monkeypatch.setattr(screen, "post_message", counting_post)
        monkeypatch.setattr(screen, "ingest", counting_ingest)
        chunk = "".join(f"\x1b[32mline {i}\x1b[0m of a flood of output\r\n" for i in range(800))
        total = 0
        while total < 20_000_000:
            engine.bus.emit(TerminalOutput(stream="pty", data=chunk))
            total += len(chunk)
        await wait(pilot, lambda: len(sizes) >= 3, what="the first batches")

        async def busy() -> None:
            await asyncio.sleep(0.3)

        screen.call_later(busy)
        await wait(pilot, lambda: screen.terminal.rendered.chars >= total, timeout=60, what="the flood")
        assert most[0] == 1, most[0]
        assert len(sizes) > 10 and max(sizes) < run_module.LIVE_BATCH_CHARS_MAX
        assert screen._ingest_rate is not None  # measured from the batches themselves
        expected = screen._ingest_rate * run_module.LIVE_SLICE_S
        assert screen._batch_chars <= max(expected * 1.01, run_module.LIVE_BATCH_CHARS_MIN)
