"""Modal screens: confirm, model-call detail, failure detail, waiting for cleanup."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import (
    Button,
    Collapsible,
    Label,
    LoadingIndicator,
    Static,
    TabbedContent,
    TabPane,
    TextArea,
)

from opencode_tui import format as fmt
from opencode_tui.messages import Copied
from opencode_tui_core.artifacts import RunDirReader
from opencode_tui_core.calls.records import ModelCallRecord, failed_call_words
from opencode_tui_core.events import FailureRecorded, FailureRecovered, ModelCall
from opencode_tui_core.failures import FailureEvent, describe_decision
from opencode_tui_core.failures.model import ModelCallDetails
from opencode_tui_core.model import (
    AssembledResponse,
    Conversation,
    ToolCallMade,
    assemble_response,
    conversation,
)

NOT_RECORDED = "not recorded"
NOT_SENT = "no reply yet: the debugger holds this call before it is sent to the model"


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; dismisses with True only on an explicit yes."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
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


# The bodies have their own tabs; an edited call's own model reply is shown under what OpenCode got.
BODIES = frozenset({"request_body", "response_body", "model_response_body"})


def _body(record: ModelCallRecord | None, which: str) -> str:
    """The request or response body of a model call's record."""
    if record is None:
        return NOT_RECORDED
    body = record.request_body if which == "request" else record.response_body
    text = NOT_RECORDED if body is None else fmt.pretty_json(body)
    if which == "response" and record.model_response_body is not None:
        text += "\n\n── the model's own reply (a person edited it; above is what OpenCode got) ──\n"
        text += fmt.pretty_json(record.model_response_body)
    return text


def _record_meta(record: ModelCallRecord) -> dict[str, Any]:
    """The record without its bodies: headers (redacted by the recorder), usage, finish reason..."""
    return record.model_dump(mode="json", exclude=set(BODIES))


def _header(headers: dict[str, str], *names: str) -> str | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in names:
        if lowered.get(name):
            return lowered[name]
    return None


def _pretty(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


ROLE_STYLE = {"user": "$primary", "assistant": "$success", "tool": "$warning", "system": "$accent"}


def conversation_content(conv: Conversation) -> list[Content | tuple[str, Content]]:
    """The request as a conversation: Content blocks, and (title, body) pairs shown collapsed."""
    out: list[Content | tuple[str, Content]] = []
    settings = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in conv.settings.items())
    out.append(
        Content.from_markup(
            "[b]model[/] $model · [b]$n[/] · $settings",
            model=conv.model or "?",
            n=f"{len(conv.messages)} message" + ("" if len(conv.messages) == 1 else "s"),
            settings=settings or "no settings",
        )
    )
    for i, text in enumerate(conv.system, 1):
        label = "System prompt" if len(conv.system) == 1 else f"System prompt {i}"
        out.append((f"{label} · {len(text):,} characters", Content(text)))
    if conv.tools:
        names = ", ".join(t.name for t in conv.tools)
        body = Content("\n\n").join(
            Content.from_markup("[b]$name[/]  $desc\n", name=t.name, desc=t.description)
            + Content(_pretty(t.parameters))
            for t in conv.tools
        )
        out.append((f"Tools · {len(conv.tools)}: {names}", body))
    for m in conv.messages:
        style = ROLE_STYLE.get(m.role, "$foreground")
        head = Content.from_markup(f"[b {style}]$role[/]", role=m.role)
        if m.tool_call_id:
            head += Content.from_markup(" [dim]result of $id[/]", id=m.tool_call_id)
        if m.name:
            head += Content.from_markup(" [dim]$name[/]", name=m.name)
        parts = [head]
        if m.text:
            parts.append(Content(m.text))
        for call in m.tool_calls:
            parts.append(_call_content(call))
        if m.other_parts:
            parts.append(Content.from_markup("[dim]other parts: $p[/]", p=", ".join(m.other_parts)))
        out.append(Content("\n").join(parts))
    return out


def _call_content(call: ToolCallMade) -> Content:
    args = _pretty(call.arguments) if call.parsed else call.arguments_raw
    note = "" if call.parsed else "  (arguments are not valid JSON: shown as received)"
    return Content.from_markup(
        "[b $warning]→ $name[/] [dim]$id$note[/]\n", name=call.name, id=call.id or "", note=note
    ) + Content(args)


def response_content(resp: AssembledResponse) -> Content:
    """The response as the client assembled it: reasoning, text, tool calls (arguments parsed)."""
    parts: list[Content] = []
    how = f"assembled from {resp.chunks} stream chunks" if resp.streamed else "JSON response"
    parts.append(
        Content.from_markup(
            "[b]finish reason[/] $finish · $how", finish=resp.finish_reason or fmt.DASH, how=how
        )
    )
    if resp.reasoning:
        parts.append(Content.from_markup("[b $accent]reasoning[/]"))
        parts.append(Content.styled(resp.reasoning, "italic $foreground-muted"))
    if resp.text:
        parts.append(Content.from_markup("[b $success]text[/]"))
        parts.append(Content(resp.text))
    if resp.tool_calls:
        parts.append(Content.from_markup("[b $warning]tool calls[/] ($n)", n=str(len(resp.tool_calls))))
        parts += [_call_content(c) for c in resp.tool_calls]
    if not (resp.reasoning or resp.text or resp.tool_calls):
        parts.append(Content.from_markup("[dim]no text, reasoning or tool call in the response[/]"))
    if resp.errors:
        parts.append(Content.from_markup("[b $error]errors in the response[/]"))
        parts += [Content(e) for e in resp.errors]
    if resp.usage is not None:
        parts.append(Content.from_markup("[b]usage[/] $u", u=json.dumps(resp.usage)))
    return Content("\n").join(parts)


