"""The verification phase, only after confirmed cleanup and never after a cancel: the task's verifier
under a small wrapper that records its exit code or killing signal; the reward file, when it has one.

A killed, timed-out or lost grader is no grade: ``opencode_tui_core.outcome.verifier_verdict`` says so, and an OOM
the provider confirms (evidence not already seen for the agent) is named as what it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from opencode_tui_core.artifacts import RunFiles
from opencode_tui_core.episode.close import oom_evidence
from opencode_tui_core.episode.common import PhaseIO, evidence_key, failure_from
from opencode_tui_core.events import VerificationFinished
from opencode_tui_core.failures import FailureEvent, FailureStage
from opencode_tui_core.harbor import read_reward
from opencode_tui_core.outcome import VerifierRun, verifier_verdict
from opencode_tui_core.runtime.verify_wrapper import VERIFY_WRAPPER_SOURCE, read_verify_status
from opencode_tui_core.sandbox.base import Sandbox, SandboxUser
from opencode_tui_core.session import CloseDeadline
from opencode_tui_core.tasks import Task


@dataclass(frozen=True)
class Verified:
    """The verifier's run as observed (None: it could not even run), its reward, what failed."""

    run: VerifierRun | None
    reward: float | None
    failures: tuple[FailureEvent, ...]


def verifier_user(task: Task, sandbox_user: SandboxUser | None) -> str | None:
    """Who runs the verifier: ``verify.user`` (e.g. root for Harbor tasks), else the sandbox user."""
    return task.verify.user or (sandbox_user.label if sandbox_user is not None else None)


def status_path(run_id: str) -> str:
    """Where the wrapper writes how the verifier ended, inside the sandbox."""
    return f"/tmp/.opencode-tui-verify-{run_id}.json"


async def verify(
    sandbox: Sandbox,
    *,
    task: Task,
    run_id: str,
    python: str,
    sandbox_user: SandboxUser | None,
    agent_oom: frozenset[tuple[str, str]],
    deadline: CloseDeadline,
    io: PhaseIO,
) -> Verified:
    from opencode_tui_core.sandbox.oom import oom_evidence as confirming
    from opencode_tui_core.sandbox.tarsafe import directory_tar

    v = task.verify
    started = time.monotonic()
    # The wrapper reports how the verifier ended (an exit code or a signal) in a status file: a
    # shell's 128+N cannot be told apart from `exit 128+N`, and a killed grader is no grade.
    status = status_path(run_id)
    # sandbox user (issue 17): hidden tests are the user's; the verifier runs as it unless the
    # task says `verify.user`, and the record says who ran it.
    owner = sandbox_user.ids if sandbox_user is not None else None
    try:
        if task.verify_files_dir is not None:
            await sandbox.upload_tar(  # Harbor tests go to /tests
                task.verify_files_target, directory_tar(task.verify_files_dir, owner=owner)
            )
        result = await sandbox.exec(
            [python, "-c", VERIFY_WRAPPER_SOURCE, v.command, status],
            cwd=task.workdir,
            timeout=v.timeout,
            user=v.user,
        )
    except Exception as exc:  # a lost sandbox, a failed upload, or a bug: the grade is inconclusive
        io.fail(failure_from(exc, "verifier_error", FailureStage.VERIFICATION, "run verifier"))
        return Verified(run=None, reward=None, failures=tuple(io.recorded))
    out = result.stdout.decode("utf-8", "replace")
    err = result.stderr.decode("utf-8", "replace")
    io.run_dir.write_text(RunFiles.VERIFY_STDOUT, out)
    io.run_dir.write_text(RunFiles.VERIFY_STDERR, err)
    exit_code, signal = result.exit_code, result.signal
    if result.observed:
        exit_code, signal = await read_verify_status(sandbox, status, result)
    reward_text = reward_error = None
    if v.reward_file and result.observed and signal is None and exit_code is not None:
        reward_text, reward_error = await read_reward(sandbox, task)  # reward_file, then reward_json
    run = VerifierRun(
        exit_code=exit_code,
        signal=signal,
        observed=result.observed,
        deadline_fired=result.deadline_expired,
        timeout_s=v.timeout,
        duration_s=round(time.monotonic() - started, 3),
        output_excerpt=(out + err)[-2000:],
        reward_file=v.reward_file,
        reward_text=reward_text,
        reward_error=reward_error,
    )
    verdict = verifier_verdict(run)
    io.emit(
        VerificationFinished(
            exit_code=run.exit_code,
            reward=verdict.reward,
            passed=verdict.passed,
            duration_s=run.duration_s or 0.0,
            output_excerpt=run.output_excerpt,
            user=verifier_user(task, sandbox_user),
        )
    )
    if verdict.failure is not None:
        # A grader that died may have been OOM-killed: say so when the provider confirms it.
        with deadline.counting():  # [close budget] the inspect is the close's, not the verifier's
            evidence = await oom_evidence(sandbox, deadline, io)
        fresh = [e for e in confirming(evidence) if evidence_key(e) not in agent_oom]
        if fresh:
            io.fail(
                FailureEvent(
                    kind="provider_oom_killed",
                    stage=FailureStage.VERIFICATION,
                    operation="run verifier",
                    message=f"the kernel OOM-killed the verifier (confirmed by {fresh[0].source}); "
                    "the grade is inconclusive",
                    evidence=fresh,
                )
            )
        else:
            io.fail(verdict.failure)
    return Verified(run=run, reward=verdict.reward, failures=tuple(io.recorded))
