"""``opencode-tui ctl`` from a second process against a live ``opencode-tui run --batch --break`` (real
OpenCode, the scripted model, the local bubblewrap sandbox): both are real subprocesses of this test.
Bad input is one line and exit 2 (unknown or ended runs, a bad --break) or a refusal and exit 1 (say
when not held), nothing changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "opencode_tui.cli"]
SAID = "A note from the person at the keyboard: ORCA-42."


def _cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bad_break_is_one_line_and_exit_2(tmp_path):
    r = _cli("run", "fix-bug", "--batch", "--break", "call:0", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "call:N with N >= 1" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_ctl_on_an_unknown_run_is_one_line_and_exit_2(tmp_path):
    r = _cli("ctl", "no-such-run", "status", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no run 'no-such-run'" in r.stderr
    (tmp_path / "ended").mkdir()
    r = _cli("ctl", str(tmp_path / "ended"), "say", "hello", cwd=tmp_path)
    assert r.returncode == 2 and "not a live run" in r.stderr


def test_ctl_edit_takes_a_reply_or_none_never_both(tmp_path):
    ended = tmp_path / "ended"
    ended.mkdir()
    (tmp_path / "reply.json").write_text('{"text": "edited"}')
    both = _cli("ctl", str(ended), "edit", "text", "--file", str(tmp_path / "reply.json"), cwd=tmp_path)
    assert both.returncode == 2 and both.stderr.count("\n") == 1 and "not both" in both.stderr
    (tmp_path / "bad.json").write_text('{"tool_calls": [{"arguments": {}}]}')
    bad = _cli("ctl", str(ended), "edit", "--file", str(tmp_path / "bad.json"), cwd=tmp_path)
    assert bad.returncode == 2 and "tool_calls.0.name" in bad.stderr
    for args in (["edit"], ["edit", "new reply"]):  # well formed: then the run must be live
        r = _cli("ctl", str(ended), *args, cwd=tmp_path)
        assert r.returncode == 2 and "not a live run" in r.stderr


@pytest.mark.slow
@pytest.mark.bwrap
def test_ctl_from_a_second_process_against_a_live_batch_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    batch = subprocess.Popen(
        [*CLI, "run", "fix-bug", "--batch", "--provider", "local", "--break", "call:2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        runs = tmp_path / "runs"
        deadline = time.monotonic() + 120
        run_id = None
        refused = None
        while time.monotonic() < deadline:
            found = sorted(runs.glob("*/control.sock")) if runs.exists() else []
            if found:
                run_id = found[0].parent.name
                status = _cli("ctl", run_id, "status", "--json", cwd=tmp_path)
                assert status.returncode == 0, status.stderr
                if json.loads(status.stdout)["status"]["held"] is not None:
                    break
                if refused is None:  # not held yet: a say changes nothing
                    refused = _cli("ctl", run_id, "say", "too early", cwd=tmp_path)
            time.sleep(0.3)
        else:
            pytest.fail("the run never held its second call")
        held = json.loads(status.stdout)["status"]["held"]
        assert held["call_number"] == 2
        said = _cli("ctl", run_id, "say", SAID, cwd=tmp_path)
        assert said.returncode == 0, said.stderr
        stepped = _cli("ctl", run_id, "step", cwd=tmp_path)  # forward, hold the next call
        assert stepped.returncode == 0 and "released" in stepped.stdout
        while time.monotonic() < deadline:
            status = _cli("ctl", run_id, "status", "--json", cwd=tmp_path)
            now = json.loads(status.stdout)["status"]["held"]
            if now is not None and now["call_number"] == 3:
                break
            time.sleep(0.3)
        else:
            pytest.fail("step did not hold the next call")
        assert _cli("ctl", run_id, "continue", cwd=tmp_path).returncode == 0
        out, err = batch.communicate(timeout=180)
    finally:
        if batch.poll() is None:
            batch.terminate()
            batch.wait(60)
    result = json.loads(out.splitlines()[0])
    assert result["human_intervened"] and result["interventions"] == 5, err  # break say step break continue
    assert result["cleanup_confirmed"] is True
    if refused is not None:
        assert refused.returncode == 1 and "not held" in refused.stdout
    calls = [json.loads(x) for x in (runs / run_id / "model_calls.jsonl").read_text().splitlines()]
    assert any(SAID in json.dumps(c["request_body"]) for c in calls)
    ended = _cli("ctl", run_id, "status", cwd=tmp_path)
    assert ended.returncode == 2 and "not a live run" in ended.stderr
