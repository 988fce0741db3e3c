"""Episodes end to end: the real OpenCode binary, the scripted model behind the recording proxy, real
sandboxes (Docker and bubblewrap), real faults (kernel OOM, run deadline, 429/500 from the model).

All sample tasks run once per provider as one batch (jobs=2); the tests then check each outcome
against its run directory.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from opencode_tui_core.artifacts import RunDirReader, RunFiles
from opencode_tui_core.batch import run_batch
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.events import (
    CleanupObserved,
    ModelCall,
    OutcomeDecided,
    PhaseChanged,
    VerificationFinished,
)
from opencode_tui_core.samples import EXPECTED_OUTCOMES
from opencode_tui_core.tasks import load_task, render_prompt

pytestmark = pytest.mark.slow
SAMPLES = Path(__file__).resolve().parents[2] / "sample_tasks"
TASKS = [
    "hello-file",
    "fix-bug",
    "swe-style",
    "long-context",
    "oom",
    "exit-137",
    "model-flaky-429",
    "model-flaky-500",
    "timeout",
]


@pytest.fixture(
    scope="module",
    params=[pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)],
)
def batch(request, tmp_path_factory):
    provider = request.param
    if provider == "docker":
        r = subprocess.run(["docker", "image", "inspect", "opencode-tui/base:bookworm"], capture_output=True)
        if r.returncode != 0:
            pytest.skip(
                "docker or the base image is unavailable (scripts/start-dockerd, scripts/build-images)"
            )
    runs = tmp_path_factory.mktemp(f"runs-{provider}")
    config = AgentConfig.model_validate({"sandbox": {"provider": provider}, "policy": {"max_attempts": 2}})
    tasks = [load_task(SAMPLES / name) for name in TASKS]
    import asyncio

    summary = asyncio.run(run_batch(tasks, config, runs_dir=runs, jobs=2))
    return provider, runs, {r.task_id: r for r in summary.results}


def _events(result):
    return list(RunDirReader(Path(result.run_dir)).events())


def test_every_sample_task_has_its_expected_outcome(batch):
    _, _, results = batch
    got = {t: (r.action, r.reward, r.failure_kind) for t, r in results.items()}
    assert got == EXPECTED_OUTCOMES
    assert all(r.cleanup_confirmed for r in results.values())


def test_results_file_matches_run_directories(batch):
    _, runs, _ = batch
    lines = [json.loads(line) for line in (runs / "results.jsonl").read_text().splitlines()]
    assert {line["task_id"] for line in lines} == set(TASKS)
    for line in lines:
        info = RunDirReader(Path(line["run_dir"])).info()
        assert info.outcome.action == line["action"]
        assert info.outcome.failure_kind == line["failure_kind"]
        assert info.sandbox_id == line["sandbox_id"]


def test_no_container_left_behind(batch, test_owner):
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=opencode-tui.owner={test_owner}"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == []


def test_verification_only_after_confirmed_cleanup(batch):
    _, _, results = batch
    for result in results.values():
        events = _events(result)
        receipt = [
            e.seq
            for e in events
            if isinstance(e, CleanupObserved) and e.step == "receipt" and e.state == "ok"
        ]
        verify_phase = [e.seq for e in events if isinstance(e, PhaseChanged) and e.phase == "verification"]
        verified = [e.seq for e in events if isinstance(e, VerificationFinished)]
        transcript = [e.seq for e in events if isinstance(e, PhaseChanged) and e.phase == "transcript"]
        assert receipt, result.task_id
        assert all(s > receipt[0] for s in verify_phase + verified + transcript), result.task_id


def test_run_directory_layout(batch):
    _, _, results = batch
    d = Path(results["fix-bug"].run_dir)
    for name in (
        "run.json",
        "events.jsonl",
        "terminal.cast",
        "model_calls.jsonl",
        "opencode/stdout.jsonl",
        "opencode/export.json",
        "opencode.db",
        "diagnostics.txt",
        "verify/stdout.log",
        RunFiles.PROMPT,
        RunFiles.TASK_YAML,
    ):
        assert (d / name).exists(), name
    # what OpenCode was given, exactly as sent (the prompt on its stdin), and the task it came from
    reader = RunDirReader(d)
    assert reader.prompt() == render_prompt(load_task(SAMPLES / "fix-bug"))
    assert reader.task_yaml() == (SAMPLES / "fix-bug" / "task.yaml").read_text()
    assert reader.instructions() is None  # the task has none
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    cast = (d / RunFiles.CAST).read_text().splitlines()
    assert json.loads(cast[0])["version"] == 2
    assert any("python3 -m unittest" in line for line in cast[1:])


def test_every_model_call_recorded_and_attributed(batch):
    _, _, results = batch
    result = results["fix-bug"]
    d = Path(result.run_dir)
    calls = [json.loads(line) for line in (d / RunFiles.MODEL_CALLS).read_text().splitlines()]
    events = [e for e in _events(result) if isinstance(e, ModelCall)]
    assert len(calls) == len(events) == result.model_calls
    export = json.loads((d / RunFiles.OPENCODE_EXPORT).read_text())
    assistant_ids = {m["info"]["id"] for m in export["messages"] if m["info"]["role"] == "assistant"}
    agent_calls = [c for c in calls if c["kind"] == "agent"]
    assert agent_calls
    for c in agent_calls:
        assert c["message_id"] in assistant_ids, c["message_id"]
    joined = [c["message_id"] for c in agent_calls]
    assert len(joined) == len(set(joined)), "each assistant message joins exactly one call here"
    for c in calls:
        if c["kind"] == "title":
            assert c["message_id"] is None, "title calls must stay unattributed"


def test_oom_confirmed_from_provider_evidence(batch):
    provider, _, results = batch
    failures = [e for e in _events(results["oom"]) if e.type == "failure"]
    assert len(failures) == 1
    f = failures[0]
    assert (f.failure.kind, f.failure.stage, f.decision.failure_class, f.decision.action) == (
        "provider_oom_killed",
        "agent",
        "model",
        "count_as_zero",
    )
    # The kernel picks the victim: the command (OpenCode survives and finishes: the named rule
    # decides) or OpenCode itself (always the agent's failure). Either way the record says which.
    receipt = [e for e in _events(results["oom"]) if e.type == "cleanup" and e.step == "receipt"][0]
    if receipt.data["return_code"] == 0:
        assert (f.decision.rule, f.failure.details.victim) == ("oom_survived", "command")
    else:
        assert (f.decision.rule, f.failure.details.victim) == ("provider_oom_killed@agent", "agent")
    sources = {ev.source for ev in f.failure.evidence}
    # kernel.log / process.table: the process the live watch saw killed (test_episode_faults.py)
    live = {"kernel.log", "process.table", "docker.events"}
    allowed = (
        {"docker.state", "docker.events", "cgroup.memory"} if provider == "docker" else {"cgroup.memory"}
    ) | live
    assert sources and sources <= allowed
    assert all(ev.scope for ev in f.failure.evidence)


def test_exit_137_without_memory_pressure_is_not_oom(batch):
    _, _, results = batch
    assert not [e for e in _events(results["exit-137"]) if e.type == "failure"]
    bash = [
        e
        for e in _events(results["exit-137"])
        if e.type == "tool_call" and e.tool == "bash" and e.status != "running"
    ]
    assert bash and "137" in (bash[0].output or "")


def test_timeout_fires_and_descendants_are_drained(batch):
    _, _, results = batch
    events = _events(results["timeout"])
    f = [e for e in events if e.type == "failure"][0]
    assert f.failure.kind == "agent_timeout" and f.failure.details.timed_out_observed
    receipt = [e for e in events if isinstance(e, CleanupObserved) and e.step == "receipt"][0]
    assert receipt.data["timed_out"] is True and receipt.data["cleanup_confirmed"] is True
    assert receipt.data["descendants_killed"] >= 1
    # Only this run's processes count (their HOME is under its session dir): another run of the same
    # sample on this machine (a person in tmux, a parallel job) must not fail the test.
    left = [
        pid
        for pid in subprocess.run(
            ["pgrep", "-f", "sleep 1000"], capture_output=True, text=True
        ).stdout.split()
        if results["timeout"].run_id in _environ(pid)
    ]
    assert left == []


def _environ(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def test_model_faults_recorded_classified_and_acted_on(batch):
    _, _, results = batch
    flaky = results["model-flaky-429"]
    calls = [
        json.loads(line) for line in (Path(flaky.run_dir) / RunFiles.MODEL_CALLS).read_text().splitlines()
    ]
    assert [c["status"] for c in calls if c["kind"] == "agent"][:2] == [429, 200]
    broken = results["model-flaky-500"]
    assert broken.attempt == 2 and len(broken.previous_attempts) == 1  # retried once, then exhausted
    first = [e for e in RunDirReader(Path(broken.previous_attempts[0])).events() if e.type == "failure"][0]
    assert (first.failure.kind, first.failure.http_status, first.decision.action) == (
        "model_server_error",
        500,
        "retry",
    )
    last = [e for e in _events(broken) if e.type == "failure"][0]
    assert last.decision.action == "mark_evaluation_error" and last.decision.retries_exhausted
    assert last.decision.failure_class == "evaluation"


def test_compactions_counted_and_agree_with_transcript(batch):
    _, _, results = batch
    r = results["long-context"]
    events = _events(r)
    stats = [e for e in events if e.type == "transcript"][0]
    live = max(e.count for e in events if e.type == "compaction")
    assert stats.compactions >= 2
    assert live == stats.compactions == r.compactions


def test_outcome_event_is_last_and_names_the_failure(batch):
    _, _, results = batch
    for r in results.values():
        events = _events(r)
        assert isinstance(events[-1], OutcomeDecided)
        assert events[-1].failure_kind == r.failure_kind


def test_batch_lines_carry_the_recorded_token_totals(batch):
    """Tokens come from what the proxy recorded, on failed runs too; unknown would be null, never 0."""
    _, _, results = batch
    for r in results.values():
        usage = [
            json.loads(line)["usage"] or {}
            for line in (Path(r.run_dir) / RunFiles.MODEL_CALLS).read_text().splitlines()
        ]
        known_in = [u["tokens_in"] for u in usage if u.get("tokens_in") is not None]
        known_out = [u["tokens_out"] for u in usage if u.get("tokens_out") is not None]
        assert r.tokens_in == (sum(known_in) if known_in else None), r.task_id
        assert r.tokens_out == (sum(known_out) if known_out else None), r.task_id
    for name in ("oom", "model-flaky-500"):
        assert results[name].tokens_in and results[name].tokens_out, name


def test_every_diagnostics_file_is_within_its_cap(batch):
    _, _, results = batch
    for r in results.values():
        for d in [r.run_dir, *r.previous_attempts]:
            assert len((Path(d) / RunFiles.DIAGNOSTICS).read_text()) <= 16_000, d