class ModelCallScreen(ModalScreen[None]):
    """One model call: the event's fields; the request as a conversation and the response assembled
    from the stream (``r``: the raw bodies as recorded), from model_calls.jsonl."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close", id="call.close"),
        Binding("y", "copy", "Copy", id="call.copy"),
        Binding("r", "toggle_raw", "Raw/readable", id="call.raw"),
        # End/Home reach the end/start of the tab's content, whatever has the focus inside it
        Binding("end", "scroll_end", "End", show=False, priority=True, id="call.end"),
        Binding("home", "scroll_home", "Home", show=False, priority=True, id="call.home"),
    ]

    raw: reactive[bool] = reactive(False, init=False)

    def __init__(
        self,
        call: ModelCall,
        run_dir: Path | None,
        *,
        record: ModelCallRecord | None = None,
        held: str | None = None,
    ) -> None:
        """``record``: the bodies, when they are not read from model_calls.jsonl (a call the debugger
        holds is recorded only once it is released); ``held``: the words for such a call's title."""
        super().__init__(classes="modal")
        self.call = call
        self.run_dir = run_dir
        self.record: ModelCallRecord | None = record
        self.held = held
        self.loaded = False

    def compose(self) -> ComposeResult:
        c = self.call
        with Vertical(id="dialog", classes="dialog detail") as dialog:
            dialog.border_title = f"Model call {c.call_id}" + (f" · {self.held}" if self.held else "")
            dialog.border_subtitle = self._subtitle()
            with TabbedContent(id="call-tabs"):
                with TabPane("Call", id="tab-call"), VerticalScroll(id="call-view"):
                    yield Static(self._summary(), id="call-summary")
                with TabPane("Request", id="tab-request"):
                    yield VerticalScroll(Static("loading…"), id="request-view", classes="readable")
                    yield TextArea("loading…", read_only=True, id="request", soft_wrap=True, classes="raw")
                with TabPane("Response", id="tab-response"):
                    yield VerticalScroll(Static("loading…"), id="response-view", classes="readable")
                    yield TextArea("loading…", read_only=True, id="response", soft_wrap=True, classes="raw")

    def _subtitle(self) -> str:
        view = "raw bodies" if self.raw else "readable"
        return f"{view} · r {'readable' if self.raw else 'raw'} · end/home · y copy · esc close"

    @property
    def session_id(self) -> str | None:
        """The event's, or (runs recorded before the proxy read OpenCode's header) the request's."""
        if self.call.session_id:
            return self.call.session_id
        if self.record is not None:
            return self.record.session_id or _header(
                self.record.request_headers, "x-opencode-session", "x-session-id"
            )
        return None

    def _summary(self) -> Content:
        c = self.call
        fields = [
            ("call id", c.call_id),
            ("kind", c.kind),
            ("status", fmt.DASH if c.status is None else str(c.status)),
            ("latency", fmt.seconds(c.latency_s, 3)),
            *(
                [("held", f"{fmt.seconds(c.held_s, 3)} by the debugger (not in the latency)")]
                if c.held_s
                else []
            ),
            ("TTFT", fmt.seconds(c.ttft_s, 3)),
            ("tokens in / out", f"{fmt.count(c.tokens_in)} / {fmt.count(c.tokens_out)}"),
            ("cache read / reasoning", f"{fmt.count(c.tokens_cache_read)} / {fmt.count(c.tokens_reasoning)}"),
            ("method / path", f"{c.method} {c.path}"),
            ("started", c.started_at.isoformat()),
            ("session id", self.session_id or fmt.DASH),
            ("message id", c.message_id or "none (not attributed)"),
            # a failed call says why: the proxy's error, else the upstream's status and body excerpt
            (
                "error",
                failed_call_words(c.status, c.error, self.record.response_body if self.record else None)
                or fmt.DASH,
            ),
        ]
        if self.held is not None:
            fields.append(("bodies", "from the debugger (recorded once the call is released)"))
        elif self.loaded:
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
        self._show_mode()
        if self.held is not None:
            self._loaded(self.record)
            self.query_one(TabbedContent).active = "tab-request"
        else:
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
        self._fill_readable()

    def _fill_readable(self) -> None:
        request = self.query_one("#request-view", VerticalScroll)
        response = self.query_one("#response-view", VerticalScroll)
        request.remove_children()
        response.remove_children()
        record = self.record
        if record is None or record.request_body is None:
            request.mount(Static(NOT_RECORDED))
        else:
            conv = conversation(record.request_body)
            if not conv.understood:
                request.mount(Static("Not a chat request this view understands: r shows it raw."))
            blocks = conversation_content(conv) if conv.understood else []
            for i, block in enumerate(blocks):
                if isinstance(block, tuple):
                    title, body = block
                    request.mount(Collapsible(Static(body), title=title, collapsed=True))
                else:  # the first block is the model and settings line, then one per message
                    request.mount(Static(block, classes="settings" if i == 0 else "message"))
        if record is None or record.response_body is None:
            response.mount(Static(NOT_SENT if self.held else NOT_RECORDED))
        else:
            resp = assemble_response(record.response_body)
            if resp.understood:
                response.mount(Static(response_content(resp), id="response-assembled"))
            else:
                response.mount(Static("Not a response this view understands: r shows it raw."))

    def watch_raw(self) -> None:
        self._show_mode()

    def _show_mode(self) -> None:
        for widget in self.query(".readable"):
            widget.display = not self.raw
        for widget in self.query(".raw"):
            widget.display = self.raw
        self.query_one("#dialog").border_subtitle = self._subtitle()

    def action_toggle_raw(self) -> None:
        self.raw = not self.raw

    def _active_view(self) -> Widget:
        active = self.query_one(TabbedContent).active
        if active == "tab-request":
            return self.query_one("#request" if self.raw else "#request-view")
        if active == "tab-response":
            return self.query_one("#response" if self.raw else "#response-view")
        return self.query_one("#call-view")

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


