"""The fork modal (``F`` on a replay, issue 28): fork the run at a model call, answered from its record
up to that step, then the recorded (scripted) model or another at a URL, optionally saying something
first. Dismisses with the ``LineageRequest`` to run, or None."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from opencode_tui.lineage_request import LineageRequest


class ForkScreen(ModalScreen[LineageRequest | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="fork.cancel")]

    def __init__(
        self, request: LineageRequest, steps: int, *, start: int | None = None, moved: str | None = None
    ) -> None:
        """``start``: the step the fork really starts from, and ``moved`` why, when the recorded answer
        at the step asked for (``request.at``) was cut or failed (``opencode_tui_core.model.replay.fork_point``)."""
        super().__init__(classes="modal")
        self.request, self.steps = request, steps
        self.start = start if start is not None else request.at or 0
        self.moved = moved

    def compose(self) -> ComposeResult:
        r = self.request
        at = self.start
        with Vertical(id="dialog", classes="dialog confirm fork"):
            yield Label(
                Content.from_markup("[b]Fork at step $at of $n[/]", at=str(at), n=str(self.steps)),
                id="question",
            )
            if self.moved:
                # which step, and why the fork starts before it (the CLI says the same line)
                yield Static(Content(f"⚠ {self.moved.removeprefix(f'--at {r.at}: ')}"), id="fork-moved")
            yield Static(
                Content(
                    f"Agent model calls 1-{at} are answered from {r.run_dir.name}'s record (the files as "
                    f"they were); from call {at + 1} on, the model below. Empty: the recorded model."
                ),
                id="detail",
            )
            yield Input(placeholder="model URL (empty: the recorded model)", id="fork-url")
            yield Input(placeholder="model name at that URL", id="fork-model")
            yield Input(placeholder="say first (a user message at the fork point; optional)", id="fork-say")
            with Horizontal(id="buttons"):
                yield Button("Fork (enter)", variant="primary", id="fork")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#fork-url", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._confirm()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "fork":
            self._confirm()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _confirm(self) -> None:
        url = self.query_one("#fork-url", Input).value.strip()
        model = self.query_one("#fork-model", Input).value.strip()
        say = self.query_one("#fork-say", Input).value.strip()
        if model and not url:
            self.notify("A model name needs a model URL too (or leave both empty).", severity="error")
            return
        self.dismiss(
            self.request.model_copy(
                update={"model_url": url or None, "model": model or None, "say": say or None}
            )
        )
