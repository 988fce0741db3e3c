"""``opencode-tui report RUN_DIR [-o FILE]`` and ``report RUNS_DIR --batch ID [-o FILE]``.

Writes one self-contained HTML file (default: ``RUN_DIR/report.html``; for a batch
``RUNS_DIR/report-<ID>.html``) and prints its path. Bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from opencode_tui_core.exit_codes import ExitCode

REPORT_FILE = "report.html"


def _target(args: argparse.Namespace, source: Path) -> Path:
    if args.output:
        return Path(args.output)
    if args.batch:
        return source / f"report-{args.batch}.html"
    return source / REPORT_FILE


def _writable(target: Path) -> str | None:
    """Why ``target`` cannot be written, checked before any work (None: it can)."""
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        return f"{target} is a directory; name a file with -o"
    if not parent.is_dir():
        return f"{parent} does not exist; create it or name another file with -o"
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{target} cannot be written (permission denied); name another file with -o"
    return None


def cmd_report(args: argparse.Namespace) -> int:
    from opencode_tui.report.collect import ReportInputError

    source = Path(args.path)
    if not source.exists():
        print(
            f"opencode-tui report: {source} does not exist (list run directories with `opencode-tui runs`)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    target = _target(args, source)
    problem = _writable(target)
    if problem is not None:
        print(f"opencode-tui report: {problem}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        if args.batch:
            from opencode_tui.report.batch import batch_page

            text = batch_page(source, args.batch)
        else:
            from opencode_tui.report.collect import collect
            from opencode_tui.report.page import run_page

            text = run_page(collect(source))
    except ReportInputError as exc:
        print(f"opencode-tui report: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        print(f"opencode-tui report: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
        return ExitCode.USAGE
    print(target)
    return ExitCode.OK
