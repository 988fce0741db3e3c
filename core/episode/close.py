"""The closing phase: ask the supervisor to stop and wait for a positive receipt, within the close
budget. Without a receipt an owned sandbox is destroyed, and its destruction is the proof; a
borrowed (or kept) one stays unconfirmed and the record says so. Then what the agent's end means:
the provider's OOM evidence, the receipt and the model calls make at most one agent failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opencode_tui_core.episode import engine_lost
from opencode_tui_core.episode.common import PhaseIO, evidence_key, failure_from
from opencode_tui_core.events import CleanupProof, SandboxFault, Warning_
from opencode_tui_core.failures import CleanupDetails, Evidence, FailureEvent, FailureStage
from opencode_tui_core.outcome import AgentFacts, agent_failure
from opencode_tui_core.runtime.supervisor_client import CleanupReceipt
from opencode_tui_core.sandbox.base import Sandbox
from opencode_tui_core.session import CleanupUnconfirmed, CloseDeadline, SandboxSession

if TYPE_CHECKING:
    from opencode_tui_core.calls.records import ModelCallRecord
    from opencode_tui_core.model.endpoint import ModelEndpoint
    from opencode_tui_core.runtime.opencode import OpenCodeHarness


@dataclass(frozen=True)
class AgentCheck:
    """What judging the agent's end needs besides the receipt (known when the close starts)."""

    run_id: str
    endpoint: ModelEndpoint  # its last failed call, and the bash commands the model asked for
    harness: OpenCodeHarness  # finished cleanly, its last error, a rejected permission
    run_budget_s: float
    elapsed_s: float | None
    memory_limit_bytes: int | None
    faults: tuple[SandboxFault, ...] = ()  # kernel kills and a full disk seen while the agent ran


@dataclass(frozen=True)
class Closed:
    """How cleanup was confirmed (or not), and what the agent's end meant."""

    confirmed: bool  # a positive receipt arrived
    proof: CleanupProof | None  # RECEIPT, DESTROYED, FOUND_DEAD, or None (unconfirmed)
    receipt: CleanupReceipt | None
    # OOM evidence already seen for the agent, so one during verification is told apart.
    agent_oom: frozenset[tuple[str, str]]
    failures: tuple[FailureEvent, ...]


async def oom_evidence(sandbox: Sandbox | None, deadline: CloseDeadline, io: PhaseIO) -> list[Evidence]:
    """The provider's structured evidence about this sandbox (bounded; best effort)."""
    if sandbox is None:
        return []
    try:
        # [close budget] within what the close has left; not started once it is spent.
        return await deadline.run(sandbox.inspect(), step="inspect the sandbox", cap=15)
    except Exception as exc:  # diagnosis is best effort and bounded
        io.emit(Warning_(code="inspect_failed", message=f"could not inspect the sandbox: {exc}"))
        return []


def last_requested_command(records: list[ModelCallRecord]) -> str | None:
    """The last shell command the model asked for, as the proxy recorded it: when the agent kills
    its own supervisor, the live event for that command may never have left the sandbox."""
    from opencode_tui_core.calls.records import assembled_tool_calls

    for record in reversed(records):
        for name, args in reversed(assembled_tool_calls(record.response_body)):
            try:
                command = json.loads(args).get("command") if name == "bash" else None
            except (ValueError, AttributeError):
                command = None
            if isinstance(command, str):
                return command[:200]
    return None


def why_unconfirmed(exc: CleanupUnconfirmed, *, hurried: bool, last_command: str | None) -> str:
    """One line on why there is no receipt, naming the agent's last command when it ran one."""
    if hurried:
        return "the close was hurried: the sandbox was destroyed before the receipt arrived"
    return f"{exc} (while the agent ran `{last_command}`)" if last_command else str(exc)


