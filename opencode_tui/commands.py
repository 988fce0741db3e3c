"""Sub-command handlers (kept apart from argument parsing so each stays small)."""

from __future__ import annotations

import argparse
import sys

from opencode_tui.cli import EXIT_USAGE


def _not_yet(name: str) -> int:
    print(f"opencode-tui {name}: not available in this build yet", file=sys.stderr)
    return EXIT_USAGE


def cmd_run(args: argparse.Namespace) -> int:
    return _not_yet("run")


def cmd_open(args: argparse.Namespace) -> int:
    return _not_yet("open")


def cmd_runs(args: argparse.Namespace) -> int:
    return _not_yet("runs")


def cmd_sweep(args: argparse.Namespace) -> int:
    return _not_yet("sweep")


def cmd_doctor(args: argparse.Namespace) -> int:
    return _not_yet("doctor")
