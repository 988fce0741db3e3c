"""The detail of an episode-health warning or a kernel fault seen live (Enter on its row of the Failures
panel): what it says, when, and the data it carries; the model calls it names are buttons that open
them (the screen closes with the call id, as the failure detail does)."""

from __future__ import annotations

import json
from collections.abc import Collection

from textual.binding import Binding
from textual.content import Content

from opencode_tui.screens.modals import CallLinksDetail
from opencode_tui_core.events import HealthWarning, SandboxFault

Noticed = HealthWarning | SandboxFault


def named_call_ids(record: Noticed, model_calls: Collection[str]) -> list[str]:
    """The model calls among the ids a warning's data names (``call_id``, ``call_ids``): a silent
    command's ``call_id`` is a tool call's, not a model call's, and is not offered."""
    if not isinstance(record, HealthWarning):
        return []
    data = record.data
    ids = [data.get("call_id"), *(data.get("call_ids") or [])]
    return list(dict.fromkeys(i for i in ids if isinstance(i, str) and i in model_calls))


class WarningDetailScreen(CallLinksDetail):
    """One health warning or live kernel fault in full; dismisses with a model call id to open."""

    BINDINGS = [
        Binding("escape,q", "dismiss", "Close", id="warning.close"),
        Binding("y", "copy", "Copy", id="warning.copy"),
    ]
    part = "warning"
    record: Noticed

    def __init__(self, record: Noticed, model_calls: Collection[str] = ()) -> None:
        super().__init__(classes="modal")
        self.record = record
        self.call_ids = named_call_ids(record, model_calls)

    @property
    def heading(self) -> str:
        r = self.record
        return f"Health warning {r.kind.value}" if isinstance(r, HealthWarning) else f"Kernel {r.kind.value}"

    def render_detail(self) -> Content:
        r = self.record
        out: list[Content] = []

        def field(label: str, value: object) -> None:
            out.append(Content.from_markup("[b]$k[/]$v", k=f"{label:<16}", v=str(value)))

        out.append(Content.from_markup("[b $warning]$kind[/]", kind=r.kind.value))
        if isinstance(r, HealthWarning):
            field("what", "an episode-health warning: shown and counted, never a failure or the outcome")
        else:
            field("seen by", r.source)
            if r.command:
                field("process", f"{r.command} (pid {r.pid if r.pid is not None else '?'})")
            if r.tool_command:
                field("agent command", r.tool_command)
        field("at", r.ts.isoformat())
        out.append(Content(""))
        out.append(Content.from_markup("[b $primary]Message[/]"))
        out.append(Content(r.message))
        if isinstance(r, HealthWarning) and r.data:
            out.append(Content(""))
            out.append(Content.from_markup("[b $primary]Data[/]"))
            out.append(Content(json.dumps(r.data, indent=2, sort_keys=True, default=str)))
        return Content("\n").join(out)
