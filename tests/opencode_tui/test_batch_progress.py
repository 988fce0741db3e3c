"""What ``run --batch`` says on stderr while it runs: a line when each attempt starts, retries (with
the reason) and ends, and a last line that says how many failed and why. A real batch (local provider,
real OpenCode, the scripted model; model-flaky-500's server answers 500 until the policy retries)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opencode_tui_core.batch import BatchSummary
from opencode_tui_core.episode import EpisodeResult
from opencode_tui_core.failures import Outcome

CLI = (sys.executable, "-m", "opencode_tui.cli")


def _result(task_id: str, action: Outcome, kind: str | None = None, started: bool = True) -> EpisodeResult:
    return EpisodeResult(
        run_id=f"{task_id}-a1", task_id=task_id, attempt=1, provider="local", action=action,
        failure_kind=kind, run_dir=f"runs/{task_id}-a1", started=started,
    )  # fmt: skip


def test_the_summary_line_says_how_many_failed_and_why() -> None:
    results = [
        _result("a", Outcome.SCORED),
        _result("b", Outcome.COUNT_AS_ZERO, "provider_oom_killed"),
        _result("c", Outcome.MARK_EVALUATION_ERROR, "model_server_error"),
        _result("d", Outcome.MARK_EVALUATION_ERROR, "model_server_error"),
        _result("e", Outcome.STOP, started=False),
    ]
    summary = BatchSummary(total=6, scored=2, results=results, cancelled_by="SIGINT")
    assert summary.line() == (
        "2 of 6 scored (1 as zero: provider_oom_killed x1); 2 failed: model_server_error x2; "
        "2 not run (cancelled by SIGINT)"
    )
    assert BatchSummary(total=1, scored=1, results=results[:1]).line() == "1 of 1 scored"


@pytest.mark.slow
@pytest.mark.bwrap
def test_a_batch_says_when_attempts_start_retry_and_end(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            *CLI,
            "run",
            "hello-file",
            "model-flaky-500",
            "--batch",
            *("--provider", "local", "--attempts", "2"),
            "--runs-dir",
            str(tmp_path / "runs"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    err = r.stderr.splitlines()
    assert r.returncode == 3, r.stderr
    assert len([json.loads(line) for line in r.stdout.splitlines()]) == 2  # stdout: the data only
    said = [line.split(" as ")[0] for line in err]
    assert "hello-file a1: started" in said and "model-flaky-500 a1: started" in said
    assert "hello-file a1: ended: scored, reward 1" in said
    assert "model-flaky-500 a1: ended: retry (model_server_error)" in said
    assert "model-flaky-500 a2: retrying after model_server_error in a1," in said
    assert "model-flaky-500 a2: ended: mark_evaluation_error (model_server_error)" in said
    # each attempt starts before it ends, and the retry after the first attempt ended
    assert said.index("model-flaky-500 a1: ended: retry (model_server_error)") < said.index(
        "model-flaky-500 a2: retrying after model_server_error in a1,"
    )
    assert (
        err[-1]
        == "opencode-tui: 1 of 2 scored; 1 failed: model_server_error x1; health warnings: retry_storm x1; "
        # the warm pool (on by default): the second task's sandbox was prepared while the first ran
        "warm sandboxes: 1 prepared, 1 used, 0 discarded"
    )


def test_the_batch_line_counts_the_debuggers_interventions() -> None:
    """A run a person acted on says so on its batch line, answered and edited replies counted."""
    import io

    from opencode_tui.batch_progress import BatchProgress

    plain = _result("a", Outcome.SCORED)
    acted = _result("b", Outcome.MARK_EVALUATION_ERROR, "human_intervened").model_copy(
        update={"interventions": 7, "model_calls_answered": 1, "model_calls_edited": 2, "summary": "s"}
    )
    out = io.StringIO()
    progress = BatchProgress(2, out)
    progress.finished(plain)
    progress.finished(acted)
    lines = out.getvalue().splitlines()
    assert "debugger" not in lines[0]
    assert lines[1].endswith("(debugger: 7 interventions, 1 answered by hand, 2 edited by hand)")


def test_the_plain_runs_list_counts_interventions() -> None:
    from opencode_tui.plain_text import RUNS_HEADER, run_cells

    row = {"run_id": "r", "started_at": "2026-01-01T00:00:00+00:00", "human_intervened": True}
    human = RUNS_HEADER.index("human")
    assert run_cells({**row, "interventions": 3})[human] == "yes (3 debugger)"
    assert run_cells(row)[human] == "yes"
    assert run_cells({**row, "human_intervened": False, "interventions": 2})[human] == "no (2 debugger)"
    assert run_cells({**row, "human_intervened": False})[human] == ""
