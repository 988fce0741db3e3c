"""The difference between two runs (``opencode-tui diff RUN_A RUN_B``): pure functions of two run
directories, no Textual.

Drift first (what differed before the agent took a step: the task, the configuration, the versions),
then the two episodes' steps aligned (model calls and tool calls in the order they happened), the first
step where they part, and the deltas of outcome, tokens and durations.

Steps are ordered by what caused them: model calls by their request's start, each followed by the tool
calls its answer asked for (same ``message_id``). Neither the event order nor the tool events' times
will do: the proxy records a call when it ends, and OpenCode's events reach the engine later than the
next request (a write's event was seen after the following call had begun). A tool call whose model
call is unknown goes by the time of its first event. Title calls run beside the agent at no fixed point and are left out of the steps
(their tokens are still in the totals).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.artifacts import RunDirReader, RunFiles, RunInfo
from opencode_tui_core.events import (
    EpisodeStarted,
    Event,
    HealthWarning,
    ModelCall,
    OutcomeDecided,
    ToolCall,
)
from opencode_tui_core.tally import ROOT_SESSION_EVENT, Tally

# What the agent was given, as recorded in the run directory: compared when both runs have the file.
TASK_FILES = (RunFiles.TASK_YAML, RunFiles.PROMPT, RunFiles.INSTRUCTIONS)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Step(_Model):
    """One model call or tool call of an episode, as the diff compares it."""

    kind: Literal["model_call", "tool_call"]
    name: str
    message_id: str | None = None  # the tool, or the model call's kind (agent, compaction, other)
    call_id: str
    started_at: datetime
    seq: int
    status: str  # HTTP status / "error" for a model call; running, completed, error for a tool call
    args: dict[str, Any] = Field(default_factory=dict)  # a tool call's input
    title: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    duration_s: float | None = None
    output: str | None = None  # a tool call's output as last reported (OpenCode's, capped by the engine)
    exit_code: int | None = None  # a bash call's exit status (None: not reported)
    asked_by: str | None = None  # a tool call's model call (its call id): the answer that asked for it
    session_id: str | None = None  # a model call's OpenCode session
    subagent: bool = False  # a model call made in a subagent's session, not the episode's own

    @property
    def key(self) -> str:
        """What must be equal for two steps to be the same step."""
        if self.kind == "model_call":
            return f"model {self.name} {self.status}"
        return f"tool {self.name} {json.dumps(self.args, sort_keys=True, default=str)}"

    def label(self) -> str:
        if self.kind == "model_call":
            tokens = "" if self.tokens_in is None else f" {self.tokens_in}→{self.tokens_out}"
            who = " (subagent)" if self.subagent else ""
            return f"model {self.name}{who} [{self.status}]{tokens}"
        return f"{self.name} {short_args(self.args)}"


def short_args(args: dict[str, Any], width: int = 80) -> str:
    """A tool call's arguments on one line: the command or path first (what a reader looks for)."""
    for key in ("command", "filePath", "pattern", "path", "url"):
        if isinstance(args.get(key), str):
            text = args[key]
            break
    else:
        text = json.dumps(args, sort_keys=True, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def episode_steps(events: Iterable[Event]) -> list[Step]:
    """Model calls (not title calls) and tool calls in the order they began; each tool call names the
    model call that asked for it (``asked_by``) and each model call says whether a subagent made it."""
    steps: dict[str, Step] = {}
    tally = Tally()  # for the episode's own session (``Tally.subagent_call``)
    for ev in events:
        tally.count(ev)
        if isinstance(ev, ModelCall):
            if ev.kind == "title":
                continue
            status = str(ev.status) if ev.status is not None else "error"
            steps["m:" + ev.call_id] = Step(
                kind="model_call",
                name=ev.kind,
                call_id=ev.call_id,
                started_at=ev.started_at,
                seq=ev.seq,
                status=status,
                tokens_in=ev.tokens_in,
                tokens_out=ev.tokens_out,
                duration_s=ev.latency_s,
                message_id=ev.message_id,
                session_id=ev.session_id,
            )
        elif isinstance(ev, ToolCall):
            key = "t:" + ev.call_id
            prior = steps.get(key)
            if prior is None:
                steps[key] = Step(
                    kind="tool_call",
                    name=ev.tool,
                    call_id=ev.call_id,
                    started_at=ev.ts,
                    seq=ev.seq,
                    status=ev.status,
                    args=ev.input,
                    title=ev.title,
                    message_id=ev.message_id,
                    output=ev.output,
                    exit_code=ev.exit_code,
                )
            else:
                steps[key] = prior.model_copy(
                    update={
                        "status": ev.status,
                        "args": ev.input or prior.args,
                        "title": ev.title or prior.title,
                        # OpenCode's own measure when it gave one, else between the events
                        "duration_s": ev.duration_s
                        if ev.duration_s is not None
                        else (ev.ts - prior.started_at).total_seconds(),
                        "output": ev.output if ev.output is not None else prior.output,
                        "exit_code": ev.exit_code if ev.exit_code is not None else prior.exit_code,
                    }
                )
    for key, step in steps.items():
        if step.kind == "model_call" and step.session_id is not None:
            steps[key] = step.model_copy(update={"subagent": tally.subagent_session(step.session_id)})
    calls = sorted((s for s in steps.values() if s.kind == "model_call"), key=lambda s: (s.started_at, s.seq))
    by_message: dict[str, datetime] = {c.message_id: c.started_at for c in calls if c.message_id}
    asker: dict[str, str] = {c.message_id: c.call_id for c in calls if c.message_id}
    tools = [
        s.model_copy(update={"asked_by": asker.get(s.message_id or "")})
        for s in steps.values()
        if s.kind == "tool_call"
    ]
    # A tool call sorts right after its model call (rank 1 within the same instant), in stream order.
    keyed = [((c.started_at, 0, c.seq), c) for c in calls]
    keyed += [
        ((by_message[t.message_id], 1, t.seq) if t.message_id in by_message else (t.started_at, 1, t.seq), t)
        for t in tools
    ]
    return [s for _, s in sorted(keyed, key=lambda item: item[0])]


class Drift(_Model):
    """One setting that differed between the runs before the episode began."""

    area: Literal["task", "config", "version"]
    key: str
    a: Any = None
    b: Any = None


class AlignedStep(_Model):
    a: Step | None = None
    b: Step | None = None
    same: bool
    replayed: bool = False  # B is A's rerun or fork and this step's model answer came from A's record


class Lineage(_Model):
    """B is a rerun or fork of A (issue 28): how many of its agent model calls A's record answered."""

    kind: Literal["rerun", "fork"]
    fork_step: int | None = None
    replayed_agent_calls: int  # B's first N agent model calls were answered from A's record
    replayed_rows: int  # the aligned rows (from the first) whose B step was replayed
    divergence_step: int | None = None  # the agent call at which B's request differed from A's


class Delta(_Model):
    key: str
    a: Any = None
    b: Any = None
    delta: float | None = None  # b - a, for numbers both runs know

    @property
    def changed(self) -> bool:
        return self.a != self.b


class RunSide(_Model):
    run_dir: str
    run_id: str
    task_id: str | None
    steps: int


class RunDiff(_Model):
    a: RunSide
    b: RunSide
    drift: list[Drift]
    steps: list[AlignedStep]
    first_divergence: int | None  # index into ``steps``; None: the steps are the same
    deltas: list[Delta]
    lineage: Lineage | None = None  # B is a rerun or fork of A

    def lineage_words(self) -> str | None:
        """One line: what B is of A and which steps were replayed from A's record (None: unrelated)."""
        ln = self.lineage
        if ln is None:
            return None
        what = f"B is a fork of A at step {ln.fork_step}" if ln.kind == "fork" else "B is a rerun of A"
        n = ln.replayed_rows
        rows = "no step" if n == 0 else ("step 1" if n == 1 else f"steps 1-{n}")
        live = f", live from step {n + 1}" if ln.kind == "fork" and n < len(self.steps) else ""
        diverged = f"; diverged at agent call {ln.divergence_step}" if ln.divergence_step else ""
        return (
            f"{what}: {rows} replayed from A's record ({ln.replayed_agent_calls} agent model "
            f"call(s)){live}{diverged}"
        )

    @property
    def identical_steps(self) -> bool:
        return self.first_divergence is None


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: value}


