"""What a run's report shows, gathered from its run directory through ``opencode_tui_core.artifacts.RunDirReader``.

The panels' own fold (``opencode_tui.state.RunState``, with ``opencode_tui_core.tally``) gives the header facts, the
failures, the cleanup steps and the counts, so the report says what the TUI says. Everything embedded is
capped (``Limits``): a run of a million events or thousands of model calls still gives a page a browser
opens at once, and the page names what it left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencode_tui.report.terminal import HEAD_LINES, TAIL_LINES, TerminalLines, render_cast
from opencode_tui.state import RunState
from opencode_tui_core import __version__
from opencode_tui_core.artifacts import RunDirReader, RunInfo
from opencode_tui_core.calls.records import ModelCallRecord
from opencode_tui_core.events import ModelCall, ToolCall

# Event types the report does not fold (most of a long run's lines): skipped before decoding.
SKIPPED_EVENTS = ("terminal", "opencode")


class ReportInputError(Exception):
    """The input cannot be reported on (not a run directory, a newer format): one line for the user."""


@dataclass(frozen=True)
class Limits:
    """How much of a run the page embeds."""

    detailed_calls: int = 60  # model calls with their conversation and response (the rest: a row)
    call_rows: int = 5000
    messages_per_call: int = 24  # the last messages of each request's conversation
    text_chars: int = 20_000  # any one text (a message, a system prompt, a tool output)
    tool_calls: int = 2000
    terminal_head: int = HEAD_LINES
    terminal_tail: int = TAIL_LINES


BATCH_LIMITS = Limits(detailed_calls=8, call_rows=400, tool_calls=200, terminal_head=50, terminal_tail=300)


@dataclass
class CallDetail:
    """One model call's event with its record (None when model_calls.jsonl has none for it)."""

    event: ModelCall
    record: ModelCallRecord | None = None


@dataclass
class RunReport:
    path: Path
    info: RunInfo | None
    state: RunState
    interventions: list[dict[str, Any]] = field(default_factory=list)
    calls: list[CallDetail] = field(default_factory=list)
    calls_total: int = 0
    detailed: set[str] = field(default_factory=set)  # call ids shown in full
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_calls_total: int = 0
    terminal: TerminalLines | None = None
    diagnostics: str | None = None
    verifier: tuple[str, str] | None = None
    limits: Limits = field(default_factory=Limits)

    @property
    def run_id(self) -> str:
        return self.info.run_id if self.info else self.path.name


def _newer(version: str) -> bool:
    def parts(v: str) -> tuple[int, ...]:
        out = []
        for p in v.split("."):
            digits = "".join(c for c in p if c.isdigit())
            out.append(int(digits or 0))
        return tuple(out)

    return parts(version) > parts(__version__)


def read_info(reader: RunDirReader) -> tuple[RunInfo | None, dict[str, Any]]:
    """run.json validated and as plain data; a record of a newer format is refused in one line."""
    try:
        info = reader.info()
    except ValueError as exc:
        try:
            data = reader.info_data()
        except (OSError, ValueError):
            data = {}
        written_by = str((data.get("versions") or {}).get("opencode_tui") or "")
        if written_by and _newer(written_by):
            raise ReportInputError(
                f"{reader.path} was written by opencode-tui {written_by}, newer than this {__version__}: "
                "report it with that version (or upgrade)"
            ) from exc
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReportInputError(
            f"{reader.path}/run.json is not a run record this version reads ({first}); "
            "report it with the opencode-tui that wrote it"
        ) from exc
    data = reader.info_data() if info is not None else {}
    return info, data


def collect(path: Path, limits: Limits | None = None) -> RunReport:
    """Everything the page shows. Raises ``ReportInputError`` for input that cannot be reported."""
    limits = limits or Limits()
    try:
        reader = RunDirReader(path)
    except FileNotFoundError as exc:
        raise ReportInputError(str(exc)) from exc
    info, data = read_info(reader)
    state = RunState(info=info)
    tools: dict[str, ToolCall] = {}
    left_out: set[str] = set()
    for ev in reader.events(skip=SKIPPED_EVENTS, strict=False):
        state.apply(ev)
        if isinstance(ev, ToolCall) and ev.call_id not in left_out:
            if ev.call_id not in tools and len(tools) >= limits.tool_calls:
                left_out.add(ev.call_id)
                continue
            tools[ev.call_id] = ev  # the last state of the call (running → completed/error)
    tool_total = len(tools) + len(left_out)
    report = RunReport(path=path, info=info, state=state, limits=limits)
    raw_interventions = data.get("interventions")
    if isinstance(raw_interventions, list):
        report.interventions = [i for i in raw_interventions if isinstance(i, dict)]
    report.tool_calls = list(tools.values())
    report.tool_calls_total = tool_total
    _collect_calls(reader, report, limits)
    cast = reader.cast()
    if cast is not None:
        report.terminal = render_cast(cast, limits.terminal_head, limits.terminal_tail)
    report.diagnostics = reader.diagnostics()
    report.verifier = reader.verifier_output()
    return report


def _collect_calls(reader: RunDirReader, report: RunReport, limits: Limits) -> None:
    events = report.state.model_calls
    report.calls_total = len(events)
    rows = events[: limits.call_rows]
    # In full: every failed call first (they explain failures), then the first and the last calls.
    failed = [c.call_id for c in rows if c.failed]
    wanted: list[str] = failed[: limits.detailed_calls]
    room = limits.detailed_calls - len(wanted)
    if room > 0:
        others = [c.call_id for c in rows if c.call_id not in set(wanted)]
        head = room // 3
        picked = others if len(others) <= room else others[:head] + others[len(others) - (room - head) :]
        wanted += picked
    report.detailed = set(wanted)
    records: dict[str, ModelCallRecord] = {}
    if report.detailed:
        for record in reader.model_calls():
            if record.call_id in report.detailed:
                records[record.call_id] = record
    report.calls = [CallDetail(c, records.get(c.call_id)) for c in rows]
