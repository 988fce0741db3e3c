"""What a debugger opens next: each cleanup step in detail (with the supervisor's receipt), the
verifier's output, and what OpenCode was given exactly as sent (prompt, instructions file, task.yaml).

Files are read from the run directory when the screen opens (live: as far as the run has written
them), in a worker thread; what a run did not record is said, never shown as empty.
"""

from __future__ import annotations

import json
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Static, TabbedContent, TabPane, TextArea

from opencode_tui import format as fmt
from opencode_tui.messages import Copied
from opencode_tui.state import CLEANUP_ORDER
from opencode_tui.widgets.cleanup import ICONS, LABELS
from opencode_tui_core.artifacts import RunDirReader, RunFiles, RunInfo
from opencode_tui_core.events import CleanupObserved, VerificationFinished

NOT_RECORDED = "not recorded"
TABS = ("cleanup", "verifier", "prompt", "instructions", "task")
RECEIPT_FIELDS = {
    "cleanup_confirmed": "cleanup confirmed",
    "descendants_killed": "descendants killed",
    "return_code": "agent exit code",
    "signal": "agent killed by signal",
    "timed_out": "run deadline hit",
    "error": "supervisor error",
}


def cleanup_content(history: list[CleanupObserved], start_ts: object = None) -> Content:
    """Each cleanup step: its last state and reason, the detail the engine recorded, and every
    observation of it in order; the receipt's fields spelled out."""
    out: list[Content] = []
    for step in CLEANUP_ORDER:
        seen = [e for e in history if e.step == step]
        last = seen[-1] if seen else None
        st = str(last.state) if last else "pending"
        out.append(
            Content.from_markup(
                f"[$state-{st}]$icon[/] [b]$label[/] [$state-{st}]$state[/]$reason",
                icon=ICONS.get(st, "?"),
                label=LABELS[step],
                state=st,
                reason=f" — {last.reason}" if last and last.reason else "",
            )
        )
        if last is None:
            out.append(Content.styled("    not observed (yet)", "dim"))
        elif str(step) == "receipt" and last.data:
            for key, label in RECEIPT_FIELDS.items():
                if key in last.data:
                    out.append(Content(f"    {label:<24}{json.dumps(last.data[key])}"))
            rest = {k: v for k, v in last.data.items() if k not in RECEIPT_FIELDS}
            if rest:
                out.append(Content("    " + json.dumps(rest, default=str)))
        elif last.data:
            for key, value in last.data.items():
                out.append(Content(f"    {key.replace('_', ' '):<24}{json.dumps(value, default=str)}"))
        if len(seen) > 1:
            steps = " → ".join(f"{e.state} ({e.ts.strftime('%H:%M:%S.%f')[:-3]})" for e in seen)
            out.append(Content.styled(f"    observed {steps}", "dim"))
        out.append(Content(""))
    return Content("\n").join(out)


