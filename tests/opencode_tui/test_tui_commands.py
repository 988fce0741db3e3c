"""`opencode-tui open` and `opencode-tui runs`: argument handling around the app."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from opencode_tui import commands
from opencode_tui.app import OpenCodeTUI
from opencode_tui.cli import main
from opencode_tui_core.artifacts import RunDirReader


def test_open_on_a_non_run_directory_is_a_one_line_usage_error(tmp_path, capsys):
    assert main(["open", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a run directory" in err


def test_open_runs_the_app_on_the_run_dir(fixture_runs, monkeypatch):
    started: list[OpenCodeTUI] = []
    monkeypatch.setattr(commands, "on_terminal", lambda: True)  # the app starts only on a terminal
    monkeypatch.setattr(OpenCodeTUI, "run", lambda self, *a, **k: started.append(self))
    monkeypatch.delenv(commands.THEME_ENV, raising=False)
    assert main(["open", str(fixture_runs / "oom")]) == 0
    assert started and started[0].run_dir == fixture_runs / "oom" and started[0].control is None


def test_runs_json_prints_one_line_per_run(fixture_runs, capsys):
    assert main(["runs", "--runs-dir", str(fixture_runs), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_dir = {Path(r["run_dir"]).name: r for r in lines}
    assert set(by_dir) == {"hello-file", "oom"}
    for name, row in by_dir.items():
        info = RunDirReader(fixture_runs / name).info()
        assert row["run_id"] == info.run_id and row["task_id"] == info.task_id
        assert row["provider"] == info.provider == "docker"
        assert row["duration_s"] == info.duration_s
        assert row["started_at"] == info.started_at.isoformat()
    oom = by_dir["oom"]
    assert (oom["outcome"], oom["reward"]) == ("count_as_zero", 0.0)
    assert (oom["failure_kind"], oom["failure_stage"], oom["failure_class"]) == (
        "provider_oom_killed",
        "agent",
        "model",
    )
    hello = by_dir["hello-file"]
    assert (hello["outcome"], hello["reward"], hello["failure_kind"]) == ("scored", 1.0, None)
    assert [Path(r["run_dir"]).name for r in lines] == ["oom", "hello-file"]  # newest start first


def test_runs_browser_and_missing_runs_dir(fixture_runs, tmp_path, monkeypatch, capsys):
    started: list[OpenCodeTUI] = []
    monkeypatch.setattr(commands, "on_terminal", lambda: True)  # the app starts only on a terminal
    monkeypatch.setattr(OpenCodeTUI, "run", lambda self, *a, **k: started.append(self))
    assert commands.cmd_runs(argparse.Namespace(runs_dir=str(fixture_runs), json=False)) == 0
    assert started[0].runs_dir == fixture_runs
    assert main(["runs", "--runs-dir", str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
