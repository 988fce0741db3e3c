"""`opencode-tui report`: bad input, redaction, the caps on what a page embeds, the batch report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from opencode_tui.cli import main
from opencode_tui.report.collect import Limits, collect
from opencode_tui.report.page import run_page
from opencode_tui_core.artifacts import RunFiles


def _copy(src: Path, dest: Path, **run_json: object) -> Path:
    shutil.copytree(src, dest)
    if run_json:
        p = dest / RunFiles.RUN_INFO
        data = json.loads(p.read_text())
        data.update(run_json)
        p.write_text(json.dumps(data))
    return dest


def _one_line_usage(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("opencode-tui report: "), err
    for w in words:
        assert w in err, err


def test_missing_run_dir(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    _one_line_usage(capsys, "does not exist")


def test_not_a_run_dir(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    _one_line_usage(capsys, "not a run directory")


def test_run_dir_of_a_newer_format(fixture_runs: Path, tmp_path: Path, capsys) -> None:
    run = _copy(
        fixture_runs / "oom",
        tmp_path / "run",
        versions={"opencode_tui": "99.0.0"},
        a_field_of_the_future={"x": 1},
    )
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 2
    _one_line_usage(capsys, "99.0.0", "newer")
    assert not (tmp_path / "r.html").exists()


def test_unwritable_output(fixture_runs: Path, tmp_path: Path, capsys) -> None:
    assert main(["report", str(fixture_runs / "oom"), "-o", str(tmp_path / "no" / "such" / "r.html")]) == 2
    _one_line_usage(capsys, "does not exist")
    assert main(["report", str(fixture_runs / "oom"), "-o", str(tmp_path)]) == 2
    _one_line_usage(capsys, "is a directory")


def test_default_output_is_in_the_run_dir(fixture_runs: Path, tmp_path: Path, capsys) -> None:
    run = _copy(fixture_runs / "oom", tmp_path / "run")
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.html")
    assert "provider_oom_killed" in (run / "report.html").read_text()


def test_secrets_are_redacted_like_the_run_dir(fixture_runs: Path, tmp_path: Path) -> None:
    """A secret that reached a file the engine does not redact again (here: appended to the cast by hand)
    is redacted in the page."""
    run = _copy(fixture_runs / "oom", tmp_path / "run")
    secret = "sk-proj-THISISASECRETKEY1234567890"
    with (run / RunFiles.CAST).open("a") as f:
        f.write(
            json.dumps(
                [31.0, "o", f"export OPENAI_API_KEY={secret}\r\nAuthorization: Bearer abcdefghijkl\r\n"]
            )
            + "\n"
        )
    text = run_page(collect(run))
    assert secret not in text and "abcdefghijkl" not in text
    assert "[REDACTED]" in text


def test_long_runs_are_cut_and_the_page_says_so(fixture_runs: Path, tmp_path: Path) -> None:
    run = _copy(fixture_runs / "oom", tmp_path / "run")
    with (run / RunFiles.CAST).open("a") as f:
        for i in range(500):
            f.write(json.dumps([31.0 + i / 1000, "o", f"line number {i}\r\n"]) + "\n")
    report = collect(run, Limits(terminal_head=5, terminal_tail=10, detailed_calls=1, tool_calls=1))
    text = run_page(report)
    lines_total = report.terminal.total if report.terminal else 0
    assert lines_total > 500
    assert f"{lines_total - 15:,} lines not embedded" in text
    assert "line number 499" in text and "line number 200" not in text
    assert "the bodies of 3 of 4 model calls" in text and "1 more tool calls not listed" in text


def test_interventions_from_run_json_are_listed(fixture_runs: Path) -> None:
    report = collect(fixture_runs / "oom")
    assert "none (no one acted" in run_page(report)
    report.interventions = [
        {
            "ts": "2026-11-29T13:28:00Z",
            "what": "say",
            "who": "tui",
            "call_id": "mc-1",
            "text": "try smaller blocks",
        }
    ]
    text = run_page(report)
    assert "Interventions (1)" in text and "try smaller blocks" in text


def test_batch_report_groups_failures_and_links_each_attempt(
    fixture_runs: Path, tmp_path: Path, capsys
) -> None:
    """Each task grouped once, by its last attempt's deciding failure (as the batch screen and
    ``runs --batch`` group); every attempt still has its row and its section."""
    runs = tmp_path / "runs"
    runs.mkdir()
    # Task "oom": attempt 1 failed with X (another kind), attempt 2 with the oom: one oom.
    _copy(fixture_runs / "oom", runs / "oom-a1", run_id="oom-a1", attempt=1, batch_id="b1")
    p = runs / "oom-a1" / RunFiles.RUN_INFO
    data = json.loads(p.read_text())
    data["outcome"].update(failure_kind="model_server_error", failure_class="model", action="retry")
    p.write_text(json.dumps(data))
    _copy(fixture_runs / "oom", runs / "oom-a2", run_id="oom-a2", attempt=2, batch_id="b1")
    # Task "flaky": attempt 1 an oom, attempt 2 scored: in no group.
    _copy(
        fixture_runs / "oom", runs / "flaky-a1", run_id="flaky-a1", task_id="flaky", attempt=1, batch_id="b1"
    )
    _copy(
        fixture_runs / "hello-file",
        runs / "flaky-a2",
        run_id="flaky-a2",
        task_id="flaky",
        attempt=2,
        batch_id="b1",
    )
    _copy(fixture_runs / "hello-file", runs / "hello", run_id="hello", batch_id="other")
    out = tmp_path / "batch.html"
    assert main(["report", str(runs), "--batch", "b1", "-o", str(out)]) == 0
    text = out.read_text()
    assert "4 attempts" in text and "hello" not in text.split('id="run-0"')[0]
    group = text.split('id="groups"')[1].split("</table>")[0]
    assert group.count("<tr><td>") == 1, group
    assert "<td>1</td><td><b class=err>provider_oom_killed</b></td><td>agent</td>" in group
    assert "docker.events action=oom" in group  # opencode_tui_core.failure_groups' signature, as everywhere
    assert "oom-a2" in group and "oom-a1" not in group and "flaky" not in group
    assert "model_server_error" not in group
    rows = text.split('id="attempts"')[1].split("</table>")[0]
    for run_id in ("flaky-a1", "flaky-a2", "oom-a1", "oom-a2"):  # every attempt keeps its row
        assert f">{run_id}</a>" in rows
    assert "model_server_error" in rows
    assert 'id="run-3"' in text and 'id="run-3-outcome"' in text
    assert main(["report", str(runs), "--batch", "nope", "-o", str(out)]) == 2
    _one_line_usage(capsys, "no run of batch 'nope'")


def test_batch_report_groups_as_runs_batch_does(tmp_path: Path, capsys) -> None:
    """A batch's result lines (here the recorded one, without its run directories): the report's groups
    are `runs --batch --json`'s, one function over one record."""
    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "batch"
    line = (fixtures / "results.jsonl").read_text().splitlines()[0]
    batch_id = json.loads(line)["batch_id"]
    runs = tmp_path / "runs"
    shutil.copytree(fixtures, runs)
    from opencode_tui.report.batch import batch_groups

    assert main(["runs", "--runs-dir", str(runs), "--batch", batch_id, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["groups"]
    assert listed and [g.model_dump(mode="json") for g in batch_groups(runs, batch_id, [])] == listed
