"""A run's report as one self-contained HTML page: styles and script inline, nothing fetched.

Every text goes through ``esc``: redacted (``core.redaction``, as the run directory is) and then escaped.
Long content sits in ``<details>`` elements (expandable without the script); the script only adds
"expand all" / "collapse all".
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from core import __version__
from core.calls.records import failed_call_words
from core.events import FailureRecorded, FailureRecovered, HealthWarning, SandboxFault
from core.failures import describe_decision
from core.model import AssembledResponse, Conversation, ToolCallMade, assemble_response, conversation
from core.redaction import redact_text
from opencode_tui import format as fmt
from opencode_tui.report.collect import CallDetail, RunReport
from opencode_tui.state import CLEANUP_ORDER

CLEANUP_LABELS = {
    "receipt": "Cleanup receipt",
    "descendants": "Descendants drained",
    "transcript_snapshot": "Transcript snapshot",
    "sandbox_released": "Sandbox released",
}
ICONS = {"pending": "○", "running": "◐", "ok": "✓", "failed": "✗", "skipped": "–"}

STYLE = """
:root{--bg:#fafafa;--fg:#1d1f21;--muted:#6b7280;--line:#d9dce1;--err:#b42318;--warn:#a15c00;--ok:#067647;
--acc:#3949ab;--code:#f1f3f5}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,sans-serif;background:var(--bg);color:var(--fg)}
main{max-width:1200px;margin:0 auto;padding:16px 24px 64px}
h1{font-size:20px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:14px 0 6px}section,h2{scroll-margin-top:40px}
nav{position:sticky;top:0;background:var(--bg);border-bottom:1px solid var(--line);padding:6px 0;z-index:1}
nav a{margin-right:12px;color:var(--acc);text-decoration:none}nav button{float:right;margin-left:6px}
table{border-collapse:collapse;margin:4px 0}td,th{padding:2px 10px 2px 0;text-align:left;vertical-align:top}
th{color:var(--muted);font-weight:600;white-space:nowrap}
pre{background:var(--code);padding:8px;overflow:auto;white-space:pre-wrap;word-break:break-word;margin:4px 0}
pre.term{background:#272822;color:#f8f8f2;white-space:pre;max-height:80vh}
details{border:1px solid var(--line);border-radius:4px;margin:4px 0;padding:2px 8px;background:#fff}
summary{cursor:pointer;padding:2px 0}details[open]>summary{border-bottom:1px solid var(--line);margin-bottom:4px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;color:#fff;background:var(--muted)}
.b-scored{background:var(--ok)}.b-count_as_zero{background:var(--warn)}.b-retry,.b-infra_error{background:var(--err)}
.err{color:var(--err)}.warn{color:var(--warn)}.ok{color:var(--ok)}.muted{color:var(--muted)}
.s-ok{color:var(--ok)}.s-failed{color:var(--err)}.s-running{color:var(--warn)}.s-pending,.s-skipped{color:var(--muted)}
.role{font-weight:700}.r-user{color:var(--acc)}.r-assistant{color:var(--ok)}.r-tool{color:var(--warn)}
.note{background:#fff7e6;border:1px solid #f5d08a;padding:6px 10px;border-radius:4px;margin:8px 0}
.mono{font-family:ui-monospace,monospace}.elided{color:#e6db74;font-style:italic}
"""

SCRIPT = """
function setAll(open){document.querySelectorAll('details').forEach(function(d){d.open=open;});}
document.getElementById('expand-all').addEventListener('click',function(){setAll(true);});
document.getElementById('collapse-all').addEventListener('click',function(){setAll(false);});
"""


def esc(value: Any) -> str:
    """Redacted (like the run directory), then HTML-escaped."""
    return html.escape(redact_text(str(value)))


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit:,} more characters not embedded: see the run directory)"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def facts(rows: Iterable[tuple[str, Any]]) -> str:
    body = "".join(
        f"<tr><th>{esc(k)}</th><td>{v if isinstance(v, Raw) else esc(v)}</td></tr>"
        for k, v in rows
        if v is not None and v != ""
    )
    return f"<table>{body}</table>"


class Raw(str):
    """HTML already escaped (a fact's value shown as is)."""


def details(summary: str, body: str, *, open_: bool = False, cls: str = "") -> str:
    attrs = (" open" if open_ else "") + (f' class="{cls}"' if cls else "")
    return f"<details{attrs}><summary>{summary}</summary>{body}</details>"


def pre(text: str, limit: int, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f"<pre{c}>{esc(clip(text, limit))}</pre>"


# ---- sections -------------------------------------------------------------------------------------


def header_section(r: RunReport) -> str:
    s, info = r.state, r.info
    cfg = info.config if info else {}
    model_cfg: dict[str, Any] = cfg["model"] if isinstance(cfg.get("model"), dict) else {}
    net = cfg.get("sandbox", {}).get("network") if isinstance(cfg.get("sandbox"), dict) else None
    tok_in, tok_out = s.tokens("tokens_in"), s.tokens("tokens_out")
    tools = ", ".join(f"{k} {v}" for k, v in s.tool_counts.items()) or "none"
    rows: list[tuple[str, Any]] = [
        ("task", s.task_id),
        ("attempt", info.attempt if info else None),
        ("batch", info.batch_id if info else None),
        ("provider", s.provider),
        ("sandbox", s.sandbox_id),
        ("sandbox owned", s.sandbox_owned),
        ("sandbox user", s.sandbox_user),
        ("network", s.sandbox.network if s.sandbox else net),
        ("model", s.started.model if s.started else model_cfg.get("name")),
        ("model url", s.started.model_url if s.started else None),
        ("OpenCode", s.opencode_version),
        ("started", s.start_time.isoformat() if s.start_time else None),
        ("ended", info.ended_at.isoformat() if info and info.ended_at else None),
        (
            "duration",
            fmt.duration(info.duration_s if info and info.duration_s is not None else s.elapsed_s()),
        ),
        ("phase", info.phase if info else (s.phase.phase if s.phase else None)),
        (
            "phase durations",
            ", ".join(f"{k} {v:.1f}s" for k, v in info.phase_durations_s.items()) if info else None,
        ),
        ("model calls", f"{len(s.model_calls):,}"),
        ("tokens in / out", f"{fmt.count(tok_in)} / {fmt.count(tok_out)}"),
        ("tool calls", f"{s.tally.tool_call_count:,} ({tools}); {s.tool_errors} ended in an error"),
        ("compactions", s.compaction_count),
        (
            "human intervened",
            "yes: a person used a shell before verification" if s.human_intervened else None,
        ),
        ("sandbox kept", "yes" if info and info.sandbox_kept else None),
        ("unenforced limits", ", ".join(s.tally.unenforced_limits) or None),
        ("versions", ", ".join(f"{k} {v}" for k, v in info.versions.items()) if info else None),
        ("run directory", str(r.path)),
    ]
    return f'<section id="header">{facts(rows)}</section>'


def outcome_section(r: RunReport) -> str:
    info, s = r.info, r.state
    o = info.outcome if info else None
    if o is None and s.outcome is None:
        still = "interrupted (its controller is gone)" if info and info.orphaned else "no outcome recorded"
        return f'<section id="outcome"><h2>Outcome</h2><p class="warn">{esc(still)}</p></section>'
    action = str(o.action if o else s.outcome.action)  # type: ignore[union-attr]
    rows: list[tuple[str, Any]] = [
        ("action", Raw(f'<span class="badge b-{esc(action)}">{esc(action)}</span>')),
        ("reward", o.reward if o else s.outcome.reward),  # type: ignore[union-attr]
        ("failure kind", Raw(f'<b class="err">{esc(o.failure_kind)}</b>') if o and o.failure_kind else None),
        ("failure stage", o.failure_stage if o else None),
        ("failure class", o.failure_class if o else None),
        ("summary", o.summary if o else s.outcome.summary),  # type: ignore[union-attr]
    ]
    if s.verification is not None:
        v = s.verification
        rows.append(("verifier", f"exit {v.exit_code}, reward {v.reward}, {v.duration_s:.1f}s"))
    body = facts(rows)
    if s.outcome is not None and s.outcome.evidence:
        body += details(
            "Outcome evidence", pre(pretty([e.model_dump(mode="json") for e in s.outcome.evidence]), 20000)
        )
    return f'<section id="outcome"><h2>Outcome</h2>{body}</section>'


def _failure_html(rec: FailureRecorded | FailureRecovered, limit: int) -> str:
    f = rec.failure
    rows: list[tuple[str, Any]] = [("stage", f.stage)]
    if isinstance(rec, FailureRecovered):
        rows.append(("recovered", fmt.recovery_label(rec.recovery)))
        head = f'<b class="warn">{esc(f.kind)}</b> · {esc(f.stage)} · recovered'
    else:
        d = rec.decision
        rows += [
            ("class", d.failure_class),
            ("action", f"warning ({d.action})" if d.warning else d.action),
            ("decided by", describe_decision(d)),
        ]
        head = f'<b class="err">{esc(f.kind)}</b> · {esc(f.stage)} · {esc(d.failure_class)} → {esc(d.action)}'
    rows += [
        ("operation", f.operation),
        ("http status", f.http_status),
        ("occurred at", f.occurred_at.isoformat()),
        ("attempt", rec.attempt),
    ]
    body = facts(rows) + "<h3>Message</h3>" + pre(f.message, limit)
    if f.cause is not None:
        chain = "\n".join(
            f"{'  ' * i}{'caused by ' if i else ''}{c.type}: {c.message}"
            for i, c in enumerate(f.cause.chain())
        )
        body += "<h3>Cause chain</h3>" + pre(chain, limit)
    body += "<h3>Evidence</h3>"
    if not f.evidence:
        body += '<p class="muted">none: the diagnosis rests on no authoritative observation</p>'
    for e in f.evidence:
        body += facts([("source", e.source), ("scope", e.scope), ("observed at", e.observed_at.isoformat())])
        body += pre(pretty(e.data), limit)
    if f.details is not None:
        body += "<h3>Details</h3>" + pre(pretty(f.details.model_dump(mode="json")), limit)
    return details(head, body, open_=True, cls="failure")


def failures_section(r: RunReport) -> str:
    s = r.state
    limit = r.limits.text_chars
    parts: list[str] = []
    for rec in s.problems:
        if isinstance(rec, FailureRecorded | FailureRecovered):
            parts.append(_failure_html(rec, limit))
    if not parts:
        parts.append('<p class="ok">no failure recorded</p>')
    return f'<section id="failures"><h2>Failures ({len(s.failures)})</h2>{"".join(parts)}</section>'


def cleanup_section(r: RunReport) -> str:
    rows = []
    for step in CLEANUP_ORDER:
        seen = r.state.cleanup.get(step)
        st = str(seen.state) if seen else "pending"
        reason = f" — {esc(seen.reason)}" if seen and seen.reason else ""
        data = (
            f'<span class="mono muted">{esc(json.dumps(seen.data, default=str))}</span>'
            if seen and seen.data
            else ""
        )
        rows.append(
            f'<tr><td class="s-{st}">{ICONS.get(st, "?")}</td><th>{esc(CLEANUP_LABELS[str(step)])}</th>'
            f'<td class="s-{st}">{esc(st)}{reason}</td><td>{data}</td></tr>'
        )
    confirmed = r.info.counts.get("cleanup_confirmed") if r.info else None
    note = "" if confirmed is None else f"<p>cleanup confirmed: <b>{esc(confirmed)}</b></p>"
    return f'<section id="cleanup"><h2>Cleanup</h2><table>{"".join(rows)}</table>{note}</section>'


def warnings_section(r: RunReport) -> str:
    s = r.state
    items: list[str] = []
    for rec in s.problems:
        if isinstance(rec, HealthWarning):
            items.append(
                f'<li><b class="warn">{esc(rec.kind.value)}</b> {esc(rec.ts.isoformat())}: {esc(rec.message)}'
                + (f"<pre>{esc(pretty(rec.data))}</pre>" if rec.data else "")
                + "</li>"
            )
        elif isinstance(rec, SandboxFault):
            items.append(
                f'<li><b class="err">{esc(rec.kind.value)}</b> seen {esc(rec.ts.isoformat())} by '
                f"{esc(rec.source)}: {esc(rec.message)}"
                + (f" (command: <span class=mono>{esc(rec.command)}</span>)" if rec.command else "")
                + "</li>"
            )
    for w in s.warnings:
        items.append(f"<li><b>{esc(w.code)}</b>: {esc(w.message)}</li>")
    body = f"<ul>{''.join(items)}</ul>" if items else '<p class="muted">none</p>'
    rows = []
    for i in r.interventions:
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{esc(i.get(k) if i.get(k) is not None else '')}</td>"
                for k in ("ts", "what", "who", "call_id")
            )
            + f"<td>{esc(clip(str(i.get('text') or ''), 2000))}</td></tr>"
        )
    inter = (
        "<table><tr><th>at</th><th>what</th><th>who</th><th>call</th><th>text</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else '<p class="muted">none (no one acted on the agent through the debugger)</p>'
    )
    return (
        f'<section id="warnings"><h2>Health warnings and live faults</h2>{body}'
        f'<h2 id="interventions">Interventions ({len(r.interventions)})</h2>{inter}</section>'
    )


# ---- model calls ---------------------------------------------------------------------------------


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
        f"{esc(fmt.seconds(ev.latency_s))} · tokens {esc(fmt.count(ev.tokens_in))}/{esc(fmt.count(ev.tokens_out))}"
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
        meta = rec.model_dump(mode="json", exclude={"request_body", "response_body"})
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


def terminal_section(r: RunReport) -> str:
    t = r.terminal
    if t is None:
        return '<section id="terminal"><h2>Terminal</h2><p class="muted">no terminal.cast in the run directory</p></section>'
    lines = list(t.head)
    if t.elided:
        lines.append(
            f'<span class="elided">… {t.elided:,} lines not embedded (the full recording is terminal.cast) …</span>'
        )
        lines += t.tail
    info = f"{t.total:,} lines, {fmt.duration(t.duration_s)}" + (f", recorded at {t.size}" if t.size else "")
    return f'<section id="terminal"><h2>Terminal</h2><p class="muted">{esc(info)}</p><pre class="term">{chr(10).join(lines)}</pre></section>'


def files_section(r: RunReport) -> str:
    out = []
    if r.verifier is not None:
        so, se = r.verifier
        out.append(
            details("Verifier stdout / stderr", pre(so, r.limits.text_chars) + pre(se, r.limits.text_chars))
        )
    if r.diagnostics:
        out.append(details("diagnostics.txt", pre(r.diagnostics, 200_000)))
    return f'<section id="files"><h2>Files</h2>{"".join(out)}</section>' if out else ""


def limits_note(r: RunReport) -> str:
    cut = []
    if r.terminal and r.terminal.elided:
        cut.append(
            f"{r.terminal.elided:,} terminal lines (first {len(r.terminal.head):,} and last {len(r.terminal.tail):,} kept)"
        )
    undetailed = r.calls_total - len(r.detailed)
    if undetailed > 0:
        cut.append(
            f"the bodies of {undetailed:,} of {r.calls_total:,} model calls (failed, first and last ones kept)"
        )
    if r.tool_calls_total > len(r.tool_calls):
        cut.append(f"{r.tool_calls_total - len(r.tool_calls):,} tool calls")
    base = (
        f"Texts over {r.limits.text_chars:,} characters and conversations over {r.limits.messages_per_call} "
        "messages are cut where they occur."
    )
    if not cut:
        return f'<p class="muted">Everything in the run directory is embedded. {esc(base)}</p>'
    return f'<p class="note">Left out to keep the page light: {esc("; ".join(cut))}. {esc(base)} The run directory holds all of it.</p>'


def run_body(r: RunReport, anchor: str = "") -> str:
    """A run's sections (the page's body; in a batch report one of its per-run sections)."""
    sections = [
        header_section(r),
        limits_note(r),
        outcome_section(r),
        failures_section(r),
        cleanup_section(r),
        warnings_section(r),
        calls_section(r),
        tools_section(r),
        terminal_section(r),
        files_section(r),
    ]
    body = "".join(sections)
    if anchor:  # ids unique per run inside a batch page
        body = body.replace(' id="', f' id="{anchor}-')
    return body


NAV = [
    ("outcome", "Outcome"),
    ("failures", "Failures"),
    ("cleanup", "Cleanup"),
    ("warnings", "Warnings"),
    ("interventions", "Interventions"),
    ("model-calls", "Model calls"),
    ("tool-calls", "Tool calls"),
    ("terminal", "Terminal"),
]


def page(title: str, body: str, nav: list[tuple[str, str]] | None = None) -> str:
    links = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in (nav or []))
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        # no network: nothing may be fetched, whatever the page holds
        "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body><main>"
        f'<nav>{links}<button id="collapse-all">collapse all</button><button id="expand-all">expand all</button></nav>'
        f"<h1>{esc(title)}</h1>"
        f'<p class="muted">opencode-tui {esc(__version__)} report, made {esc(made)}; secrets redacted as in the run directory.</p>'
        f"{body}</main><script>{SCRIPT}</script></body></html>\n"
    )


def run_page(r: RunReport) -> str:
    return page(f"Run {r.run_id}", run_body(r), NAV)
