"""`opencode-tui report` of the recorded oom run, and a batch's report, opened in a real headless chromium
with networking off."""

from __future__ import annotations

import json
from pathlib import Path

from opencode_tui.cli import main
from tests.opencode_tui.report.test_report_command import _copy


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


def test_batch_report_opens_offline_groups_failures_and_links_each_attempt_to_its_section(
    fixture_runs: Path, tmp_path: Path, chromium_browser
) -> None:
    """`report RUNS_DIR --batch ID` of the recorded runs made one batch (two oom attempts of a task, one
    scored hello-file; a run of another batch beside them): in chromium with networking off, the
    failures are grouped by what decided each task (the task's last oom attempt: one group of one,
    linking to it), each attempt is a row whose link opens that attempt's own section."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for n in (1, 2):
        _copy(fixture_runs / "oom", runs / f"oom-a{n}", run_id=f"oom-a{n}", attempt=n, batch_id="b1")
    _copy(fixture_runs / "hello-file", runs / "hello", run_id="hello", batch_id="b1")
    _copy(fixture_runs / "hello-file", runs / "elsewhere", run_id="elsewhere", batch_id="other")
    out = tmp_path / "batch.html"
    assert main(["report", str(runs), "--batch", "b1", "-o", str(out)]) == 0

    context = chromium_browser.new_context(offline=True, viewport={"width": 1200, "height": 800})
    requests: list[str] = []
    context.on("request", lambda req: requests.append(req.url))
    page = context.new_page()
    page.goto(out.as_uri())
    try:
        assert page.title() == "Batch b1"
        assert "3 attempts" in page.locator("body").inner_text()
        # the failures grouped: one group (kind × stage × evidence), counting the task once, by its
        # deciding attempt
        groups = page.locator("#groups table tr")
        assert groups.count() == 2  # the heading and one group
        cells = groups.nth(1).locator("td")
        assert [cells.nth(i).inner_text() for i in range(3)] == ["1", "provider_oom_killed", "agent"]
        assert "docker.events" in cells.nth(3).inner_text()
        group_links = cells.nth(4).locator("a")
        assert group_links.all_inner_texts() == ["oom-a2"]
        # a row per attempt, each linking to its own section (the run's id, outcome and failure there)
        rows = page.locator("#attempts table tr")
        assert rows.count() == 4
        seen = {}
        for i in range(1, 4):
            link = rows.nth(i).locator("a").first
            run_id, target = link.inner_text(), link.get_attribute("href")
            assert target is not None and target.startswith("#run-")
            seen[run_id] = rows.nth(i).inner_text()
            section = page.locator(target)
            assert section.locator("h2").first.inner_text() == f"Run {run_id}"
            link.click()  # the page jumps to the attempt's section
            assert page.url.endswith(target)
            # at the top of the window, below the sticky nav (the sections' scroll-margin-top: 40px)
            top = section.evaluate("e => e.getBoundingClientRect().top")
            assert 0 <= top <= 41, (run_id, top)
            outcome = section.locator(f"{target}-outcome").inner_text()
            if run_id.startswith("oom"):
                assert "provider_oom_killed" in outcome
            else:
                assert "scored" in outcome and "provider_oom_killed" not in outcome
        assert sorted(seen) == ["hello", "oom-a1", "oom-a2"]  # the other batch's run is not in it
        assert "provider_oom_killed" in seen["oom-a2"] and "scored" in seen["hello"]
        # the group's links lead to the same sections
        page.goto(out.as_uri())
        target = group_links.first.get_attribute("href")
        group_links.first.click()
        assert page.url.endswith(str(target))
        assert requests and all(url == out.as_uri() for url in requests)  # only the file itself
    finally:
        context.close()
