"""The Textual app: one episode live, a run directory replayed, or the runs browser.

``OpenCodeTUI(control=...)``: live. Events come from ``control.bus.queue()`` (subscribed when the app is
created inside a running event loop, else when it mounts: start the episode after that, or events
emitted earlier are not shown). Pass ``run_episode=episode.run`` to let the app start the episode right
after it has subscribed. ``run_dir`` may be given (else ``control.run_dir`` is used): model-call bodies are
read from its ``model_calls.jsonl``.

The app holds the one ``keep`` state (reactive, starting from ``control.kept``: ``--keep-sandbox`` shows
as on); the run screen and its header are bound to it. Screens ask the app for things with messages
(``ShellWanted``, ``CancelWanted``, ``KeepToggleWanted``), never by calling into it.

``OpenCodeTUI(run_dir=...)``: replay of a run directory. ``OpenCodeTUI(runs_dir=...)``: the runs browser.
In a served session (``opencode-tui serve``: one app per browser session) the browser's ``r`` runs the
re-run in this app (``run_here``: its live run screen pushed over the browser, back to the browser
when it ends); in a terminal the app exits with ``rerun_request`` and ``cmd_runs`` runs it.

Quitting a live episode asks first, then cancels it and waits until the engine reports the episode done
(cleanup confirmed), so leaving the TUI always cleans up.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.actions import ActionParseResult
from textual.app import SystemCommand
from textual.binding import Binding
from textual.dom import DOMNode
from textual.reactive import reactive
from textual.screen import Screen

from opencode_tui import read_only
from opencode_tui.host import EpisodeHost
from opencode_tui.lineage_request import LineageRequest
from opencode_tui.messages import (
    CancelRequested,
    CancelWanted,
    Copied,
    EpisodeFinished,
    KeepSandboxChanged,
    KeepToggleWanted,
    RerunWanted,
    ShellStateChanged,
    ShellWanted,
)
from opencode_tui.screens.help import HelpScreen
from opencode_tui.screens.live import LiveRunScreen
from opencode_tui.screens.modals import CleanupWaitScreen, ConfirmScreen
from opencode_tui.screens.replay import ReplayRunScreen
from opencode_tui.screens.run import RunScreen
from opencode_tui.screens.runs import RunsScreen
from opencode_tui.screens.shell import ShellScreen
from opencode_tui.themes import APP_VARIABLES, DEFAULT_THEME, load_themes, next_theme
from opencode_tui_core.control import CANCELLED_BY_USER
from opencode_tui_core.events import CleanupStep, Event, StepState
from opencode_tui_core.signals import closing_signals

if TYPE_CHECKING:
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.control import EpisodeControl
    from opencode_tui_core.diff import RunDiff
    from opencode_tui_core.episode import Episode, EpisodeResult
    from opencode_tui_core.episode.warm_next import WarmNext
    from opencode_tui_core.tasks import Task


INTERRUPT_KEY = "Ctrl-C"  # what the record names when the key, not a signal, interrupted the run


class OpenCodeTUI(EpisodeHost):
    CSS_PATH = "app.tcss"
    TITLE = "opencode-tui"
    ENABLE_COMMAND_PALETTE = True
    FREEZE_HEAP = True  # see _freeze_heap

    BINDINGS = [
        Binding(
            "q",
            "request_quit",
            "Quit",
            tooltip="Quit (while an episode runs: cancel it, wait for cleanup)",
            id="app.quit",
        ),
        Binding("ctrl+q", "request_quit", "Quit", show=False, priority=True, id="app.quit-now"),
        # Ctrl-C is the universal interrupt: a graceful close without a question (exit 130).
        Binding("ctrl+c", "interrupt", "Interrupt", show=False, id="interrupt"),
        Binding(
            "t", "next_theme", "Theme", tooltip="Next theme (all themes: command palette)", id="app.theme"
        ),
        Binding(
            "y",
            "copy",
            "Copy",
            tooltip="Copy the selection / selected call / failure (OSC 52)",
            id="app.copy",
        ),
        Binding("f1,question_mark", "help", "Help", key_display="f1/?", tooltip="This help", id="app.help"),
    ]

    # The one keep state: whether the sandbox is kept after the run (live only). The run screen binds to
    # it (and its header to the screen); only the app changes it, after the engine took the change.
    keep: reactive[bool] = reactive(False, init=False)
    # The live episode has ended (its wait() returned); always true for a replay or the browser.
    episode_done: reactive[bool] = reactive(False, init=False)

    def __init__(
        self,
        control: EpisodeControl | None = None,
        run_dir: Path | None = None,
        runs_dir: Path | None = None,
        theme: str = DEFAULT_THEME,
        theme_dirs: Iterable[Path] = (),
        run_episode: Callable[[], Awaitable[object]] | None = None,
        diff: tuple[Path, Path] | None = None,
        diff_result: RunDiff | None = None,
        from_browser: bool = False,
        rerun_of: tuple[Path, Path | None] | None = None,
        notice: str | None = None,
        warm: WarmNext | None = None,
        inputs: tuple[Task, AgentConfig] | None = None,
    ) -> None:
        if control is None and run_dir is None and runs_dir is None and diff is None:
            raise ValueError(
                "OpenCodeTUI needs a control (live), a run_dir (replay), a runs_dir (browser) or diff (two runs)"
            )
        super().__init__()
        self.control = control
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.runs_dir = Path(runs_dir) if runs_dir is not None else None
        self.diff = diff
        self.rerun_request: Path | None = None  # the runs browser's `r`: the run to run again on exit
        # a replay's `R` / `F`: the rerun or fork to run live on exit (issue 28)
        self.lineage_request: LineageRequest | None = None
        # Live: the run was started by the runs browser's `r`; Esc and `q` lead back to it.
        self.from_browser = from_browser
        # Browser: (original, re-run) after a re-run, marked against each other; a notice to show.
        self.rerun_of, self.notice = rerun_of, notice
        self.read_only = read_only.enabled()  # `serve --read-only`: nothing that changes state
        self.served = read_only.served()  # a `serve` session: one app per process, re-runs inside it
        self._here: Path | None = None  # the run whose re-run runs inside this app (run_here)
        if self.read_only:
            # `s` says the shell is disabled on every screen (a replay has no shell key of its own).
            self.bind("s", "open_shell", show=False)
        self._diff_result = diff_result
        # issue 31: the sandbox prepared ahead for the next run (the first one, then a re-run), and the
        # task and configuration of the live episode (what a re-run's is prepared for). Every way out
        # releases the prepared one, confirmed (``_leave``).
        self.warm = warm
        self._inputs = inputs
        self.ran: list[EpisodeControl] = [control] if control is not None else []  # in this app, in order
        self.themes = load_themes(theme_dirs)
        for t in self.themes.values():
            self.register_theme(t)
        if theme not in self.available_themes:
            raise ValueError(f"unknown theme {theme!r}; available: {', '.join(self.themes)}")
        self.theme = theme
        self.run_episode = run_episode
        self._signals: contextlib.AbstractContextManager[None] | None = None
        self._run_ended = asyncio.Event()
        self.set_reactive(OpenCodeTUI.episode_done, control is None)
        self.quitting = False
        self.set_reactive(OpenCodeTUI.keep, control.kept if control is not None else False)
        self._queue: asyncio.Queue[Event] | None = None
        if control is not None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                self._queue = control.bus.queue()

    # -- screens -------------------------------------------------------------------------------

    def get_default_screen(self) -> Screen:
        if self.control is not None:
            # bound downward: app.keep -> screen.keep -> header.keep
            return LiveRunScreen(self.control, self.run_dir, from_browser=self.from_browser).data_bind(
                keep=OpenCodeTUI.keep
            )
        if self.run_dir is not None:
            return ReplayRunScreen(self.run_dir)
        if self.diff is not None:
            from opencode_tui.screens.diff import DiffScreen

            return DiffScreen(*self.diff, diff=self._diff_result)
        assert self.runs_dir is not None
        return RunsScreen(self.runs_dir, rerun_of=self.rerun_of)

    def on_mount(self) -> None:
        if self.control is not None:
            self.live_queue()
            self._watch_episode()
            if self.run_episode is not None:
                self._run_episode()
        if self.control is not None or self.served:
            # SIGTERM/SIGHUP (and a SIGINT sent from outside) close the episode like `q` does. A served
            # session is ended by SIGTERM (its socket closed, or the server stops) and may start one.
            self._signals = closing_signals(self._on_signal)
            self._signals.__enter__()
        # (This had slid into _on_signal, so the heap was never frozen and a full collection stalled the
        # screen ~0.1 s while output streamed; benchmarks/tui.py shows it in the worst key latency.)
        if self.FREEZE_HEAP:
            self.call_after_refresh(self._freeze_heap)
        if self.notice:
            self.notify(self.notice, timeout=10)

    def on_unmount(self) -> None:
        if self.FREEZE_HEAP:  # hand the frozen objects back: an app that ends must not pin its garbage
            gc.unfreeze()
        if self._signals is not None:
            self._signals.__exit__(None, None, None)
            self._signals = None

    async def _on_signal(self, name: str) -> None:
        if self.quitting and self.control is not None and self.episode_running:
            await self.control.cancel(name)  # a second signal hurries the close
        elif self.episode_running:
            self._quit_after_cleanup(name)
        else:
            self._leave()

    @staticmethod
    def _freeze_heap() -> None:
        """Move everything alive after start-up (modules, classes, widgets) out of the garbage collector's
        view. A full collection otherwise scans it all: ~0.1 s here, a visible stall while output streams."""
        gc.collect()
        gc.freeze()

    def live_queue(self) -> asyncio.Queue[Event]:
        """The queue of live events (subscribed to ``control.bus`` once, in this app's loop)."""
        assert self.control is not None
        if self._queue is None:
            self._queue = self.control.bus.queue()
        return self._queue

    @work(exclusive=True, group="episode-run")
    async def _run_episode(self) -> None:
        """Run the episode (``run_episode``), started once the app is subscribed to its events."""
        assert self.run_episode is not None
        try:
            await self.run_episode()
        except Exception as exc:
            self.episode_done = True
            self.post_message(EpisodeFinished(f"the episode crashed: {type(exc).__name__}: {exc}"))
        finally:
            self._run_ended.set()

    @work(exclusive=True, group="episode-wait")
    async def _watch_episode(self) -> None:
        assert self.control is not None
        error = None
        try:
            await self.control.wait()
        except Exception as exc:  # the episode's own failure is reported through its events
            error = f"{type(exc).__name__}: {exc}"
        self.post_message(EpisodeFinished(error))

    def on_episode_finished(self, message: EpisodeFinished) -> None:
        self.episode_done = True  # the run screen watches this
        if message.error and not self.quitting:
            self.notify(f"The episode ended with an error: {message.error}", severity="error", timeout=8)
        elif not self.quitting:
            self.notify("The episode has finished.", timeout=4)
        if self.warm is not None:
            self._after_episode(self.control)

    # -- the sandbox prepared ahead (issue 31) ---------------------------------------------------

    @work(group="warm")
    async def _after_episode(self, control: EpisodeControl | None) -> None:
        """An episode has ended: prepare a sandbox for a re-run of it (one that ended by itself), or
        release the one there is (a cancelled episode; the app leaving)."""
        assert self.warm is not None
        result, inputs = _result_of(control), self._inputs
        if (
            result is not None
            and result.cancelled_by is None
            and inputs is not None
            and not (self.quitting or self.read_only)
        ):
            prepared = self.warm.counts.prepared
            await self.warm.aim(*inputs)
            # Said once it is ready, so a person knows `r` starts at once (bounded like its install).
            budget = inputs[1].budgets.install_s + 60
            ready = await self.warm.prepared(prepared, budget)
            if ready and not self.quitting and self.control in (None, control):
                self.notify("A sandbox is ready for a re-run (r).", timeout=5)
            return
        before = self.warm.counts
        await self.warm.discard()
        after = self.warm.counts
        if after.discarded > before.discarded:
            confirmed = after.released_unconfirmed == before.released_unconfirmed
            self.notify(
                "The sandbox prepared ahead was released (cleanup confirmed)."
                if confirmed
                else "The sandbox prepared ahead was released, unconfirmed: `opencode-tui sweep` removes it.",
                severity="information" if confirmed else "warning",
                timeout=6,
            )

    def _leave(self) -> None:
        """Exit the app, every way out: the sandbox prepared ahead is released first, confirmed."""
        self.quitting = True  # nothing starts or is prepared any more (a re-run being admitted)
        if self.warm is None:
            self.exit()
        else:
            self._release_and_exit()

    @work(group="leave")
    async def _release_and_exit(self) -> None:
        assert self.warm is not None
        if self.warm.holding:
            self.notify("Releasing the sandbox prepared ahead (cleanup is confirmed)…", timeout=10)
        await self.warm.close()
        self.exit()

    @property
    def episode_running(self) -> bool:
        if self.control is None or self.episode_done:
            return False
        try:
            return bool(self.control.running)
        except Exception:
            return True

    # -- theme, CSS variables ------------------------------------------------------------------

    def get_css_variables(self) -> dict[str, str]:
        variables = super().get_css_variables()
        for name, default in APP_VARIABLES.items():
            if name not in variables:
                variables[name] = variables.get(default[1:], "") if default.startswith("$") else default
        self.theme_variables = variables
        return variables

    def action_next_theme(self) -> None:
        self.theme = next_theme(list(self.themes), self.theme)
        self.notify(f"Theme: {self.theme}", timeout=2)

    def set_theme(self, name: str) -> None:
        self.theme = name

    # -- command palette -----------------------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        if isinstance(screen, RunScreen):
            yield from screen.palette_commands()
            yield SystemCommand(
                "Follow output", "Follow / pause the terminal (l)", screen.terminal.action_toggle_follow
            )
            yield SystemCommand(
                "Raw output", "Toggle the raw stdout/stderr view (r)", screen.terminal.action_toggle_raw
            )
        yield SystemCommand(
            "Copy", "Copy the selection / selected item to the clipboard (y)", self.action_copy
        )
        yield SystemCommand("Next theme", "Cycle the opencode themes (t)", self.action_next_theme)
        for name in self.themes:
            yield SystemCommand(
                f"Theme: {name}", f"Switch to the {name} theme", lambda n=name: self.set_theme(n)
            )
        yield SystemCommand("Help", "Keys and what each panel means (f1, ?)", self.action_help)
        yield SystemCommand("Quit", "Quit (asks first while an episode runs) (q)", self.action_request_quit)

    # -- actions -------------------------------------------------------------------------------

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(self.screen))

    def action_copy(self) -> None:
        screen = self.screen
        text = screen.get_selected_text()
        what = "selection"
        if not text:
            target = screen.copy_target() if isinstance(screen, RunScreen) else None
            if target is None:
                self.notify("Nothing to copy here.", timeout=2)
                return
            what, text = target
        self.copy_to_clipboard(text)
        self.post_message(Copied(what, text))
        self.notify(f"Copied {what} ({len(text):,} characters) to the clipboard (OSC 52)", timeout=2)

    async def run_action(
        self,
        action: str | ActionParseResult,
        default_namespace: DOMNode | None = None,
        namespaces: Mapping[str, DOMNode] | None = None,
    ) -> bool:
        """Every action (key, footer, palette) passes here: read-only refuses the state-changing ones."""
        if self.read_only:
            ns = self if default_namespace is None else default_namespace
            _, name, _ = self._parse_action(action, ns, namespaces)
            if name in read_only.REFUSED_ACTIONS:
                self.notify(read_only.refusal(name.replace("_", " ")), severity="warning", timeout=4)
                return True
        return await super().run_action(action, default_namespace, namespaces)

    def _refused(self, what: str) -> bool:
        if self.read_only:
            self.notify(read_only.refusal(what), severity="warning", timeout=4)
        return self.read_only

    def on_shell_wanted(self, message: ShellWanted) -> None:
        if not self._refused("the shell"):
            self.open_shell(message.sandbox)

    def on_cancel_wanted(self, _message: CancelWanted) -> None:
        if not self._refused("cancel"):
            self.request_cancel()

    def on_keep_toggle_wanted(self, _message: KeepToggleWanted) -> None:
        if not self._refused("keep sandbox"):
            self.toggle_keep()

    # -- a re-run inside this app (a served session) -----------------------------------------------

    def run_here(self, original: Path, lineage: LineageRequest | None = None) -> None:
        """In a served session: the runs browser's ``r`` (``original``'s task again with its recorded
        configuration, admitted like `run`), or a replay's ``R``/``F`` (``lineage``: a rerun from the
        record or a fork, as the `rerun`/`fork` commands make them), live on a run screen pushed over
        the browser. Esc and `q` lead back (asking first while it runs; cleanup is confirmed first); a
        signal ends the app."""
        if self.control is not None:
            self.notify("A run is already open here.", severity="warning", timeout=4)
            return
        self._start_here(original, lineage)

    @work(exclusive=True, group="run-here")
    async def _start_here(self, original: Path, lineage: LineageRequest | None) -> None:
        from opencode_tui_core.admission import AdmissionError
        from opencode_tui_core.config import ConfigError
        from opencode_tui_core.episode import Episode

        def admitted() -> Episode | tuple[AgentConfig, Task]:
            # The provider's checks run their own event loop: this runs on a thread.
            if lineage is not None:
                from opencode_tui.lineage_child import child_episode

                return child_episode(lineage.args())[0]
            return _rerun_inputs(original)

        doing = {None: "Re-running", "rerun": "Re-running from the record", "fork": "Forking"}
        self.notify(f"{doing[lineage.lineage if lineage else None]} {original.name}…", timeout=3)
        try:
            made = await asyncio.to_thread(admitted)
        except (AdmissionError, ConfigError, FileNotFoundError, ValueError) as exc:
            self.notify(f"{original.name} cannot be re-run: {exc}", severity="error", timeout=8)
            return
        if self.control is not None or self.quitting:
            return
        self._here, self.from_browser = original, True
        if isinstance(made, Episode):  # a rerun or fork takes no sandbox prepared ahead: it is released
            if self.warm is not None:
                await self.warm.discard()
            await self._start_live(made, None, replace=False)
        else:
            await self._go_live(*made, original.parent, replace=False)

    def on_rerun_wanted(self, _message: RerunWanted) -> None:
        if not self._refused("re-run"):
            self._rerun_live()

    @work(exclusive=True, group="run-here")
    async def _rerun_live(self) -> None:
        """`r` on a live run that has ended: its task again with its recorded configuration (admitted
        like `run`), on a new run screen in its place; it takes the sandbox prepared ahead for it."""
        from opencode_tui_core.admission import AdmissionError
        from opencode_tui_core.config import ConfigError

        path = self.live_run_path
        if path is None or self.episode_running or self.quitting:
            return
        self.notify(f"Re-running {path.name}…", timeout=3)
        try:
            config, task = await asyncio.to_thread(_rerun_inputs, path)
        except (AdmissionError, ConfigError, FileNotFoundError, ValueError) as exc:
            self.notify(f"{path.name} cannot be re-run: {exc}", severity="error", timeout=8)
            return
        if self.episode_running or self.quitting:
            return
        await self._go_live(config, task, path.parent, replace=True)

    @property
    def can_rerun(self) -> bool:
        return self.control is not None and not self.quitting and self.live_run_path is not None

    @property
    def live_run_path(self) -> Path | None:
        """The live episode's run directory, once it exists."""
        found = getattr(self.control, "run_dir", None)
        path = getattr(found, "path", found)
        return Path(path) if isinstance(path, str | Path) else None

    async def _go_live(self, config: AgentConfig, task: Task, runs_dir: Path, *, replace: bool) -> None:
        """An episode of ``task`` under ``config``, live here: it takes the sandbox prepared ahead when
        one matches (``WarmNext.aim``: one for another configuration is released, confirmed)."""
        from opencode_tui_core.episode import Episode

        pool = await self.warm.aim(task, config) if self.warm is not None else None
        await self._start_live(
            Episode(task, config, runs_dir=runs_dir, pool=pool), (task, config), replace=replace
        )

    async def _start_live(
        self, episode: Episode, inputs: tuple[Task, AgentConfig] | None, *, replace: bool
    ) -> None:
        """``episode`` becomes the app's live one, on a run screen pushed (over the browser) or put in
        place of the ended run's (``replace``). Not while the app is leaving (it has no sandbox yet)."""
        if self.quitting:
            return
        self.control, self.run_episode, self._inputs = episode, episode.run, inputs
        self.ran.append(episode)
        self._queue = episode.bus.queue()
        self._run_ended = asyncio.Event()
        self.set_reactive(OpenCodeTUI.keep, episode.kept)
        self.set_reactive(OpenCodeTUI.episode_done, False)
        screen = LiveRunScreen(episode, from_browser=self.from_browser).data_bind(keep=OpenCodeTUI.keep)
        if replace and len(self.screen_stack) > 1:
            await self.switch_screen(screen)
        else:  # over the browser; or over the app's first screen, which cannot be switched away
            await self.push_screen(screen)
        self._watch_episode()
        self._run_episode()

    async def _back_to_browser(self) -> None:
        """The re-run run here has ended: back to the browser, the original and the re-run marked."""
        original, episode = self._here, self.control
        assert original is not None
        result = getattr(episode, "_result", None)
        new = Path(result.run_dir) if result is not None else None
        self._here = None
        self.control, self.run_episode, self._queue = None, None, None
        self.from_browser = self.quitting = False
        self.set_reactive(OpenCodeTUI.episode_done, True)
        while len(self.screen_stack) > 1:
            await self.pop_screen()
        browser = self.screen_stack[0]
        if isinstance(browser, RunsScreen):
            browser.show_rerun(original, new)
        self.notify(
            f"Re-run: {result.summary}" if result is not None else "The re-run did not finish.", timeout=10
        )

    async def _leave_run(self) -> None:
        """The live run's screen is left (`q`, Esc, its close): back to the browser if it runs here."""
        if self._here is not None:
            await self._back_to_browser()
        else:
            self._leave()

    def open_shell(self, sandbox: str | None) -> None:
        if self.control is None:
            self.post_message(ShellStateChanged("unavailable", "replay"))
            self.notify(
                "Shell unavailable in a replay: the run's sandbox was released when the run ended.",
                severity="warning",
                timeout=4,
            )
            return
        self.push_screen(ShellScreen(self.control.open_shell, sandbox or "sandbox"))

    def request_cancel(self) -> None:
        if self.control is None:
            self.notify("Nothing to cancel in a replay.", timeout=3)
            return
        if not self.episode_running:
            self.notify("The episode has already finished.", timeout=3)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._cancel("cancel")

        self.push_screen(
            ConfirmScreen(
                "Cancel the episode?",
                "The agent is stopped, cleanup is confirmed and the sandbox released (or kept, if 'keep' is on).",
                yes="Cancel episode",
                no="Keep running",
            ),
            answered,
        )

    @work(exclusive=True, group="cancel")
    async def _cancel(self, reason: str) -> None:
        assert self.control is not None
        self.post_message(CancelRequested(reason))
        try:
            await self.control.cancel()
        except Exception as exc:
            self.notify(f"Cancel failed: {exc}", severity="error", timeout=8)
            return
        if reason == "cancel":
            self.notify("Cancel requested: the engine is closing the episode.", timeout=4)

    def toggle_keep(self) -> None:
        if self.control is None:
            self.notify("Replay: there is no sandbox to keep.", timeout=3)
            return
        if not self.control.keep_changeable:
            self.keep = self.control.kept
            state = "kept" if self.keep else "released"
            self.notify(f"The sandbox was already {state}; keep can no longer change.", timeout=4)
            self.screen.refresh_bindings()
            return
        wanted = not self.keep
        try:
            self.control.keep_sandbox(wanted)
        except Exception as exc:
            self.notify(f"Could not change keep-sandbox: {exc}", severity="error", timeout=6)
            return
        self.keep = wanted  # the engine took it: the screen and its header follow (data binding)
        self.post_message(KeepSandboxChanged(self.keep))
        self.notify(
            "The sandbox will be kept after the run."
            if self.keep
            else "The sandbox will be released after the run.",
            timeout=3,
        )

    async def action_request_quit(self) -> None:
        if self.quitting:
            self.notify("Waiting for the episode's cleanup to finish…", timeout=3)
            return
        if not self.episode_running:
            await self._leave_run()
            return
        if self.closing_done:
            # the sandbox is released (or the outcome decided): nothing left to cancel, so nothing to
            # ask; the engine is only finishing its record, which the app waits for before it exits
            self._quit_after_cleanup(cancel=False)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._quit_after_cleanup()

        where = "go back to the runs browser" if self.from_browser else "quit"
        self.push_screen(
            ConfirmScreen(
                f"{where.capitalize()} while the episode is running?",
                "The episode is cancelled and the app waits until the engine has confirmed cleanup "
                "(the sandbox is released, or kept if 'keep' is on).",
                yes="Cancel and go back" if self.from_browser else "Cancel and quit",
                no="Stay",
            ),
            answered,
        )

    async def action_interrupt(self) -> None:
        if not self.episode_running:
            self._leave()
        elif self.quitting:
            assert self.control is not None
            await self.control.cancel(INTERRUPT_KEY)  # pressed again: hurry the close
        else:
            self._quit_after_cleanup(INTERRUPT_KEY)

    async def action_quit(self) -> None:
        await self.action_request_quit()

    @property
    def closing_done(self) -> bool:
        """The live episode's sandbox is released (cleanup confirmed), or its outcome is decided."""
        for screen in self._run_screens():
            released = screen.state.cleanup.get(CleanupStep.SANDBOX_RELEASED)
            if screen.state.outcome is not None or (released is not None and released.state is StepState.OK):
                return True
        return False

    def _run_screens(self) -> list[RunScreen]:
        """The run screens of the live episode (a re-run's screen pushed over the ended run's, which
        stays below it when it is the app's first screen, shows another episode)."""
        return [
            s
            for s in self.screen_stack
            if isinstance(s, RunScreen) and (not isinstance(s, LiveRunScreen) or s.control is self.control)
        ]

    @work(exclusive=True, group="quit")
    async def _quit_after_cleanup(self, by: str = CANCELLED_BY_USER, cancel: bool = True) -> None:
        assert self.control is not None
        self.quitting = True
        if cancel:
            budget = None
            for screen in self._run_screens():
                if screen.state.started is not None:
                    budget = screen.state.started.close_budget_s
            self.push_screen(CleanupWaitScreen(budget))
            self.post_message(CancelRequested("quit"))
            try:
                await self.control.cancel(by)
            except Exception as exc:
                self.notify(f"Cancel failed: {exc}", severity="error", timeout=8)
        waiter = asyncio.ensure_future(self.control.wait())
        ended = asyncio.ensure_future(self._run_ended.wait())
        # The episode has ended when wait() returns, or (if this app started it) when its run crashed.
        await asyncio.wait(
            [waiter, ended] if self.run_episode else [waiter], return_when=asyncio.FIRST_COMPLETED
        )
        for task in (waiter, ended):
            if not task.done():
                task.cancel()
        if waiter.done() and not waiter.cancelled():
            waiter.exception()  # the episode's failure is in its events; what matters is that it ended
        self.episode_done = True
        for live in self.screen_stack:
            if isinstance(live, LiveRunScreen):
                live.flush_live()
        if by == CANCELLED_BY_USER and self._here is not None:
            await self._back_to_browser()  # asked for on the run's screen; a signal or Ctrl-C ends the app
        else:
            self._leave()


def _result_of(control: EpisodeControl | None) -> EpisodeResult | None:
    """The ended episode's result (an ``Episode``'s; None for another control, or one that did not end)."""
    return getattr(control, "_result", None)


def _rerun_inputs(path: Path) -> tuple[AgentConfig, Task]:
    """The configuration and task ``path`` recorded, admitted like `run` (the provider's checks run
    their own event loop: call it on a thread)."""
    from opencode_tui_core.admission import check_inputs, rerun_inputs
    from opencode_tui_core.artifacts import RunDirReader

    config, task = rerun_inputs(RunDirReader(path).info(), path)
    check_inputs(config, [task])
    return config, task
