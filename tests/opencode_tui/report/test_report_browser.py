"""`opencode-tui report` of the recorded oom run, opened in a real headless chromium with networking off."""

from __future__ import annotations

import json
from pathlib import Path

from opencode_tui.cli import main


def test_oom_report_opens_offline_and_shows_failure_cleanup_and_calls(
    fixture_runs: Path, tmp_path: Path, chromium_browser, capsys
) -> None:
    out = tmp_path / "oom.html"
    assert main(["report", str(fixture_runs / "oom"), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    run = json.loads((fixture_runs / "oom" / "run.json").read_text())
    calls = [
        json.loads(line) for line in (fixture_runs / "oom" / "model_calls.jsonl").read_text().splitlines()
    ]

    context = chromium_browser.new_context(offline=True)
    requests: list[str] = []
    context.on("request", lambda req: requests.append(req.url))
    page = context.new_page()
    page.goto(out.as_uri())
    try:
        assert page.title() == f"Run {run['run_id']}"
        outcome = page.locator("#outcome").inner_text()
        assert run["outcome"]["failure_kind"] == "provider_oom_killed"
        assert "provider_oom_killed" in outcome and run["outcome"]["action"] in outcome
        failure = page.locator("#failures details.failure").first.inner_text()
        assert "docker.events" in failure and "decided by" in failure  # the evidence and the rule
        cleanup = page.locator("#cleanup").inner_text()
        for label in ("Cleanup receipt", "Descendants drained", "Transcript snapshot", "Sandbox released"):
            assert label in cleanup
        assert "destroyed" in cleanup
        # one expandable row per recorded call, closed at first
        rows = page.locator("details.call")
        assert rows.count() == len(calls)
        second = rows.nth(1)
        assert calls[1]["call_id"] in second.locator(":scope > summary").inner_text()
        request = second.get_by_text("Request (conversation)")
        assert not request.is_visible()
        second.locator(":scope > summary").click()  # expanding a call shows its conversation and answer
        assert request.is_visible()
        assert second.get_by_text("Problem statement").first.is_visible()
        assert second.get_by_text("Response (assembled)").is_visible()
        # expand all / collapse all (the page's own script)
        page.locator("#collapse-all").click()
        assert not request.is_visible()
        page.locator("#expand-all").click()
        assert request.is_visible()
        assert "The allocation was killed" in page.locator("#terminal pre.term").inner_text()
        assert requests == [out.as_uri()]  # nothing but the file itself was asked for
    finally:
        context.close()