def _drift(a: _Run, b: _Run) -> list[Drift]:
    out: list[Drift] = []
    ia, ib = a.info, b.info
    for key, va, vb in (
        ("task_id", a.task_id, b.task_id),
        ("task_dir", ia.task_dir if ia else None, ib.task_dir if ib else None),
    ):
        if va != vb:
            out.append(Drift(area="task", key=key, a=va, b=vb))
    for name in TASK_FILES:
        ta, tb = a.reader.text(name), b.reader.text(name)
        if ta is not None and tb is not None and ta != tb:
            out.append(Drift(area="task", key=name, a=_first_difference(ta, tb), b=_first_difference(tb, ta)))
    ca = _flatten(ia.config if ia else {})
    cb = _flatten(ib.config if ib else {})
    for key in sorted(set(ca) | set(cb)):
        if ca.get(key) != cb.get(key):
            out.append(Drift(area="config", key=key, a=ca.get(key), b=cb.get(key)))
    va_ = dict(ia.versions) if ia else {}
    vb_ = dict(ib.versions) if ib else {}
    if a.started is not None:
        va_.setdefault("opencode", a.started.opencode_version)
    if b.started is not None:
        vb_.setdefault("opencode", b.started.opencode_version)
    for key in sorted(set(va_) | set(vb_)):
        if va_.get(key) != vb_.get(key):
            out.append(Drift(area="version", key=key, a=va_.get(key), b=vb_.get(key)))
    # OpenCode's version leads: it changes behaviour most; then the task, then the config.
    order = {"version": 0, "task": 1, "config": 2}
    out.sort(key=lambda d: (order[d.area], d.key != "opencode"))
    return out


