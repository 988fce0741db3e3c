"""ATIF for older readers (core/export/atif_versions.py): ``export --atif-version 1.7`` writes the same
trajectory as ATIF-v1.7 beside the run directory's newest ``trajectory.json``, validated against the
v1.7 JSON Schema (tests/schemas/, derived from the v1.8 one by what v1.8 added), and says what it had
to drop. The recorded run directories are real episodes (tests/fixtures/runs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from opencode_tui.cli import main as cli
from opencode_tui_core.export.atif import TRAJECTORY_FILE, build_trajectory
from opencode_tui_core.export.atif_versions import for_version, versioned_file

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_RUNS = ROOT / "tests" / "fixtures" / "runs"
SCHEMAS = {
    v: json.loads((ROOT / "tests" / "schemas" / f"atif-v{v}.schema.json").read_text()) for v in ("1.7", "1.8")
}


def valid(doc: dict, version: str) -> bool:
    validator = jsonschema.Draft202012Validator(SCHEMAS[version], format_checker=jsonschema.FormatChecker())
    return validator.is_valid(doc)


def test_the_v17_schema_is_a_schema_for_its_version():
    jsonschema.Draft202012Validator.check_schema(SCHEMAS["1.7"])
    assert SCHEMAS["1.7"]["x-spec-version"] == "ATIF-v1.7"


@pytest.mark.parametrize("name", ["hello-file", "oom"])
def test_export_writes_v17_beside_the_newest_and_says_nothing_was_dropped(tmp_path, capsys, name):
    run = tmp_path / name
    shutil.copytree(FIXTURE_RUNS / name, run)
    assert cli(["export", str(run)]) == 0
    newest = (run / TRAJECTORY_FILE).read_text()
    capsys.readouterr()
    assert cli(["export", str(run), "--atif-version", "1.7"]) == 0
    out, err = capsys.readouterr()
    older = run / versioned_file("1.7")
    assert out.strip() == str(older)
    assert f"{run}: ATIF-v1.7: dropped nothing (the content fits)" in err
    assert (run / TRAJECTORY_FILE).read_text() == newest  # the run directory's file stays the newest
    doc = json.loads(older.read_text())
    assert doc["schema_version"] == "ATIF-v1.7" and valid(doc, "1.7") and not valid(doc, "1.8")
    assert doc["extra"]["atif_downgrade"] == {"from": "ATIF-v1.8", "dropped": []}
    same = json.loads(newest)
    assert doc["steps"] == same["steps"] and doc["final_metrics"] == same["final_metrics"]
    # to stdout, too
    assert cli(["export", str(run), "--atif-version", "1.7", "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["schema_version"] == "ATIF-v1.7"


def test_what_v17_cannot_hold_is_dropped_and_named_embedded_subagents_included():
    """An audio part (added in v1.8) in a message and in a subagent's tool result: dropped, each named,
    and the copy validates as v1.7 (which would reject the audio part)."""
    doc = json.loads(build_trajectory(FIXTURE_RUNS / "hello-file").to_json())
    audio = {"type": "audio", "source": {"media_type": "audio/wav", "path": "a.wav", "duration_sec": 1.5}}
    doc["steps"][0]["message"] = [{"type": "text", "text": "listen"}, audio]
    child = json.loads(json.dumps(doc))
    child["trajectory_id"] = "child-1"
    child.pop("subagent_trajectories", None)
    calls = [s for s in child["steps"] if s.get("observation")]
    calls[0]["observation"]["results"][0]["content"] = [audio]
    doc["subagent_trajectories"] = [child]
    assert valid(doc, "1.8")

    older, dropped = for_version(doc, "1.7")
    i = next(n for n, s in enumerate(child["steps"]) if s is calls[0])
    assert dropped == [
        "steps[0].message: an audio part",
        "subagent_trajectories[0].steps[0].message: an audio part",
        f"subagent_trajectories[0].steps[{i}].observation.results[0].content: an audio part",
    ]
    assert older["steps"][0]["message"] == [{"type": "text", "text": "listen"}]
    assert older["subagent_trajectories"][0]["schema_version"] == "ATIF-v1.7"
    assert older["subagent_trajectories"][0]["steps"][i]["observation"]["results"][0]["content"] is None
    assert valid(older, "1.7")
    again = json.loads(json.dumps(older))
    again["steps"][0]["message"].append(audio)
    assert not valid(again, "1.7"), "the v1.7 schema does not refuse an audio part"
    assert doc["schema_version"] == "ATIF-v1.8"  # the newest document is not changed
    with pytest.raises(ValueError, match=r"1\.6"):
        for_version(doc, "1.6")
