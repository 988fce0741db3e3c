"""`opencode-tui open` and `opencode-tui runs`: argument handling around the app."""

from __future__ import annotations

import argparse
import json

from opencode_tui import commands
from opencode_tui.app import OpenCodeTUI
from opencode_tui.cli import main


def test_open_on_a_non_run_directory_is_a_one_line_usage_error(tmp_path, capsys):
    assert main(["open", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a run directory" in err


def test_open_runs_the_app_on_the_run_dir(fixture_runs, monkeypatch):
    started: list[OpenCodeTUI] = []
    monkeypatch.setattr(OpenCodeTUI, "run", lambda self, *a, **k: started.append(self))
    monkeypatch.delenv(commands.THEME_ENV, raising=False)
    assert main(["open", str(fixture_runs / "oom")]) == 0
    assert started and started[0].run_dir == fixture_runs / "oom" and started[0].control is None


def test_runs_json_prints_one_line_per_run(fixture_runs, capsys):
    assert main(["runs", "--runs-dir", str(fixture_runs), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_id = {r["run_id"]: r for r in lines}
    assert by_id["oom"]["outcome"] == "count_as_zero"
    assert by_id["oom"]["failure_kind"] == "provider_oom_killed"
    assert by_id["oom"]["failure_class"] == "model"
    assert by_id["hello-file"]["outcome"] == "scored" and by_id["hello-file"]["reward"] == 1.0
    assert [r["run_id"] for r in lines] == ["oom", "hello-file"]  # newest start first


def test_runs_browser_and_missing_runs_dir(fixture_runs, tmp_path, monkeypatch, capsys):
    started: list[OpenCodeTUI] = []
    monkeypatch.setattr(OpenCodeTUI, "run", lambda self, *a, **k: started.append(self))
    assert commands.cmd_runs(argparse.Namespace(runs_dir=str(fixture_runs), json=False)) == 0
    assert started[0].runs_dir == fixture_runs
    assert main(["runs", "--runs-dir", str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