def _first_difference(text: str, other: str) -> str:
    """The first line of ``text`` that ``other`` does not have at the same place (for the drift row)."""
    for i, (x, y) in enumerate(zip(text.splitlines(), other.splitlines(), strict=False)):
        if x != y:
            return f"line {i + 1}: {x}"
    return f"{len(text.splitlines())} lines"


def align(a: list[Step], b: list[Step]) -> tuple[list[AlignedStep], int | None]:
    """The two step lists aligned (same steps side by side, extra steps against a gap); the index of
    the first row that is not the same step, or None."""
    matcher = difflib.SequenceMatcher(a=[s.key for s in a], b=[s.key for s in b], autojunk=False)
    rows: list[AlignedStep] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            rows += [AlignedStep(a=a[i1 + k], b=b[j1 + k], same=True) for k in range(i2 - i1)]
            continue
        # replace / delete / insert: pair what is there by order, the longer side against gaps
        n = max(i2 - i1, j2 - j1)
        for k in range(n):
            sa = a[i1 + k] if i1 + k < i2 else None
            sb = b[j1 + k] if j1 + k < j2 else None
            rows.append(AlignedStep(a=sa, b=sb, same=False))
    first = next((i for i, r in enumerate(rows) if not r.same), None)
    return rows, first


def _delta(key: str, a: Any, b: Any) -> Delta:
    numeric = isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool)
    return Delta(key=key, a=a, b=b, delta=(b - a) if numeric else None)


def _deltas(a: _Run, b: _Run) -> list[Delta]:
    out = [
        _delta("outcome", a.outcome_action, b.outcome_action),
        _delta("failure_kind", a.failure_kind, b.failure_kind),
        _delta("reward", a.reward, b.reward),
        _delta("duration_s", a.duration_s, b.duration_s),
    ]
    ta, tb = a.tally, b.tally
    out += [
        _delta("tokens_in", ta.tokens.tokens_in, tb.tokens.tokens_in),
        _delta("tokens_out", ta.tokens.tokens_out, tb.tokens.tokens_out),
        _delta("agent_tokens_in", ta.agent_tokens_in, tb.agent_tokens_in),
        _delta("agent_tokens_out", ta.agent_tokens_out, tb.agent_tokens_out),
        _delta("model_calls", len(ta.model_calls), len(tb.model_calls)),
        _delta("tool_calls", ta.tool_call_count, tb.tool_call_count),
        _delta("compactions", ta.compactions, tb.compactions),
    ]
    pa = a.info.phase_durations_s if a.info else {}
    pb = b.info.phase_durations_s if b.info else {}
    for phase in list(dict.fromkeys([*pa, *pb])):
        out.append(_delta(f"phase.{phase}_s", pa.get(phase), pb.get(phase)))
    for kind in sorted(set(a.health) | set(b.health)):
        out.append(_delta(f"health.{kind}", a.health.get(kind, 0), b.health.get(kind, 0)))
    return out


# Terminal output and OpenCode's raw events are most of a long run and nothing the diff compares: their
# lines are skipped before decoding.
_SKIPPED_TYPES = ("terminal", "opencode")