async def close(
    session: SandboxSession,
    sandbox: Sandbox,
    *,
    deadline: CloseDeadline,
    check: AgentCheck,
    cancelled_agent: bool,
    keep: Callable[[], bool],
    hurried: Callable[[], bool],
    last_command: Callable[[], str | None],
    io: PhaseIO,
) -> Closed:
    """Stop, confirm, judge the agent. ``keep``, ``hurried`` and ``last_command`` are read when
    needed: a person may still change them while the supervisor is being stopped.

    ``cancelled_agent``: the agent was cancelled while it ran; a run we stopped ourselves says
    nothing through its exit, but its OOM evidence still counts."""
    receipt: CleanupReceipt | None = None
    proof: CleanupProof | None = None
    try:
        receipt = await session.finalize()
        confirmed, proof = True, CleanupProof.RECEIPT
    except CleanupUnconfirmed as exc:
        confirmed = False
        proof = await _confirm_by_destruction(
            session,
            sandbox,
            exc,
            keep=keep(),
            hurried=hurried,
            last_command=last_command,
            check=check,
            io=io,
            deadline=deadline,
        )
    agent_oom: frozenset[tuple[str, str]] = frozenset()
    if session.launch_started and (not cancelled_agent or receipt is None):
        agent_oom = await _judge_agent(sandbox, receipt, check, deadline, io)
    if session.collect_error is not None and not io.disk_full(session.collect_error):
        lost = failure_from(
            session.collect_error,
            kind="transcript_export_failed",
            stage=FailureStage.TRANSCRIPT,
            operation="collect OpenCode database and logs",
        )
        seen = Evidence(
            source="sandbox.download",
            scope=sandbox.sandbox_id,
            data={"error": f"{type(session.collect_error).__name__}: {session.collect_error}"[:500]},
        )
        io.fail(lost.model_copy(update={"evidence": [*lost.evidence, seen]}))
    return Closed(
        confirmed=confirmed, proof=proof, receipt=receipt, agent_oom=agent_oom, failures=tuple(io.recorded)
    )


async def _confirm_by_destruction(
    session: SandboxSession,
    sandbox: Sandbox,
    exc: CleanupUnconfirmed,
    *,
    keep: bool,
    hurried: Callable[[], bool],
    last_command: Callable[[], str | None],
    check: AgentCheck,
    io: PhaseIO,
    deadline: CloseDeadline,
) -> CleanupProof | None:
    """No positive receipt: an owned sandbox is destroyed now, and its death is the proof (a
    destroyed container or PID namespace holds no process). A borrowed or kept one stays
    unconfirmed, and the record says so. When the engine under the sandbox went away, it is waited
    for first, and a sandbox it reports dead is proof already (engine_lost.py)."""
    hurry = hurried()
    records = check.endpoint.records if check.endpoint is not None else []
    last = None if hurry else (last_command() or last_requested_command(records))
    why = why_unconfirmed(exc, hurried=hurry, last_command=last)
    proof: CleanupProof | None = None
    lost = None if hurry else await engine_lost.probe_engine(sandbox, exc, deadline, io)  # [engine lost]
    if lost is not None and lost.dead:
        proof = engine_lost.found_dead(lost, io)
    if sandbox.owned and not keep:
        try:
            await session.release()  # [close budget] bounded by the session's close deadline
        except Exception as release_exc:
            why = f"{why}; destroying the sandbox failed too: {release_exc}"
        else:
            proof = proof or CleanupProof.DESTROYED  # [engine lost] found dead first
    if lost is not None:  # [engine lost] a session ran: the engine went while the agent did
        io.fail(engine_lost.failure(sandbox, lost, why, proof, FailureStage.AGENT, "stop and confirm"))
        if proof is not None:
            return proof
    elif proof is CleanupProof.DESTROYED:
        if not hurried():
            io.fail(
                FailureEvent.from_exception(
                    exc,
                    kind="supervisor_lost",
                    stage=FailureStage.CLOSING,
                    operation="stop and confirm",
                    message=f"{why}; cleanup was proven by destroying the sandbox",
                    details=CleanupDetails(receipt=None, fallback="sandbox destroyed"),
                )
            )
        return proof
    io.fail(
        FailureEvent.from_exception(
            exc,
            kind="cleanup_unconfirmed",
            stage=FailureStage.CLOSING,
            operation="stop and confirm",
            message=why,
            details=CleanupDetails(
                receipt=None, fallback=None if sandbox.owned else "borrowed: never destroyed"
            ),
        )
    )
    return proof


async def _judge_agent(
    sandbox: Sandbox, receipt: CleanupReceipt | None, check: AgentCheck, deadline: CloseDeadline, io: PhaseIO
) -> frozenset[tuple[str, str]]:
    """Turn provider evidence, the receipt and the model calls into at most one agent failure."""
    from opencode_tui_core.sandbox.oom import oom_evidence as confirming

    evidence = await oom_evidence(sandbox, deadline, io)
    failed_call = check.endpoint.last_failed_call()
    failure = agent_failure(
        AgentFacts(
            run_id=check.run_id,
            receipt=receipt,
            evidence=evidence,
            finished_cleanly=check.harness.finished_cleanly,
            last_error=check.harness.last_error,
            failed_model_call=failed_call.to_failure(FailureStage.AGENT) if failed_call else None,
            permission_rejected=check.harness.permission_failure(),
            run_budget_s=check.run_budget_s,
            elapsed_s=check.elapsed_s,
            memory_limit_bytes=check.memory_limit_bytes,
            faults=list(check.faults),
        )
    )
    if failure is not None:
        io.fail(failure)
    return frozenset(evidence_key(e) for e in confirming(evidence))
