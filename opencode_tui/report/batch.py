"""A batch's report: its failures grouped, a row per attempt, and each attempt's own section."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from core.artifacts import list_runs
from core.events import FailureRecorded
from core.failure_groups import evidence_signature
from opencode_tui import format as fmt
from opencode_tui.report.collect import BATCH_LIMITS, ReportInputError, RunReport, collect
from opencode_tui.report.html import esc, page
from opencode_tui.report.page import run_body


def signature(rec: FailureRecorded) -> str:
    """The evidence signature the batch screen, ``runs --batch`` and the stderr summary group by
    (core.failure_groups), or that no evidence was recorded."""
    return evidence_signature(rec.failure.evidence) or "no evidence"


def batch_runs(runs_dir: Path, batch_id: str) -> list[Path]:
    if not runs_dir.is_dir():
        raise ReportInputError(f"{runs_dir} is not a directory (pass the runs directory the batch wrote to)")
    found = [path for path, info in list_runs(runs_dir) if info is not None and info.batch_id == batch_id]
    if not found:
        raise ReportInputError(
            f"no run of batch {batch_id!r} in {runs_dir} (the batch id is on every result line of run --batch)"
        )
    return found


def batch_page(runs_dir: Path, batch_id: str) -> str:
    reports: list[RunReport] = [collect(p, BATCH_LIMITS) for p in batch_runs(runs_dir, batch_id)]
    reports.sort(key=lambda r: (r.state.task_id or "", r.info.attempt if r.info else 0, r.run_id))
    groups: Counter[tuple[str, str, str]] = Counter()
    runs_of: dict[tuple[str, str, str], list[str]] = {}
    for r in reports:
        for rec in r.state.failures:
            if isinstance(rec, FailureRecorded) and not rec.decision.warning:
                key = (rec.failure.kind, str(rec.failure.stage), signature(rec))
                groups[key] += 1
                runs_of.setdefault(key, []).append(r.run_id)
    actions = Counter(
        str(r.info.outcome.action) if r.info and r.info.outcome else "no outcome" for r in reports
    )
    summary = ", ".join(f"{n} {a}" for a, n in actions.most_common())
    grouped = "".join(
        f"<tr><td>{n}</td><td><b class=err>{esc(k)}</b></td><td>{esc(s)}</td><td>{esc(sig)}</td>"
        f"<td>{' '.join(f'<a href=#run-{i}>{esc(rid)}</a>' for i, rid in _indexed(reports, runs_of[(k, s, sig)]))}</td></tr>"
        for (k, s, sig), n in groups.most_common()
    )
    grouped_html = (
        "<table><tr><th>count</th><th>kind</th><th>stage</th><th>evidence</th><th>runs</th></tr>"
        + grouped
        + "</table>"
        if grouped
        else '<p class="ok">no failure recorded</p>'
    )
    rows = []
    for i, r in enumerate(reports):
        o = r.info.outcome if r.info else None
        rows.append(
            f"<tr><td><a href=#run-{i}>{esc(r.run_id)}</a></td><td>{esc(r.state.task_id or '')}</td>"
            f"<td>{esc(r.info.attempt if r.info else '')}</td>"
            f"<td><span class='badge b-{esc(o.action) if o else ''}'>{esc(o.action if o else 'no outcome')}</span></td>"
            f"<td>{esc(o.reward if o and o.reward is not None else fmt.DASH)}</td>"
            f"<td>{esc(o.failure_kind or '') if o else ''}</td>"
            f"<td>{esc(fmt.duration(r.info.duration_s if r.info else None))}</td></tr>"
        )
    attempts = (
        "<table><tr><th>run</th><th>task</th><th>attempt</th><th>outcome</th><th>reward</th>"
        "<th>failure</th><th>duration</th></tr>" + "".join(rows) + "</table>"
    )
    runs = "".join(
        f'<section id="run-{i}" class="run"><h2>Run {esc(r.run_id)}</h2>{run_body(r, anchor=f"run-{i}")}</section>'
        for i, r in enumerate(reports)
    )
    body = (
        f"<p>{len(reports)} attempts in {esc(runs_dir)}: {esc(summary)}</p>"
        f'<section id="groups"><h2>Failures grouped (kind × stage × evidence)</h2>{grouped_html}</section>'
        f'<section id="attempts"><h2>Attempts</h2>{attempts}</section>{runs}'
    )
    return page(f"Batch {batch_id}", body, [("groups", "Failures grouped"), ("attempts", "Attempts")])


def _indexed(reports: list[RunReport], run_ids: list[str]) -> list[tuple[int, str]]:
    index = {r.run_id: i for i, r in enumerate(reports)}
    return [(index[rid], rid) for rid in dict.fromkeys(run_ids)]
