"""What ``runs`` and ``diff`` print when they are not on a terminal (a pipe, a file, a script): the
runs browser's table and the diff screen's content as plain text lines, no escape codes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from opencode_tui_core.diff import RunDiff, Step

DASH = "–"
RUNS_HEADER: tuple[str, ...] = ("run", "task", "outcome", "reward", "failure kind", "duration")
RUNS_HEADER += ("started (UTC)", "cleanup", "human", "provider", "health", "batch", "kept")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _cleanup(row: dict[str, Any]) -> str:
    confirmed = row.get("cleanup_confirmed")
    return DASH if confirmed is None else ("confirmed" if confirmed else "UNCONFIRMED")


def _human(row: dict[str, Any]) -> str:
    """``yes`` when a person acted; with the debugger's interventions counted (issue 27)."""
    n = row.get("interventions") or 0
    if not row.get("human_intervened"):
        return f"no ({n} debugger)" if n else ""  # breaks and continues alone change nothing
    return f"yes ({n} debugger)" if n else "yes"


def run_cells(row: dict[str, Any]) -> list[str]:
    """One run (``feeds.run_summary``'s dict) as the table's cells."""
    if not row.get("readable", True):
        return [row["run_id"], "run.json unreadable", *[""] * (len(RUNS_HEADER) - 2)]
    reward = row.get("reward")
    started = datetime.fromisoformat(row["started_at"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return [
        row["run_id"],
        row.get("task_id") or DASH,
        row.get("outcome") or "running/unknown",
        DASH if reward is None else f"{reward:g}",
        row.get("failure_kind") or DASH,
        _duration(row.get("duration_s")),
        started,
        _cleanup(row),
        _human(row),
        row.get("provider") or "",
        _health(row.get("health")),
        row.get("batch_id") or "",
        "kept" if row.get("sandbox_kept") else "",
    ]


def _health(health: object) -> str:
    n = sum(v for v in health.values() if isinstance(v, int)) if isinstance(health, dict) else 0
    return f"{n} warning{'s' if n != 1 else ''}" if n else ""


def table(header: Iterable[str], rows: Iterable[list[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart."""
    cells = [list(header), *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def runs_table(summaries: Iterable[dict[str, Any]]) -> list[str]:
    return table(RUNS_HEADER, (run_cells(s) for s in summaries))


def _value(v: object) -> str:
    if v is None:
        return DASH
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _step(step: Step | None) -> str:
    if step is None:
        return DASH
    took = "" if step.duration_s is None else f" ({step.duration_s:.2f}s)"
    return step.label() + took


OUTPUT_WIDTH = 60  # each side of the tool outputs
OUTPUT_LINES = 40  # of each side's output, at most (the rest is counted)


def output_cells(step: Step | None, width: int, limit: int) -> list[str]:
    """A step's side of the outputs: what the tool printed, folded to ``width``, at most ``limit`` lines."""
    if step is None:
        return ["(no step here)"]
    if step.kind != "tool_call":
        return [f"(model call {step.call_id})"]
    head = [f"exit {step.exit_code}" if step.exit_code is not None else f"({step.status})"]
    text = (step.output or "").expandtabs(4)
    lines = [
        line[i : i + width] or "" for line in text.splitlines() for i in range(0, max(len(line), 1), width)
    ]
    if not text:
        lines = ["(no output recorded)"]
    if len(lines) > limit:
        lines = [*lines[:limit], f"… {len(lines) - limit} more lines"]
    return head + lines


def side_by_side(a: list[str], b: list[str], width: int = OUTPUT_WIDTH) -> list[str]:
    """Two columns of lines, ``│`` between them."""
    n = max(len(a), len(b))
    return [
        f"{(a[i] if i < len(a) else '').ljust(width)} │ {b[i] if i < len(b) else ''}".rstrip()
        for i in range(n)
    ]


def output_lines(diff: RunDiff, width: int = OUTPUT_WIDTH, limit: int = OUTPUT_LINES) -> list[str]:
    """Each aligned step with a tool call on either side: both runs' tool outputs side by side."""
    out: list[str] = []
    for i, s in enumerate(diff.steps):
        if not any(x is not None and x.kind == "tool_call" for x in (s.a, s.b)):
            continue
        mark = ">" if i == diff.first_divergence else (" " if s.same else "!")
        same = "same step" if s.same else "differs"
        out.append(f"{mark}{i + 1} ({same})")
        out += side_by_side(
            [f"A: {_step(s.a)}"[:width], *output_cells(s.a, width, limit)],
            [f"B: {_step(s.b)}"[:width], *output_cells(s.b, width, limit)],
            width,
        )
        out.append("")
    return out


def diff_lines(diff: RunDiff) -> list[str]:
    """The comparison as the diff screen shows it: drift, then the aligned steps (``!`` marks a step
    that differs, ``>`` the first divergence, ``=`` after the number one B replayed from A's record
    when B is A's rerun or fork), the tool outputs side by side at each step, then the
    deltas."""
    out = [f"A: {diff.a.run_dir} ({diff.a.task_id or DASH}, {diff.a.steps} steps)"]
    out.append(f"B: {diff.b.run_dir} ({diff.b.task_id or DASH}, {diff.b.steps} steps)")
    lineage = diff.lineage_words()
    if lineage is not None:
        out.append(lineage + " (= marks them)")
    out.append("")
    if diff.drift:
        out.append("Drift (settings that differed before the episode began):")
        out += table(
            ("area", "key", "A", "B"), ([d.area, d.key, _value(d.a), _value(d.b)] for d in diff.drift)
        )
    else:
        out.append("Drift: none (same task, config and versions)")
    out.append("")
    if diff.first_divergence is None:
        out.append(f"Steps: the same ({len(diff.steps)})")
    else:
        out.append(f"Steps: first divergence at step {diff.first_divergence + 1} of {len(diff.steps)}")
    rows = []
    for i, s in enumerate(diff.steps):
        mark = ">" if i == diff.first_divergence else (" " if s.same else "!")
        rows.append([f"{mark}{i + 1}{'=' if s.replayed else ''}", _step(s.a), _step(s.b)])
    out += table(("#", "A", "B"), rows)
    out.append("")
    outputs = output_lines(diff)
    if outputs:
        out.append("Tool outputs (A │ B) at each step:")
        out += outputs
    out.append("Deltas (B - A):")
    changed = [d for d in diff.deltas if d.changed]
    if not changed:
        out.append("none")
    for d in changed:
        change = ""
        if d.delta is not None and d.delta != 0:
            change = f" ({d.delta:+.3g})" if isinstance(d.delta, float) else f" ({d.delta:+,})"
        out.append(f"{d.key}: {_value(d.a)} → {_value(d.b)}{change}")
    return out
