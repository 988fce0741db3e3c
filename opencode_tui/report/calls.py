"""The report's model calls (each expandable: the request as a conversation, the response assembled)
and tool calls."""

from __future__ import annotations

import json

from opencode_tui import format as fmt
from opencode_tui.report.collect import CallDetail, RunReport
from opencode_tui.report.html import clip, details, esc, pre, pretty
from opencode_tui_core.calls.records import failed_call_words
from opencode_tui_core.model import (
    AssembledResponse,
    Conversation,
    ToolCallMade,
    assemble_response,
    conversation,
)


def _tool_call_html(call: ToolCallMade, limit: int) -> str:
    args = pretty(call.arguments) if call.parsed else call.arguments_raw
    note = "" if call.parsed else " (arguments are not valid JSON: shown as received)"
    return f'<div><b class="warn">→ {esc(call.name)}</b> <span class="muted">{esc(call.id or "")}{note}</span>{pre(args, limit)}</div>'


def conversation_html(conv: Conversation, r: RunReport) -> str:
    limit, keep = r.limits.text_chars, r.limits.messages_per_call
    settings = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in conv.settings.items())
    out = [
        f"<p><b>model</b> {esc(conv.model or '?')} · {len(conv.messages)} messages · {esc(settings or 'no settings')}</p>"
    ]
    for i, text in enumerate(conv.system, 1):
        label = "System prompt" if len(conv.system) == 1 else f"System prompt {i}"
        out.append(details(f"{label} · {len(text):,} characters", pre(text, limit)))
    if conv.tools:
        names = ", ".join(t.name for t in conv.tools)
        body = "".join(
            f"<h3>{esc(t.name)}</h3><p>{esc(clip(t.description, 2000))}</p>{pre(pretty(t.parameters), 4000)}"
            for t in conv.tools
        )
        out.append(details(f"Tools · {len(conv.tools)}: {esc(names)}", body))
    messages = conv.messages
    if len(messages) > keep:
        out.append(
            f'<p class="note">{len(messages) - keep} earlier messages not embedded (the last {keep} are)</p>'
        )
        messages = messages[-keep:]
    for m in messages:
        head = f'<span class="role r-{esc(m.role)}">{esc(m.role)}</span>'
        if m.tool_call_id:
            head += f' <span class="muted">result of {esc(m.tool_call_id)}</span>'
        if m.name:
            head += f' <span class="muted">{esc(m.name)}</span>'
        body = head + (pre(m.text, limit) if m.text else "")
        body += "".join(_tool_call_html(c, limit) for c in m.tool_calls)
        if m.other_parts:
            body += f'<p class="muted">other parts: {esc(", ".join(m.other_parts))}</p>'
        out.append(f'<div class="msg">{body}</div>')
    return "".join(out)


def response_html(resp: AssembledResponse, limit: int) -> str:
    how = f"assembled from {resp.chunks} stream chunks" if resp.streamed else "JSON response"
    out = [f"<p><b>finish reason</b> {esc(resp.finish_reason or fmt.DASH)} · {esc(how)}</p>"]
    if resp.reasoning:
        out.append("<h3>reasoning</h3>" + pre(resp.reasoning, limit))
    if resp.text:
        out.append('<h3 class="ok">text</h3>' + pre(resp.text, limit))
    if resp.tool_calls:
        out.append(f'<h3 class="warn">tool calls ({len(resp.tool_calls)})</h3>')
        out += [_tool_call_html(c, limit) for c in resp.tool_calls]
    if not (resp.reasoning or resp.text or resp.tool_calls):
        out.append('<p class="muted">no text, reasoning or tool call in the response</p>')
    if resp.errors:
        out.append('<h3 class="err">errors in the response</h3>' + pre("\n".join(resp.errors), limit))
    if resp.usage is not None:
        out.append(f"<p><b>usage</b> <span class=mono>{esc(json.dumps(resp.usage))}</span></p>")
    return "".join(out)


def call_html(n: int, c: CallDetail, r: RunReport) -> str:
    ev = c.event
    start = r.state.start_time
    failed = ev.failed
    words = failed_call_words(ev.status, ev.error) if failed else None
    summary = (
        f'<span class="mono">#{n} {esc(fmt.offset(ev.started_at, start))}</span> · {esc(ev.kind)} · '
        f'<b class="{"err" if failed else "ok"}">{esc(fmt.status_word(ev))}</b> · '
        f"{esc(fmt.seconds(ev.latency_s))}"
        + (f" (held {esc(fmt.seconds(ev.held_s))})" if ev.held_s else "")
        + f" · tokens {esc(fmt.count(ev.tokens_in))}/{esc(fmt.count(ev.tokens_out))}"
        f' · <span class="mono muted">{esc(ev.call_id)}</span>'
        + (f' · <span class="err">{esc(fmt.short(words, 100))}</span>' if words else "")
    )
    limit = r.limits.text_chars
    if ev.call_id not in r.detailed:
        body = '<p class="muted">not embedded (see the limits at the top); open the run with `opencode-tui open`</p>'
    elif c.record is None:
        body = '<p class="muted">no record in model_calls.jsonl for this call</p>'
    else:
        rec = c.record
        conv = conversation(rec.request_body)
        resp = assemble_response(rec.response_body)
        request = (
            conversation_html(conv, r) if conv.understood else pre(fmt.pretty_json(rec.request_body), limit)
        )
        response = (
            response_html(resp, limit) if resp.understood else pre(fmt.pretty_json(rec.response_body), limit)
        )
        meta = rec.model_dump(mode="json", exclude={"request_body", "response_body", "model_response_body"})
        body = (
            details("Request (conversation)", request, open_=True)
            + details("Response (assembled)", response, open_=True)
            + details("Record (headers, usage, timings)", pre(pretty(meta), limit))
        )
    return details(summary, body, cls="call")


def calls_section(r: RunReport) -> str:
    rows = "".join(call_html(i, c, r) for i, c in enumerate(r.calls, 1))
    more = ""
    if r.calls_total > len(r.calls):
        more = f'<p class="note">{r.calls_total - len(r.calls):,} more model calls not listed</p>'
    return f'<section id="model-calls"><h2>Model calls ({r.calls_total:,})</h2>{rows or "<p class=muted>none</p>"}{more}</section>'


def tools_section(r: RunReport) -> str:
    limit = min(r.limits.text_chars, 8000)
    parts = []
    for t in r.tool_calls:
        cls = {"error": "err", "completed": "ok"}.get(t.status, "warn")
        summary = (
            f'<span class="mono">{esc(fmt.offset(t.ts, r.state.start_time))}</span> <b>{esc(t.tool)}</b> '
            f'<span class="{cls}">{esc(t.status)}</span> {esc(fmt.short(t.title or "", 100))}'
        )
        body = "<h3>input</h3>" + pre(pretty(t.input), limit)
        if t.output is not None:
            body += "<h3>output</h3>" + pre(t.output, limit)
        parts.append(details(summary, body, cls="tool"))
    more = ""
    if r.tool_calls_total > len(r.tool_calls):
        more = f'<p class="note">{r.tool_calls_total - len(r.tool_calls):,} more tool calls not listed</p>'
    return f'<section id="tool-calls"><h2>Tool calls ({r.tool_calls_total:,})</h2>{"".join(parts) or "<p class=muted>none</p>"}{more}</section>'