def failure_call_ids(failure: FailureEvent) -> list[str]:
    """The model calls a failure names: its details' call id, and any ``call_id`` in its evidence."""
    ids: list[str] = []
    if isinstance(failure.details, ModelCallDetails):
        ids.append(failure.details.call_id)
    for ev in failure.evidence:
        cid = ev.data.get("call_id") if isinstance(ev.data, dict) else None
        if isinstance(cid, str) and cid:
            ids.append(cid)
    return list(dict.fromkeys(ids))


class CallLinksDetail(ModalScreen[str | None]):
    """A detail screen whose model calls are buttons: Enter on one closes it with that call id (the run
    screen then opens the call). Subclasses give ``heading``, ``call_ids`` and ``render_detail``."""

    call_ids: list[str]
    record: BaseModel  # what ``y`` copies, whole
    part = "detail"  # the body's and the detail's widget ids (``{part}-body``), and what was copied

    @property
    def heading(self) -> str:
        raise NotImplementedError

    def render_detail(self) -> Content:
        raise NotImplementedError

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog detail") as dialog:
            dialog.border_title = self.heading
            opens = " · enter opens the model call" if self.call_ids else ""
            dialog.border_subtitle = f"y copy{opens} · esc close"
            with VerticalScroll(id=f"{self.part}-body"):
                for i, cid in enumerate(self.call_ids):
                    label = "model call" if i == 0 else "also"
                    with Horizontal(classes="call-row"):
                        yield Label(Content.from_markup("[b]$k[/]", k=f"{label:<16}"))
                        yield Button(f"{cid} ⏎", id=f"call-link-{i}", classes="call-link", compact=True)
                yield Static(self.render_detail(), id=f"{self.part}-detail")

    def on_mount(self) -> None:
        if self.call_ids:
            self.query_one("#call-link-0", Button).focus()

    def copy_text(self) -> str:
        return json.dumps(json.loads(self.record.model_dump_json()), indent=2)

    def action_copy(self) -> None:
        text = self.copy_text()
        self.app.copy_to_clipboard(text)
        self.app.post_message(Copied(self.part, text))
        self.notify("Copied to the clipboard (OSC 52)", timeout=2)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id and event.button.id.startswith("call-link-"):
            event.stop()
            self.dismiss(self.call_ids[int(event.button.id.removeprefix("call-link-"))])


class FailureScreen(CallLinksDetail):
    """One failure event in full: decision, message, cause chain, evidence, typed details.

    A failure that names a model call shows its call id as a button: Enter on it closes this screen
    with that call id (the run screen then opens the call)."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close", id="failure.close"),
        Binding("y", "copy", "Copy", id="failure.copy"),
    ]
    part = "failure"
    record: FailureRecorded | FailureRecovered

    def __init__(self, record: FailureRecorded | FailureRecovered, in_batch: bool = False) -> None:
        super().__init__(classes="modal")
        self.record = record
        self.in_batch = in_batch  # a batch's attempt: its ``retry`` was carried out
        self.call_ids = failure_call_ids(record.failure)

    @property
    def heading(self) -> str:
        return f"Failure {self.record.failure.kind}"

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
            line("[b]$k[/][b $accent]$v[/]", k=f"{'action':<16}", v=fmt.action_words(d.action, self.in_batch))
            field("decided by", describe_decision(d))
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


class CleanupWaitScreen(ModalScreen[None]):
    """Shown after a confirmed quit/cancel while the engine closes the episode; cannot be dismissed."""

    BINDINGS = [Binding("q,escape,ctrl+q", "still_waiting", "Waiting…", show=False, id="wait.still-waiting")]

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
