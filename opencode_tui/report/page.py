"""A run's report: its sections, in the order a person debugging the run reads them."""

from __future__ import annotations

import json
from typing import Any

from opencode_tui import format as fmt
from opencode_tui.report.calls import calls_section, tools_section
from opencode_tui.report.collect import RunReport
from opencode_tui.report.html import Raw, clip, details, esc, facts, page, pre, pretty
from opencode_tui.state import CLEANUP_ORDER
from opencode_tui_core.events import FailureRecorded, FailureRecovered, HealthWarning, SandboxFault
from opencode_tui_core.failures import describe_decision


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
            f'<tr><td class="s-{st}">{fmt.STEP_ICONS.get(st, "?")}</td><th>{esc(fmt.CLEANUP_LABELS[step])}</th>'
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


def run_page(r: RunReport) -> str:
    return page(f"Run {r.run_id}", run_body(r), NAV)