class InspectScreen(ModalScreen[None]):
    """Tabs: Cleanup, Verifier, Prompt, Instructions, task.yaml."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close", id="inspect.close"),
        Binding("y", "copy", "Copy", id="inspect.copy"),
        Binding("end", "scroll_end", "End", show=False, priority=True, id="inspect.end"),
        Binding("home", "scroll_home", "Home", show=False, priority=True, id="inspect.home"),
    ]

    def __init__(
        self,
        run_dir: Path | None,
        *,
        cleanup: list[CleanupObserved],
        verification: VerificationFinished | None,
        info: RunInfo | None = None,
        tab: str = "cleanup",
    ) -> None:
        super().__init__(classes="modal")
        self.run_dir = run_dir
        self.cleanup = cleanup
        self.verification = verification
        self.info = info
        self.tab = tab if tab in TABS else "cleanup"
        self.texts: dict[str, str] = {}
        self.loaded = False

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog detail") as dialog:
            dialog.border_title = f"Inspect {self.run_dir.name if self.run_dir else 'run'}"
            dialog.border_subtitle = "end/home · y copy · esc close"
            with TabbedContent(id="inspect-tabs", initial=f"tab-{self.tab}"):
                with TabPane("Cleanup", id="tab-cleanup"), VerticalScroll(id="cleanup-view"):
                    yield Static(cleanup_content(self.cleanup), id="cleanup-detail")
                with TabPane("Verifier", id="tab-verifier"), Vertical():
                    yield Static(self._verification_line(), id="verifier-summary")
                    yield Static(Content.from_markup("[b]stdout[/]"), classes="caption")
                    yield TextArea("loading…", read_only=True, id="verify-stdout", soft_wrap=True)
                    yield Static(Content.from_markup("[b]stderr[/]"), classes="caption")
                    yield TextArea("loading…", read_only=True, id="verify-stderr", soft_wrap=True)
                with TabPane("Prompt", id="tab-prompt"):
                    yield TextArea("loading…", read_only=True, id="prompt", soft_wrap=True)
                with TabPane("Instructions", id="tab-instructions"):
                    yield TextArea("loading…", read_only=True, id="instructions", soft_wrap=True)
                with TabPane("task.yaml", id="tab-task"):
                    yield TextArea("loading…", read_only=True, id="task", soft_wrap=True)

    def _verification_line(self) -> Content:
        v = self.verification
        if v is None:
            return Content.from_markup("[b]Verification[/] not run (or not finished)")
        passed = {True: "passed", False: "failed", None: "inconclusive"}[v.passed]
        return Content.from_markup(
            "[b]Verification[/] $passed · exit $code · reward $reward · $took$user",
            passed=passed,
            code=fmt.DASH if v.exit_code is None else str(v.exit_code),
            reward=fmt.DASH if v.reward is None else f"{v.reward:g}",
            took=fmt.seconds(v.duration_s),
            user=f" · as {v.user}" if v.user else "",
        )

    def on_mount(self) -> None:
        for area in self.query(TextArea):
            area.cursor_blink = False
        self._load()

    @work(thread=True, exclusive=True)
    def _load(self) -> None:
        texts: dict[str, str] = {}
        reader = RunDirReader(self.run_dir, check=False) if self.run_dir is not None else None
        got = reader.verifier_output() if reader else None
        if got is None and self.verification is not None:  # it ran (the line above says how): no files
            texts["verify-stdout"] = f"{NOT_RECORDED} (no {RunFiles.VERIFY_STDOUT} in this run directory)"
            texts["verify-stderr"] = f"{NOT_RECORDED} (no {RunFiles.VERIFY_STDERR} in this run directory)"
        elif got is None:
            texts["verify-stdout"] = texts["verify-stderr"] = f"{NOT_RECORDED}: the verifier did not run"
        else:
            texts["verify-stdout"] = got[0] or "(empty)"
            texts["verify-stderr"] = got[1] or "(empty)"
        prompt = reader.prompt() if reader else None
        texts["prompt"] = prompt if prompt is not None else f"{NOT_RECORDED} (no {RunFiles.PROMPT})"
        instructions = reader.instructions() if reader else None
        if instructions is not None:
            texts["instructions"] = instructions
        elif prompt is not None:
            texts["instructions"] = "none: the task has no instructions file"
        else:
            texts["instructions"] = f"{NOT_RECORDED} (no {RunFiles.INSTRUCTIONS})"
        task = reader.task_yaml() if reader else None
        if task is None and self.info is not None and self.info.task_dir:
            source = Path(self.info.task_dir) / "task.yaml"
            try:
                task = (
                    f"# {NOT_RECORDED} in the run directory; {source} as it is now (it may have changed)\n"
                    + source.read_text(encoding="utf-8")
                )
            except OSError:
                task = None
        texts["task"] = task if task is not None else f"{NOT_RECORDED} (no {RunFiles.TASK_YAML})"
        self.app.call_from_thread(self._loaded, texts)

    def _loaded(self, texts: dict[str, str]) -> None:
        self.texts = texts
        for wid, text in texts.items():
            self.query_one(f"#{wid}", TextArea).load_text(text)
        self.loaded = True

    def _active_view(self) -> Widget:
        active = self.query_one(TabbedContent).active
        if active == "tab-cleanup":
            return self.query_one("#cleanup-view")
        if active == "tab-verifier":
            focused = self.focused
            return focused if isinstance(focused, TextArea) else self.query_one("#verify-stdout")
        return self.query_one(f"#{active.removeprefix('tab-')}")

    def action_scroll_end(self) -> None:
        view = self._active_view()
        if isinstance(view, TextArea):
            view.move_cursor(view.document.end)
        view.scroll_end(animate=False, immediate=True)

    def action_scroll_home(self) -> None:
        view = self._active_view()
        if isinstance(view, TextArea):
            view.move_cursor((0, 0))
        view.scroll_home(animate=False, immediate=True)

    def copy_text(self) -> str:
        view = self._active_view()
        if isinstance(view, TextArea):
            return view.text
        shown = self.query_one("#cleanup-detail", Static).render()
        return shown.plain if isinstance(shown, Content) else str(shown)

    def action_copy(self) -> None:
        text = self.copy_text()
        self.app.copy_to_clipboard(text)
        self.app.post_message(Copied("inspect", text))
        self.notify("Copied to the clipboard (OSC 52)", timeout=2)
