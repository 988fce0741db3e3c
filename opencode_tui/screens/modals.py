"""Modal screens: confirm, model-call detail, failure detail, waiting for cleanup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Label, LoadingIndicator, Static, TabbedContent, TabPane, TextArea

from core.artifacts import RunDirReader
from core.events import FailureRecorded, FailureRecovered, ModelCall
from core.model.records import ModelCallRecord
from opencode_tui import format as fmt
from opencode_tui.messages import Copied

NOT_RECORDED = "not recorded"


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; dismisses with True only on an explicit yes."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, detail: str = "", yes: str = "Yes", no: str = "No") -> None:
        super().__init__(classes="modal")
        self.question, self.detail, self.yes, self.no = question, detail, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog confirm"):
            yield Label(Content.from_markup("[b]$q[/]", q=self.question), id="question")
            if self.detail:
                yield Static(Content(self.detail), id="detail")
            with Horizontal(id="buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="yes")
                yield Button(f"{self.no} (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


BODIES = frozenset({"request_body", "response_body"})


def _body(record: ModelCallRecord | None, which: str) -> str:
    """The request or response body of a model call's record."""
    if record is None:
        return NOT_RECORDED
    body = record.request_body if which == "request" else record.response_body
    return NOT_RECORDED if body is None else fmt.pretty_json(body)


def _record_meta(record: ModelCallRecord) -> dict[str, Any]:
    """The record without its bodies: headers (redacted by the recorder), usage, finish reason..."""
    return record.model_dump(mode="json", exclude=set(BODIES))


