"""Report benchmark: `opencode-tui report` on a run directory of 1,000,000 events, and the page in chromium.

    python benchmarks/report.py            # 1,000,000 events (and as many terminal.cast lines)
    python benchmarks/report.py --quick    # 100,000 events (CI: seconds)

The run directory is benchmarks/tui.py's (``write_run``: the real writer for the first events, then
terminal output lines), plus a terminal.cast holding the same output, one frame per line.

Reported, all measured in this run on this machine:
- the report's size, against the run directory's (events.jsonl + terminal.cast): what is embedded is
  capped, so this ratio falls as the run grows;
- the time to write the report, against reading the run directory's files once (the floor for anything
  that reads them);
- the time to the page's first contentful paint in headless chromium (Debian's, through Playwright),
  against a plain HTML page of the same byte size (one <pre> of text) opened the same way.
Figures are printed, never asserted; the run exits 1 only when the report cannot be made or opened.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

CHROMIUM = "/usr/bin/chromium"


def write_cast(run_dir: Path, n_lines: int) -> None:
    with (run_dir / "terminal.cast").open("w", encoding="utf-8") as f:
        f.write(json.dumps({"version": 2, "width": 120, "height": 36, "timestamp": 1747180800}) + "\n")
        out = []
        for i in range(n_lines):
            out.append(
                json.dumps(
                    [i / 1000, "o", f"\x1b[3{i % 8}m{i:>7}\x1b[0m building module {i % 97} ... ok\r\n"]
                )
            )
            if len(out) >= 50_000:
                f.write("\n".join(out) + "\n")
                out = []
        if out:
            f.write("\n".join(out) + "\n")


def first_paint_ms(browser, path: Path) -> float:
    # bypass_csp: the report forbids eval, which Playwright's waiting uses; the page loads all the same
    context = browser.new_context(offline=True, bypass_csp=True)
    try:
        page = context.new_page()
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_function("performance.getEntriesByName('first-contentful-paint').length > 0")
        return float(page.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime"))
    finally:
        context.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100,000 events, one repetition")
    ap.add_argument("--events", type=int, help="events in the run directory (default 1,000,000)")
    ap.add_argument("--repeat", type=int, help="page loads per page (default 3, quick 1)")
    args = ap.parse_args(argv)
    n = args.events or (100_000 if args.quick else 1_000_000)
    repeat = args.repeat or (1 if args.quick else 3)

    from playwright.sync_api import sync_playwright
    from tui import write_run

    from opencode_tui.report.collect import collect
    from opencode_tui.report.page import run_page

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = write_run(Path(tmp), n)
        write_cast(run_dir, n)
        inputs = [run_dir / "events.jsonl", run_dir / "terminal.cast"]
        run_bytes = sum(p.stat().st_size for p in inputs)

        t0 = time.perf_counter()
        for p in inputs:
            p.read_bytes()
        floor_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        text = run_page(collect(run_dir))
        report = Path(tmp) / "report.html"
        report.write_text(text, encoding="utf-8")
        report_s = time.perf_counter() - t0
        size = report.stat().st_size
        if "lines not embedded" not in text:
            print("report.py: the report did not say what it left out", file=sys.stderr)
            return 1

        # The baseline: a page of the same byte size that is nothing but text.
        filler = "plain output line with some words in it to make it a typical length\n"
        body = filler * (size // len(filler))
        plain = Path(tmp) / "plain.html"
        plain.write_text(f"<!DOCTYPE html><html><body><pre>{body}</pre></body></html>", encoding="utf-8")

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                first_paint_ms(browser, plain)  # warm the browser once
                base = [first_paint_ms(browser, plain) for _ in range(repeat)]
                ours = [first_paint_ms(browser, report) for _ in range(repeat)]
            finally:
                browser.close()

    base_ms, ours_ms = statistics.median(base), statistics.median(ours)
    print(f"report of a {n:,}-event run directory ({run_bytes / 1e6:.0f} MB events.jsonl + terminal.cast)")
    print(f"  size           {size / 1e6:.2f} MB = {size / run_bytes:.4f} x the run directory's files")
    print(
        f"  written in     {report_s:.2f} s = {report_s / floor_s:.1f} x reading those files once ({floor_s:.2f} s)"
    )
    print(
        f"  first paint    {ours_ms:.0f} ms = {ours_ms / base_ms:.2f} x a plain page of the same size "
        f"({base_ms:.0f} ms), headless chromium, median of {repeat}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
