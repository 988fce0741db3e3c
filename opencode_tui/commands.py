"""Sub-command handlers (kept apart from argument parsing so each stays small)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from core.exit_codes import ExitCode

THEME_ENV = "OPENCODE_TUI_THEME"


def cmd_export(args: argparse.Namespace) -> int:
    from opencode_tui.export_command import cmd_export as export

    return export(args)


def cmd_samples(args: argparse.Namespace) -> int:
    from opencode_tui.samples_command import cmd_samples as samples

    return samples(args)


def cmd_report(args: argparse.Namespace) -> int:
    from opencode_tui.report.command import cmd_report as report

    return report(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from opencode_tui.serve_command import cmd_serve as serve

    return serve(args)


def cmd_run(args: argparse.Namespace) -> int:
    from opencode_tui.run_command import cmd_run as run

    return run(args)


def _theme() -> str | None:
    """The theme for `open`/`runs` (``OPENCODE_TUI_THEME``), checked before the app starts."""
    from opencode_tui.themes import DEFAULT_THEME, ThemeError, load_themes

    name = os.environ.get(THEME_ENV) or DEFAULT_THEME
    try:
        names = list(load_themes())
    except ThemeError as exc:
        print(f"opencode-tui: {exc}", file=sys.stderr)
        return None
    if name not in names:
        print(
            f"opencode-tui: unknown theme {name!r} in {THEME_ENV}; available: {', '.join(names)}",
            file=sys.stderr,
        )
        return None
    return name


def cmd_open(args: argparse.Namespace) -> int:
    from core.artifacts import RunDirReader

    path = Path(args.run_dir)
    try:
        RunDirReader(path)
    except FileNotFoundError as exc:
        print(f"opencode-tui open: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    theme = _theme()
    if theme is None:
        return ExitCode.USAGE
    from opencode_tui.app import OpenCodeTUI

    OpenCodeTUI(run_dir=path, theme=theme).run()
    return ExitCode.OK


def cmd_runs(args: argparse.Namespace) -> int:
    from opencode_tui.feeds import run_rows, run_summary

    runs_dir = Path(args.runs_dir)
    if not runs_dir.is_dir():
        print(
            f"opencode-tui runs: {runs_dir} is not a directory (run an episode first, or pass --runs-dir)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    if args.json:
        for path, info in run_rows(runs_dir):
            print(json.dumps(run_summary(path, info)))
        return ExitCode.OK
    theme = _theme()
    if theme is None:
        return ExitCode.USAGE
    from opencode_tui.app import OpenCodeTUI

    app = OpenCodeTUI(runs_dir=runs_dir, theme=theme)
    app.run()
    if app.rerun_request is not None and not (app.read_only or app.served):  # `r`: run it again, live
        from opencode_tui.run_command import rerun

        return rerun(app.rerun_request)
    return ExitCode.OK


def cmd_diff(args: argparse.Namespace) -> int:
    from core.artifacts import RunDirReader
    from core.diff import diff_runs

    run_a, run_b = Path(args.run_a), Path(args.run_b)
    try:
        if args.json:
            print(diff_runs(run_a, run_b).model_dump_json())
            return ExitCode.OK
        RunDirReader(run_a), RunDirReader(run_b)  # not a run directory: said here, before any screen
    except FileNotFoundError as exc:
        print(f"opencode-tui diff: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    theme = _theme()
    if theme is None:
        return ExitCode.USAGE
    from opencode_tui.app import OpenCodeTUI

    # The TUI shows at once; the diff screen reads the two runs in a worker thread.
    OpenCodeTUI(diff=(run_a, run_b), theme=theme).run()
    return ExitCode.OK


def cmd_sweep(args: argparse.Namespace) -> int:
    from opencode_tui.keep_commands import cmd_sweep as sweep

    return sweep(args)


def cmd_attach(args: argparse.Namespace) -> int:
    from opencode_tui.keep_commands import cmd_attach as attach

    return attach(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    from opencode_tui.admin_commands import cmd_doctor as doctor

    return doctor(args)
