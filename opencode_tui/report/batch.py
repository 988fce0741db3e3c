"""A batch's report: its failures grouped, a row per attempt, and each attempt's own section."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from opencode_tui import format as fmt
from opencode_tui.report.collect import BATCH_LIMITS, ReportInputError, RunReport, collect
from opencode_tui.report.html import esc, page
from opencode_tui.report.page import run_body
from opencode_tui_core.artifacts import list_runs
from opencode_tui_core.failure_groups import Decided, FailureGroup, RecordedAttempt, group_failures
from opencode_tui_core.resume import load_batch


def batch_groups(runs_dir: Path, batch_id: str, reports: list[RunReport]) -> list[FailureGroup]:
    """The batch's failures grouped as the batch screen, ``runs --batch`` and the stderr summary group
    them (opencode_tui_core.failure_groups): each task once, by the deciding failure of its last attempt. The result
    lines (results.jsonl) come after the run directories' records, so a task's line decides where there
    is one (a task the cancel never started has only its line; one still running when its controller
    died, only its run directory)."""
    attempts: list[Decided] = [RecordedAttempt.of(r.info, r.state.outcome) for r in reports if r.info]
    return group_failures([*attempts, *load_batch(runs_dir, batch_id)])


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
    reports.sort(key=lambda r: (_task(r), r.info.attempt if r.info else 0, r.run_id))
    groups = batch_groups(runs_dir, batch_id, reports)
    actions = Counter(
        str(r.info.outcome.action) if r.info and r.info.outcome else "no outcome" for r in reports
    )
    summary = ", ".join(f"{n} {a}" for a, n in actions.most_common())
    grouped = "".join(
        f"<tr><td>{g.count}</td><td><b class=err>{esc(g.kind)}</b></td><td>{esc(g.stage or '')}</td>"
        f"<td>{esc(g.signature or 'no evidence')}</td><td>{_links(reports, g)}</td></tr>"
        for g in groups
    )
    grouped_html = (
        "<table><tr><th>tasks</th><th>kind</th><th>stage</th><th>evidence</th><th>deciding attempts</th></tr>"
        + grouped
        + "</table>"
        if grouped
        else '<p class="ok">no failure recorded</p>'
    )
    rows = []
    for i, r in enumerate(reports):
        o = r.info.outcome if r.info else None
        rows.append(
            f"<tr><td><a href=#run-{i}>{esc(r.run_id)}</a></td><td>{esc(_task(r))}</td>"
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


def _task(r: RunReport) -> str:
    """run.json's task id (what the groups read), else the events'."""
    return r.info.task_id if r.info else r.state.task_id or ""


def _links(reports: list[RunReport], group: FailureGroup) -> str:
    """Each task's deciding attempt, linked to its section (a task never started, or whose run
    directory is gone, by name)."""
    index = {r.run_id: i for i, r in enumerate(reports)}
    return " ".join(
        f"<a href=#run-{index[rid]}>{esc(rid)}</a>"
        if rid in index
        else esc(f"{task} (not started)" if not rid else rid)
        for task, rid in zip(group.task_ids, group.run_ids, strict=True)
    )