class ModelCallScreen(ModalScreen[None]):
    """One model call: the event's fields, and its redacted request/response from model_calls.jsonl."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        Binding("y", "copy", "Copy"),
    ]

    def __init__(self, call: ModelCall, run_dir: Path | None) -> None:
        super().__init__(classes="modal")
        self.call = call
        self.run_dir = run_dir
        self.record: ModelCallRecord | None = None
        self.loaded = False

    def compose(self) -> ComposeResult:
        c = self.call
        with Vertical(id="dialog", classes="dialog detail") as dialog:
            dialog.border_title = f"Model call {c.call_id}"
            dialog.border_subtitle = "y copy · esc close"
            with TabbedContent(id="call-tabs"):
                with TabPane("Call", id="tab-call"), VerticalScroll():
                    yield Static(self._summary(), id="call-summary")
                with TabPane("Request", id="tab-request"):
                    yield TextArea("loading…", read_only=True, id="request", soft_wrap=True)
                with TabPane("Response", id="tab-response"):
                    yield TextArea("loading…", read_only=True, id="response", soft_wrap=True)

    def _summary(self) -> Content:
        c = self.call
        fields = [
            ("call id", c.call_id),
            ("kind", c.kind),
            ("method / path", f"{c.method} {c.path}"),
            ("status", fmt.DASH if c.status is None else str(c.status)),
            ("started", c.started_at.isoformat()),
            ("latency", fmt.seconds(c.latency_s, 3)),
            ("TTFT", fmt.seconds(c.ttft_s, 3)),
            ("session id", c.session_id or fmt.DASH),
            ("message id", c.message_id or "none (not attributed)"),
            ("tokens in / out", f"{fmt.count(c.tokens_in)} / {fmt.count(c.tokens_out)}"),
            ("cache read / reasoning", f"{fmt.count(c.tokens_cache_read)} / {fmt.count(c.tokens_reasoning)}"),
            ("error", c.error or fmt.DASH),
        ]
        if self.loaded:
            fields.append(
                ("bodies", "from model_calls.jsonl" if self.record else f"{NOT_RECORDED} (no record)")
            )
        lines = [Content.from_markup("[b]$k[/]$v", k=f"{k:<24}", v=v) for k, v in fields]
        if self.record:
            lines.append(Content.from_markup("\n[b $primary]Recorded by the proxy[/]"))
            lines.append(Content(json.dumps(_record_meta(self.record), indent=2, default=str)))
        return Content("\n").join(lines)

    def on_mount(self) -> None:
        for area in self.query(TextArea):
            area.cursor_blink = False
        self._load()

    @work(thread=True, exclusive=True)
    def _load(self) -> None:
        record = None
        if self.run_dir is not None:
            record = RunDirReader(self.run_dir, check=False).model_call(self.call.call_id)
        self.app.call_from_thread(self._loaded, record)

    def _loaded(self, record: ModelCallRecord | None) -> None:
        self.record = record
        self.loaded = True
        self.query_one("#request", TextArea).load_text(_body(record, "request"))
        self.query_one("#response", TextArea).load_text(_body(record, "response"))
        self.query_one("#call-summary", Static).update(self._summary())

    def copy_text(self) -> str:
        active = self.query_one(TabbedContent).active
        if active == "tab-request":
            return _body(self.record, "request")
        if active == "tab-response":
            return _body(self.record, "response")
        data = json.loads(self.call.model_dump_json())
        if self.record is not None:
            data["record"] = self.record.model_dump(mode="json")
        return json.dumps(data, indent=2)

    def action_copy(self) -> None:
        text = self.copy_text()
        self.app.copy_to_clipboard(text)
        self.app.post_message(Copied("model call", text))
        self.notify("Copied to the clipboard (OSC 52)", timeout=2)


class FailureScreen(ModalScreen[None]):
    """One failure event in full: decision, message, cause chain, evidence, typed details."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close"),
        Binding("y", "copy", "Copy"),
    ]

    def __init__(self, record: FailureRecorded | FailureRecovered) -> None:
        super().__init__(classes="modal")
        self.record = record

    def compose(self) -> ComposeResult:
        f = self.record.failure
        with Vertical(id="dialog", classes="dialog detail") as dialog:
            dialog.border_title = f"Failure {f.kind}"
            dialog.border_subtitle = "y copy · esc close"
            with VerticalScroll(id="failure-body"):
                yield Static(self.render_detail(), id="failure-detail")

    def render_detail(self) -> Content:
        f = self.record.failure
        out: list[Content] = []

        def line(markup: str, **values: object) -> None:
            out.append(Content.from_markup(markup, **values))

        def field(label: str, value: object) -> None:
            line("[b]$k[/]$v", k=f"{label:<16}", v=str(value))

        line("[b $error]$kind[/]", kind=f.kind)
        field("stage", f.stage)
        if isinstance(self.record, FailureRecovered):
            # Recovered by the provider: no class, no policy action; it never decides the outcome.
            line(
                "[b]$k[/][b $success]$v[/]",
                k=f"{'recovered':<16}",
                v=fmt.recovery_label(self.record.recovery),
            )
        else:
            d = self.record.decision
            field("class", d.failure_class)
            line("[b]$k[/][b $accent]$v[/]", k=f"{'action':<16}", v=str(d.action))
            field(
                "decided by",
                f"{d.level} rule '{d.rule}'" + (" (retries exhausted)" if d.retries_exhausted else ""),
            )
        field("operation", f.operation)
        field("http status", fmt.DASH if f.http_status is None else f.http_status)
        field("occurred at", f.occurred_at.isoformat())
        field("attempt", self.record.attempt)
        line("")
        line("[b $primary]Message[/]")
        out.append(Content(f.message))
        line("")
        line("[b $primary]Cause chain[/]")
        if f.cause is None:
            line("[dim]no exception recorded[/]")
        else:
            for i, cause in enumerate(f.cause.chain()):
                prefix = "" if i == 0 else "caused by "
                line(
                    "$indent$prefix[b]$type[/]: $msg",
                    indent="  " * i,
                    prefix=prefix,
                    type=cause.type,
                    msg=cause.message,
                )
        line("")
        line("[b $primary]Evidence[/]")
        if not f.evidence:
            line("[dim]none: the diagnosis rests on no authoritative observation[/]")
        for ev in f.evidence:
            line("• [b]source[/] $s", s=ev.source)
            line("  [b]scope[/] $s", s=ev.scope or fmt.DASH)
            line("  [b]observed at[/] $s", s=ev.observed_at.isoformat())
            data = json.dumps(ev.data, indent=2, sort_keys=True, default=str)
            out.append(Content("  data " + data.replace("\n", "\n  ")))
        line("")
        line("[b $primary]Details[/]")
        if f.details is None:
            line("[dim]none[/]")
        else:
            out.append(Content(json.dumps(json.loads(f.details.model_dump_json()), indent=2)))
        return Content("\n").join(out)

    def copy_text(self) -> str:
        return json.dumps(json.loads(self.record.model_dump_json()), indent=2)

    def action_copy(self) -> None:
        text = self.copy_text()
        self.app.copy_to_clipboard(text)
        self.app.post_message(Copied("failure", text))
        self.notify("Copied to the clipboard (OSC 52)", timeout=2)


class CleanupWaitScreen(ModalScreen[None]):
    """Shown after a confirmed quit/cancel while the engine closes the episode; cannot be dismissed."""

    BINDINGS = [Binding("q,escape,ctrl+q", "still_waiting", "Waiting…", show=False)]

    def __init__(self, budget_s: float | None) -> None:
        super().__init__(classes="modal")
        self.budget_s = budget_s

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog wait"):
            yield Label(Content.from_markup("[b]Cancelling the episode[/]"))
            budget = f" (close budget {self.budget_s:g} s)" if self.budget_s else ""
            yield Static(
                f"Waiting for the engine to confirm cleanup and release the sandbox{budget}. "
                "The cleanup panel behind this dialog shows each step.",
                id="wait-text",
            )
            yield LoadingIndicator()

    def action_still_waiting(self) -> None:
        self.notify(
            "Still waiting for cleanup to finish; the app exits as soon as it is confirmed.", timeout=3
        )