class _Run:
    """What the diff needs from one run directory, read once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.reader = RunDirReader(self.path)
        self.info: RunInfo | None = self.reader.info()
        self.events: list[Event] = list(self.reader.events(skip=_SKIPPED_TYPES, strict=False))
        self.started = next((e for e in self.events if isinstance(e, EpisodeStarted)), None)
        self.outcome = next((e for e in reversed(self.events) if isinstance(e, OutcomeDecided)), None)
        self.tally = Tally()
        for e in self.events:
            self.tally.count(e)
        self.health: dict[str, int] = {}
        for e in self.events:
            if isinstance(e, HealthWarning):
                self.health[e.kind.value] = self.health.get(e.kind.value, 0) + 1
        # the episode's own session (its model calls vs. a subagent's): one line among OpenCode's events
        sessions = self.reader.opencode_events(ROOT_SESSION_EVENT)[:1]
        for e in sessions:
            self.tally.count(e)
        self.steps = episode_steps([*sessions, *self.events])

    @property
    def run_id(self) -> str:
        return self.info.run_id if self.info else (self.started.run_id if self.started else self.path.name)

    @property
    def task_id(self) -> str | None:
        return self.info.task_id if self.info else (self.started.task_id if self.started else None)

    @property
    def outcome_action(self) -> str | None:
        if self.outcome is not None:
            return self.outcome.action.value
        return self.info.outcome.action.value if self.info and self.info.outcome else None

    @property
    def failure_kind(self) -> str | None:
        if self.outcome is not None:
            return self.outcome.failure_kind
        return self.info.outcome.failure_kind if self.info and self.info.outcome else None

    @property
    def reward(self) -> float | None:
        if self.outcome is not None:
            return self.outcome.reward
        return self.info.outcome.reward if self.info and self.info.outcome else None

    @property
    def duration_s(self) -> float | None:
        return self.info.duration_s if self.info else None

    def side(self) -> RunSide:
        return RunSide(
            run_dir=str(self.path), run_id=self.run_id, task_id=self.task_id, steps=len(self.steps)
        )


def _is_parent(a: _Run, b: _Run) -> bool:
    parent = b.info.parent if b.info is not None else None
    if parent is None:
        return False
    return parent.run_id == a.run_id or Path(parent.run_dir).resolve() == a.path.resolve()


def _lineage(a: _Run, b: _Run, rows: list[AlignedStep]) -> tuple[Lineage | None, list[AlignedStep]]:
    """When B is A's rerun or fork: the rows whose B model call was answered from A's record (and the
    tool calls those answers asked for) are marked ``replayed``; the fork point is after them."""
    info = b.info
    if info is None or info.lineage is None or not _is_parent(a, b):
        return None, rows
    summary = info.replay
    agent = [s for s in b.steps if s.kind == "model_call" and s.name == "agent"]
    if info.lineage == "fork":
        n = info.fork_step or 0
    elif summary is not None and summary.live_from is not None:
        n = summary.live_from - 1
    elif summary is not None and summary.divergence_step is not None:
        n = summary.divergence_step - 1
    else:
        n = len(agent)
    replayed_calls = {s.call_id for s in agent[:n]}
    out: list[AlignedStep] = []
    last = 0
    for i, row in enumerate(rows):
        s = row.b
        hit = s is not None and (
            s.call_id in replayed_calls if s.kind == "model_call" else s.asked_by in replayed_calls
        )
        out.append(row.model_copy(update={"replayed": hit}) if hit else row)
        if hit:
            last = i + 1
    lineage = Lineage(
        kind=info.lineage,
        fork_step=info.fork_step,
        replayed_agent_calls=min(n, len(agent)),
        replayed_rows=last,
        divergence_step=summary.divergence_step if summary is not None else None,
    )
    return lineage, out


def diff_runs(path_a: Path, path_b: Path) -> RunDiff:
    """Compare two run directories (raises FileNotFoundError for a path that is not one). When B is
    a rerun or fork of A, the steps answered from A's record are marked (``lineage``)."""
    a, b = _Run(path_a), _Run(path_b)
    rows, first = align(a.steps, b.steps)
    lineage, rows = _lineage(a, b, rows)
    return RunDiff(
        lineage=lineage,
        a=a.side(),
        b=b.side(),
        drift=_drift(a, b),
        steps=rows,
        first_divergence=first,
        deltas=_deltas(a, b),
    )
