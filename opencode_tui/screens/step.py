"""One step of the agent, opened from the timeline or the terminal pane (Enter): a tool call's command or
arguments, its whole output as recorded, its exit status and duration, and the model call whose answer
asked for it (``m`` opens that call). The step itself is ``opencode_tui_core.diff.Step`` (``episode_steps``), the same
record the diff aligns, so the two views cannot disagree about what a step was."""

from __future__ import annotations

import json
from datetime import datetime

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static, TextArea

from opencode_tui import format as fmt
from opencode_tui.messages import Copied
from opencode_tui_core.diff import Step
from opencode_tui_core.events import ModelCall


def step_command(step: Step) -> str:
    """What the tool was asked to do: a bash command as typed, else the arguments as JSON."""
    command = step.args.get("command")
    if step.name == "bash" and isinstance(command, str):
        return f"$ {command}"
    return json.dumps(step.args, indent=2, ensure_ascii=False, default=str)


def exit_words(step: Step) -> str:
    """The exit status, or what is known instead (a non-bash tool has none; OpenCode's status then)."""
    if step.exit_code is not None:
        return f"{step.exit_code} ({step.status})"
    if step.status == "running":
        return "still running at this point of the run"
    if step.name == "bash":
        return f"not reported (OpenCode says {step.status})"
    return f"{step.status} (a {step.name} call has no exit status)"


def asked_by_words(step: Step, call: ModelCall | None, start: datetime | None) -> str:
    if step.asked_by is None:
        return "unknown (no model call carries this call's message id)"
    if call is None:
        return f"model call {step.asked_by}"
    status = fmt.DASH if call.status is None else str(call.status)
    return f"model call {call.call_id} ({call.kind}, {status}, at {fmt.offset(call.started_at, start)}) · m opens it"


class StepScreen(ModalScreen[str | None]):
    """A tool call in full; dismisses with the asking model call's id when ``m`` asks to open it."""

    BINDINGS = [
        Binding("escape,q", "dismiss(None)", "Close", id="step.close"),
        Binding(
            "m",
            "open_call",
            "Model call",
            tooltip="Open the model call that asked for this step",
            id="step.call",
        ),
        Binding("y", "copy", "Copy", tooltip="Copy the command and its output", id="step.copy"),
    ]

    def __init__(self, step: Step, asked: ModelCall | None = None, start: datetime | None = None) -> None:
        super().__init__(classes="modal")
        self.step = step
        self.asked = asked
        self.start = start

    def compose(self) -> ComposeResult:
        s = self.step
        with Vertical(id="dialog", classes="dialog detail step") as dialog:
            dialog.border_title = f"Step · {s.name} {s.call_id}"
            dialog.border_subtitle = "m model call · y copy · esc close"
            yield Static(self._summary(), id="step-summary")
            yield Static(Content.from_markup("[b]Command[/]" if s.name == "bash" else "[b]Arguments[/]"))
            yield TextArea(step_command(s), read_only=True, soft_wrap=True, id="step-command")
            output = s.output or ""
            yield Static(
                Content.from_markup(
                    "[b]Output[/] [dim]$n[/]", n=f"{len(output):,} characters" if output else "none recorded"
                ),
                id="step-output-title",
            )
            yield TextArea(output, read_only=True, soft_wrap=True, id="step-output")

    def _summary(self) -> Content:
        s = self.step
        fields = [
            ("tool", s.name + (f" · {s.title}" if s.title else "")),
            ("exit status", exit_words(s)),
            ("duration", fmt.seconds(s.duration_s, 2)),
            ("started", fmt.offset(s.started_at, self.start)),
            ("asked for by", asked_by_words(s, self.asked, self.start)),
        ]
        return Content("\n").join(Content.from_markup("[b]$k[/]$v", k=f"{k:<14}", v=v) for k, v in fields)

    def on_mount(self) -> None:
        for area in self.query(TextArea):
            area.cursor_blink = False
        self.query_one("#step-output", TextArea).focus()

    def action_open_call(self) -> None:
        if self.step.asked_by is None:
            self.notify("No model call is known to have asked for this step.", timeout=4)
            return
        self.dismiss(self.step.asked_by)

    def action_copy(self) -> None:
        text = f"{step_command(self.step)}\n{self.step.output or ''}"
        self.app.post_message(Copied("step", text))
