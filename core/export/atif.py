"""A run directory as an ATIF trajectory (Harbor's Agent Trajectory Interchange Format, v1.8).

Facts of the format (Harbor's RFC 0001, "trajectory format"): a root object with ``schema_version``
(``"ATIF-v1.8"``), ``session_id``, ``agent`` (name, version, model_name), ``steps`` (``step_id`` from
1 without gaps; ``source`` one of system/user/agent; ``message``; agent steps alone may carry
``model_name``, ``reasoning_content``, ``tool_calls``, ``metrics``), ``final_metrics`` and ``extra``.
A tool call's result is an observation result whose ``source_call_id`` names a tool call of the same
step. ``prompt_tokens`` includes the cached tokens (``cached_tokens`` is a subset of it);
``llm_call_count`` > 1 says the step's metrics add up several model calls, and 0 would mean a step
made without a model (never written for "unknown"). A step copied from earlier context for the model
to continue from is ``is_copied_context: true`` (consumers leave it out of fine-tuning data).

What this export reads from the run directory (all optional except that something must be there):

- ``opencode/export.json``: OpenCode's transcript (core/runtime/transcript.py), one step per message;
- ``model_calls.jsonl``: the recording proxy's calls, attributed to assistant messages by
  ``message_id`` (core/model/records.py) — the per-step metrics come from these;
- ``tokens.jsonl`` (``model.capture_tokens``): each call's token ids and logprobs; an agent step's
  ``metrics`` carry those of the call that produced its message (``prompt_token_ids``,
  ``completion_token_ids``, ``logprobs``; ``extra.token_ids_call_id`` names the call);
- ``run.json``: the agent, the model, the outcome; ``events.jsonl``: the recorded failures.

Compactions (OpenCode's ``compaction`` part on a user message, then a summary written by its
``compaction`` agent) follow the format's convention for context management: a ``system`` step marks
the compaction (``extra.context_management``), the summary is an agent step like any other, and the
summary carried forward as the new context is a ``user`` step with ``is_copied_context: true``.

Unknown stays null: a count no call reported is absent, never 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from opencode_tui_core.artifacts import RunDirReader, RunFiles, RunInfo, is_run_dir
from opencode_tui_core.calls.records import TokenUsage
from opencode_tui_core.calls.token_capture import CapturedTokens
from opencode_tui_core.runtime.transcript import compaction_trigger

ATIF_VERSION: Final = "ATIF-v1.8"
TRAJECTORY_FILE = RunFiles.TRAJECTORY
AGENT_NAME = "opencode"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AtifToolCall(_Model):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class AtifSubagentRef(_Model):
    """Where a delegated subagent's trajectory is: ``trajectory_id`` of an entry of the parent's
    ``subagent_trajectories`` (embedded), or ``trajectory_path``; ``session_id`` is informational."""

    trajectory_id: str | None = None
    session_id: str | None = None
    trajectory_path: str | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _resolvable(self) -> AtifSubagentRef:
        if self.trajectory_id is None and self.trajectory_path is None:
            raise ValueError("a subagent reference needs trajectory_id or trajectory_path")
        return self


class AtifObservationResult(_Model):
    source_call_id: str | None = None
    content: str | None = None
    subagent_trajectory_ref: list[AtifSubagentRef] | None = None
    extra: dict[str, Any] | None = None


class AtifObservation(_Model):
    results: list[AtifObservationResult]


class AtifMetrics(_Model):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    # The token capture's (model.capture_tokens): the ids the model saw and generated, a logprob each.
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class AtifStep(_Model):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    message: str
    reasoning_content: str | None = None
    tool_calls: list[AtifToolCall] | None = None
    observation: AtifObservation | None = None
    metrics: AtifMetrics | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    is_copied_context: bool | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _agent_only(self) -> AtifStep:
        if self.source != "agent":
            for name in ("model_name", "reasoning_content", "tool_calls", "metrics"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is only allowed on agent steps (step {self.step_id})")
        if self.observation is not None and self.tool_calls is not None:
            ids = {c.tool_call_id for c in self.tool_calls}
            for r in self.observation.results:
                if r.source_call_id is not None and r.source_call_id not in ids:
                    raise ValueError(
                        f"observation {r.source_call_id!r} names no tool call of step {self.step_id}"
                    )
        return self


class AtifAgent(_Model):
    name: str
    version: str
    model_name: str | None = None
    extra: dict[str, Any] | None = None


class AtifFinalMetrics(_Model):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    total_steps: int | None = None
    extra: dict[str, Any] | None = None


class AtifTrajectory(_Model):
    """An ATIF document, as written and as read back (``AtifTrajectory.model_validate_json``)."""

    schema_version: Literal["ATIF-v1.8"] = ATIF_VERSION
    session_id: str
    trajectory_id: str | None = None
    agent: AtifAgent
    steps: list[AtifStep]
    notes: str | None = None
    final_metrics: AtifFinalMetrics | None = None
    subagent_trajectories: list[AtifTrajectory] | None = None
    extra: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _sequential(self) -> AtifTrajectory:
        for i, step in enumerate(self.steps, start=1):
            if step.step_id != i:
                raise ValueError(f"step_id {step.step_id} at position {i}: step ids run from 1 without gaps")
        embedded = {t.trajectory_id for t in self.subagent_trajectories or []}
        for step in self.steps:
            for result in step.observation.results if step.observation else []:
                for ref in result.subagent_trajectory_ref or []:
                    if ref.trajectory_path is None and ref.trajectory_id not in embedded:
                        raise ValueError(
                            f"step {step.step_id}: subagent trajectory {ref.trajectory_id!r} is not embedded"
                        )
        return self

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True, indent=2) + "\n"


# ---- reading the run directory ------------------------------------------------------------------


def _iso_ms(ms: Any) -> str | None:
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class _CallTotals:
    """Usage summed over model calls; a field no call reported stays None."""

    __slots__ = ("cache_write", "cached", "calls", "completion", "prompt", "reasoning")

    def __init__(self) -> None:
        self.calls = 0
        self.prompt: int | None = None
        self.completion: int | None = None
        self.cached: int | None = None
        self.reasoning: int | None = None
        self.cache_write: int | None = None

    def add(self, usage: TokenUsage) -> None:
        self.calls += 1
        for attr, key in (
            ("prompt", "tokens_in"),
            ("completion", "tokens_out"),
            ("cached", "tokens_cache_read"),
            ("reasoning", "tokens_reasoning"),
            ("cache_write", "tokens_cache_write"),
        ):
            v = _int(getattr(usage, key))
            if v is not None:
                old = getattr(self, attr)
                setattr(self, attr, v if old is None else old + v)

    def metrics(self, source: str) -> AtifMetrics | None:
        if self.prompt is None and self.completion is None and self.cached is None:
            return None
        extra: dict[str, Any] = {"source": source}
        if self.reasoning is not None:
            extra["reasoning_tokens"] = self.reasoning
        if self.cache_write is not None:
            extra["cache_write_tokens"] = self.cache_write
        return AtifMetrics(
            prompt_tokens=self.prompt,
            completion_tokens=self.completion,
            cached_tokens=self.cached,
            extra=extra,
        )


def _read_calls(reader: RunDirReader) -> tuple[dict[str, _CallTotals], _CallTotals, dict[str, int]]:
    """Per-message usage of the attributed calls, the total over every call, and calls by kind."""
    by_message: dict[str, _CallTotals] = {}
    everything = _CallTotals()
    kinds: dict[str, int] = {}
    for call in reader.call_summaries():
        everything.add(call.usage)
        kind = call.kind or "other"
        kinds[kind] = kinds.get(kind, 0) + 1
        if call.message_id:
            by_message.setdefault(call.message_id, _CallTotals()).add(call.usage)
    return by_message, everything, kinds


def _read_tokens(reader: RunDirReader) -> dict[str, CapturedTokens]:
    """Each assistant message's captured tokens: those of the last complete, unedited call attributed
    to it (an earlier one was retried, so its answer is not the message's)."""
    return {t.message_id: t for t in reader.captured_tokens() if t.message_id is not None and t.of_message}


def _with_tokens(metrics: AtifMetrics | None, tokens: CapturedTokens | None) -> AtifMetrics | None:
    """An agent step's metrics with its message's token ids and logprobs, when they were captured."""
    if tokens is None:
        return metrics
    base = metrics or AtifMetrics()
    return base.model_copy(
        update={
            "prompt_token_ids": tokens.prompt_token_ids,
            "completion_token_ids": tokens.completion_token_ids,
            "logprobs": tokens.logprobs,
            "extra": {**(base.extra or {}), "token_ids_call_id": tokens.call_id},
        }
    )


def _read_failures(reader: RunDirReader) -> list[dict[str, Any]]:
    """The recorded failures (``FailureRecorded`` events), failure and decision, in order."""
    return [
        {"failure": ev.get("failure") or {}, "decision": ev.get("decision") or {}}
        for ev in reader.event_records(("failure",))
    ]


def _text(parts: Iterable[dict[str, Any]], kind: str) -> str:
    return "\n\n".join(
        p["text"] for p in parts if p.get("type") == kind and isinstance(p.get("text"), str) and p["text"]
    )


def _tool_call(part: dict[str, Any], subagents: set[str]) -> tuple[AtifToolCall, AtifObservationResult]:
    state = part.get("state") or {}
    call_id = str(part.get("callID") or part.get("id") or "")
    args = state.get("input")
    status = state.get("status")
    call = AtifToolCall(
        tool_call_id=call_id,
        function_name=str(part.get("tool") or "unknown"),
        arguments=args if isinstance(args, dict) else {},
    )
    if status == "completed":
        content = state.get("output")
    elif status == "error":
        content = state.get("error")
    else:  # pending/running when the agent stopped: the call never returned
        content = None
    extra: dict[str, Any] = {"status": status}
    if state.get("title"):
        extra["title"] = state["title"]
    t = state.get("time") or {}
    if isinstance(t.get("start"), int | float) and isinstance(t.get("end"), int | float):
        extra["duration_s"] = round((t["end"] - t["start"]) / 1000, 3)
    # OpenCode's ``task`` tool names the session its subagent ran in (``metadata.sessionId``).
    child = (state.get("metadata") or {}).get("sessionId")
    refs = [AtifSubagentRef(trajectory_id=child, session_id=child)] if child in subagents else None
    result = AtifObservationResult(
        source_call_id=call_id,
        content=content if isinstance(content, str) else None,
        subagent_trajectory_ref=refs,
        extra=extra,
    )
    return call, result


class _Steps:
    def __init__(self) -> None:
        self.steps: list[AtifStep] = []

    def add(self, **fields: Any) -> AtifStep:
        step = AtifStep(step_id=len(self.steps) + 1, **fields)
        self.steps.append(step)
        return step


def _transcript_steps(
    doc: dict[str, Any],
    calls: dict[str, _CallTotals],
    default_model: str | None,
    subagents: set[str],
    tokens: dict[str, CapturedTokens],
) -> tuple[list[AtifStep], int]:
    out = _Steps()
    compactions = 0
    for m in doc.get("messages") or []:
        info = m.get("info") or {}
        parts = [p for p in (m.get("parts") or []) if isinstance(p, dict)]
        ts = _iso_ms((info.get("time") or {}).get("created"))
        mid = info.get("id")
        if info.get("role") == "user":
            for p in parts:
                if p.get("type") == "compaction":
                    compactions += 1
                    trigger = compaction_trigger(p)
                    out.add(
                        source="system",
                        timestamp=ts,
                        message=f"context compaction ({trigger}): earlier turns are replaced by a summary",
                        extra={
                            "context_management": {"type": "compaction", "trigger": trigger},
                            "opencode_message_id": mid,
                        },
                    )
            text = _text((p for p in parts if not p.get("synthetic")), "text")
            synthetic = _text((p for p in parts if p.get("synthetic")), "text")
            if text or synthetic:
                extra: dict[str, Any] = {"opencode_message_id": mid}
                if not text:
                    extra["synthetic"] = True  # written by OpenCode (e.g. "continue"), not by a person
                out.add(source="user", timestamp=ts, message=text or synthetic, extra=extra)
            continue
        if info.get("role") != "assistant":
            continue
        tool_calls: list[AtifToolCall] = []
        results: list[AtifObservationResult] = []
        for p in parts:
            if p.get("type") == "tool":
                call, result = _tool_call(p, subagents)
                tool_calls.append(call)
                results.append(result)
        extra = {"opencode_message_id": mid, "opencode_agent": info.get("agent")}
        if info.get("finish"):
            extra["finish"] = info["finish"]
        if info.get("error"):
            extra["error"] = info["error"]
        summary = info.get("summary") is True or info.get("agent") == "compaction"
        if summary:
            extra["context_management"] = {"type": "compaction", "role": "summary"}
        attributed = calls.get(mid) if isinstance(mid, str) else None
        metrics: AtifMetrics | None
        if attributed is not None:
            metrics, count = attributed.metrics("model_calls"), attributed.calls
        else:
            metrics, count = _transcript_metrics(info.get("tokens")), None
        metrics = _with_tokens(metrics, tokens.get(mid) if isinstance(mid, str) else None)
        model = info.get("modelID") or default_model
        message = _text(parts, "text")
        out.add(
            source="agent",
            timestamp=ts,
            model_name=model if isinstance(model, str) else None,
            message=message,
            reasoning_content=_text(parts, "reasoning") or None,
            tool_calls=tool_calls or None,
            observation=AtifObservation(results=results) if results else None,
            metrics=metrics,
            llm_call_count=count,
            extra=extra,
        )
        if summary and message:
            out.add(
                source="user",
                timestamp=ts,
                message=message,
                is_copied_context=True,
                extra={"context_management": {"type": "compaction", "role": "carried_context"}},
            )
    return out.steps, compactions


def _transcript_metrics(tokens: Any) -> AtifMetrics | None:
    """Metrics from OpenCode's own count, when no model call was attributed to the message."""
    if not isinstance(tokens, dict):
        return None
    cache = tokens.get("cache") or {}
    values = [tokens.get("input"), tokens.get("output"), tokens.get("reasoning"), *cache.values()]
    # All zeros is a message cut off before it reported (see core/runtime/transcript.py): unknown.
    if not any(_int(v) for v in values):
        return None
    read, write = _int(cache.get("read")) or 0, _int(cache.get("write")) or 0
    return AtifMetrics(
        prompt_tokens=(_int(tokens.get("input")) or 0) + read + write,
        completion_tokens=(_int(tokens.get("output")) or 0) + (_int(tokens.get("reasoning")) or 0),
        cached_tokens=read,
        extra={"source": "opencode_transcript", "reasoning_tokens": _int(tokens.get("reasoning")) or 0},
    )


def _sum(values: Iterator[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def build_trajectory(run_dir: Path) -> AtifTrajectory:
    """The ATIF trajectory of one run directory (raises ValueError if it is not one)."""
    run_dir = Path(run_dir)
    reader = RunDirReader(run_dir, check=False)
    info = reader.info()
    export_path = run_dir / RunFiles.OPENCODE_EXPORT
    if not is_run_dir(run_dir) and not export_path.exists():  # a transcript alone still exports
        raise ValueError(
            f"{run_dir} is not a run directory (no run.json, events.jsonl or {RunFiles.OPENCODE_EXPORT})"
        )
    model_cfg = (info.config.get("model") or {}) if info else {}
    model_name = model_cfg.get("name") if isinstance(model_cfg.get("name"), str) else None
    calls, all_calls, kinds = _read_calls(reader)
    tokens = _read_tokens(reader)
    failures = _read_failures(reader)

    doc: dict[str, Any] | None = None
    if export_path.exists():
        doc = json.loads(export_path.read_text(encoding="utf-8"))
    versions = info.versions if info else {}
    agent = AtifAgent(
        name=AGENT_NAME,
        version=versions.get("opencode") or "unknown",
        model_name=model_name,
        extra={"harness": "opencode-tui", "harness_version": versions.get("opencode_tui")},
    )
    subagents: list[AtifTrajectory] = []
    if doc is not None:
        sessions = [s for s in doc.get("subagents") or [] if isinstance(s, dict)]
        subagents = _subagent_trajectories(doc, sessions, calls, tokens, agent)
        steps, compactions = _transcript_steps(
            doc, calls, model_name, {t.session_id for t in subagents}, tokens
        )
        session_id = str((doc.get("session") or {}).get("id") or (info.run_id if info else run_dir.name))
        notes = None
    else:
        why = info.outcome.summary if info and info.outcome else "the episode did not finish"
        steps = [
            AtifStep(
                step_id=1,
                source="system",
                message=f"no transcript: OpenCode's conversation was not exported ({why})",
                extra={"transcript": None},
            )
        ]
        compactions = 0
        session_id = info.run_id if info else run_dir.name
        notes = "The run ended without OpenCode's transcript; the only step says why."

    # Every call the proxy saw (OpenCode's title requests and subagents' calls included), attributed or not.
    model_calls = {
        "count": all_calls.calls,
        "by_kind": kinds,
        "prompt_tokens": all_calls.prompt,
        "completion_tokens": all_calls.completion,
        "cached_tokens": all_calls.cached,
    }
    final = _final_metrics(steps, compactions, model_calls=model_calls)
    return AtifTrajectory(
        session_id=session_id,
        trajectory_id=info.run_id if info else run_dir.name,
        agent=agent,
        steps=steps,
        notes=notes,
        final_metrics=final,
        subagent_trajectories=subagents or None,
        extra=_run_extra(info, failures),
    )


def _final_metrics(steps: list[AtifStep], compactions: int, **extra: Any) -> AtifFinalMetrics:
    metrics = [s.metrics for s in steps if s.source == "agent" and s.metrics is not None]
    return AtifFinalMetrics(
        total_prompt_tokens=_sum(m.prompt_tokens for m in metrics),
        total_completion_tokens=_sum(m.completion_tokens for m in metrics),
        total_cached_tokens=_sum(m.cached_tokens for m in metrics),
        total_steps=len(steps),
        extra={
            "total_reasoning_tokens": _sum((m.extra or {}).get("reasoning_tokens") for m in metrics),
            "total_llm_calls": sum(s.llm_call_count or 0 for s in steps),
            "compactions": compactions,
            **extra,
        },
    )


def _subagent_trajectories(
    parent: dict[str, Any],
    sessions: list[dict[str, Any]],
    calls: dict[str, _CallTotals],
    tokens: dict[str, CapturedTokens],
    agent: AtifAgent,
) -> list[AtifTrajectory]:
    """The trajectories of the subagent sessions ``parent`` started (each with its own, recursively),
    embedded in the parent's and referenced from the ``task`` call that started them."""
    parent_id = (parent.get("session") or {}).get("id")
    out = []
    for sub in sessions:
        session = sub.get("session") or {}
        if session.get("parent_id") != parent_id or not isinstance(session.get("id"), str):
            continue
        children = _subagent_trajectories(sub, sessions, calls, tokens, agent)
        steps, compactions = _transcript_steps(
            sub, calls, agent.model_name, {t.session_id for t in children}, tokens
        )
        if not steps:
            steps = [AtifStep(step_id=1, source="system", message="the subagent's session holds no message")]
        kind = next(
            (
                m["info"].get("agent")
                for m in sub.get("messages") or []
                if m["info"].get("role") == "assistant"
            ),
            None,
        )
        out.append(
            AtifTrajectory(
                session_id=session["id"],
                trajectory_id=session["id"],
                agent=agent.model_copy(update={"extra": {**(agent.extra or {}), "subagent_type": kind}}),
                steps=steps,
                final_metrics=_final_metrics(steps, compactions),
                subagent_trajectories=children or None,
                extra={"title": session.get("title"), "parent_session_id": parent_id},
            )
        )
    return out


def _run_extra(info: RunInfo | None, failures: list[dict[str, Any]]) -> dict[str, Any]:
    outcome = info.outcome.model_dump(mode="json") if info and info.outcome else None
    deciding = None
    if outcome and outcome.get("failure_kind"):
        deciding = next(
            (f["failure"] for f in failures if (f["failure"] or {}).get("kind") == outcome["failure_kind"]),
            None,
        )
    return {
        "run_id": info.run_id if info else None,
        "task_id": info.task_id if info else None,
        "attempt": info.attempt if info else None,
        "provider": info.provider if info else None,
        "outcome": outcome,
        "failure": deciding,
        "failures": [
            {
                "kind": f["failure"].get("kind"),
                "stage": f["failure"].get("stage"),
                "message": f["failure"].get("message"),
                "class": f["decision"].get("failure_class"),
                "action": f["decision"].get("action"),
            }
            for f in failures
        ],
        "human_intervened": info.human_intervened if info else None,
        "started_at": info.started_at.isoformat() if info else None,
        "ended_at": info.ended_at.isoformat() if info and info.ended_at else None,
        # Only with model.capture_tokens, so a trajectory without it is as it was.
        **({"token_capture": info.token_capture.model_dump()} if info and info.token_capture else {}),
    }


def write_trajectory(run_dir: Path, dest: Path | None = None) -> Path:
    """Write the trajectory (to ``run_dir/trajectory.json`` unless ``dest``); atomic replace."""
    run_dir = Path(run_dir)
    target = Path(dest) if dest is not None else run_dir / TRAJECTORY_FILE
    text = build_trajectory(run_dir).to_json()
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    return target


# ---- OpenAI-style chat messages -----------------------------------------------------------------


def to_messages(traj: AtifTrajectory) -> list[dict[str, Any]]:
    """The trajectory as chat messages with tool calls (for fine-tuning).

    Copied-context steps are left out, as the format asks of training data; the compaction marker
    becomes a system message so the cut stays visible.
    """
    out: list[dict[str, Any]] = []
    for s in traj.steps:
        if s.is_copied_context:
            continue
        if s.source != "agent":
            out.append({"role": s.source, "content": s.message})
            continue
        msg: dict[str, Any] = {"role": "assistant", "content": s.message or None}
        if s.reasoning_content:
            msg["reasoning_content"] = s.reasoning_content
        if s.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.tool_call_id,
                    "type": "function",
                    "function": {
                        "name": c.function_name,
                        "arguments": json.dumps(c.arguments, ensure_ascii=False),
                    },
                }
                for c in s.tool_calls
            ]
        out.append(msg)
        for r in s.observation.results if s.observation else []:
            out.append({"role": "tool", "tool_call_id": r.source_call_id, "content": r.content or ""})
    return out
