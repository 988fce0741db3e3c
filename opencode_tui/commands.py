"""Sub-command handlers (kept apart from argument parsing so each stays small)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from opencode_tui_core.exit_codes import ExitCode

THEME_ENV = "OPENCODE_TUI_THEME"


def on_terminal() -> bool:
    """Both ends are a terminal, or a browser (``serve``: textual-serve runs the app with Textual's web
    driver over pipes): only then may a command start the full-screen app (else it would draw into a
    file or wait forever for keys a script never sends)."""
    if os.environ.get("TEXTUAL_DRIVER", "").endswith(":WebDriver"):
        return True
    return sys.stdin.isatty() and sys.stdout.isatty()


def _needs_terminal(command: str, instead: str, needs: str = "stdin and stdout") -> int:
    """One line saying why ``command`` did not start, and what to run instead; exit 2."""
    print(f"opencode-tui {command}: needs a terminal ({needs}); {instead}", file=sys.stderr)
    return ExitCode.USAGE


def _print_lines(lines: list[str]) -> None:
    sys.stdout.write("".join(f"{line}\n" for line in lines))


def cmd_export(args: argparse.Namespace) -> int:
    from opencode_tui.export_command import cmd_export as export

    return export(args)


def cmd_samples(args: argparse.Namespace) -> int:
    from opencode_tui.samples_command import cmd_samples as samples

    return samples(args)


def cmd_gym_root(args: argparse.Namespace) -> int:
    from opencode_tui_core.gym import GYM_ROOT

    print(GYM_ROOT)
    return ExitCode.OK


def cmd_report(args: argparse.Namespace) -> int:
    from opencode_tui.report.command import cmd_report as report

    return report(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from opencode_tui.serve_command import cmd_serve as serve

    return serve(args)


def cmd_ctl(args: argparse.Namespace) -> int:
    from opencode_tui.ctl_command import cmd_ctl as ctl

    return ctl(args)


def cmd_run(args: argparse.Namespace) -> int:
    from opencode_tui import run_command

    if not args.batch and not on_terminal():
        try:  # bad input is said as such first (what is wrong with it matters more than the terminal)
            run_command.admit(args)
        except run_command.api.RunRefused as exc:
            print(f"opencode-tui run: {exc}", file=sys.stderr)
            return exc.exit_code
        return _needs_terminal("run", "add --batch for JSON lines on stdout and progress on stderr")
    return run_command.cmd_run(args)


def cmd_rerun(args: argparse.Namespace) -> int:
    from opencode_tui.lineage_command import cmd_lineage

    return cmd_lineage(args, terminal=on_terminal())


def cmd_fork(args: argparse.Namespace) -> int:
    from opencode_tui.lineage_command import cmd_lineage

    return cmd_lineage(args, terminal=on_terminal())


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
    from opencode_tui_core.artifacts import RunDirReader

    path = Path(args.run_dir)
    try:
        RunDirReader(path)
    except FileNotFoundError as exc:
        print(f"opencode-tui open: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    theme = _theme()
    if theme is None:
        return ExitCode.USAGE
    if not on_terminal():
        return _needs_terminal(
            "open", f"for text, `opencode-tui export {path} --format messages -o -` or `opencode-tui runs`"
        )
    from opencode_tui.app import OpenCodeTUI

    app = OpenCodeTUI(run_dir=path, theme=theme)
    app.run()
    if app.lineage_request is not None:  # `R` / `F`: the rerun or fork, live
        return _lineage_request(app.lineage_request)[0]
    return ExitCode.OK


def _lineage_request(request: Any, *, from_browser: bool = False) -> tuple[int, Any]:
    """Run a replay's ``R``/``F`` request live: (exit code, result or None); a request that cannot
    start is one line on stderr (exit 2)."""
    from opencode_tui.lineage_command import lineage_in_tui

    try:
        return lineage_in_tui(request, from_browser=from_browser)
    except ValueError as exc:
        print(f"opencode-tui {request.lineage}: {exc}", file=sys.stderr)
        return ExitCode.USAGE, None


def cmd_runs(args: argparse.Namespace) -> int:
    from opencode_tui.feeds import run_rows, run_summary

    runs_dir = Path(args.runs_dir)
    if not runs_dir.is_dir():
        print(
            f"opencode-tui runs: {runs_dir} is not a directory (run an episode first, or pass --runs-dir)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    if getattr(args, "batch", None):
        return _batch_groups(runs_dir, args.batch, as_json=args.json)
    if args.json:
        for path, info in run_rows(runs_dir):
            print(json.dumps(run_summary(path, info)))
        return ExitCode.OK
    if not on_terminal():  # a pipe or a file: the browser's table as text
        from opencode_tui.plain_text import runs_table

        _print_lines(runs_table(run_summary(path, info) for path, info in run_rows(runs_dir)))
        return ExitCode.OK
    theme = _theme()
    if theme is None:
        return ExitCode.USAGE
    from opencode_tui import read_only
    from opencode_tui.app import OpenCodeTUI

    if read_only.served() and not read_only.enabled():
        # A served session re-runs inside this app: each re-run that ends by itself has a sandbox
        # prepared for the next (issue 31), released on every way out of the session.
        from opencode_tui.warm_run import run_app
        from opencode_tui_core.episode.warm_next import WarmNext

        run_app(OpenCodeTUI(runs_dir=runs_dir, theme=theme, warm=WarmNext()))
        return ExitCode.OK
    app = OpenCodeTUI(runs_dir=runs_dir, theme=theme)
    app.run()
    # `r`: the run again, live (one episode per app, like `run`); then back to the browser, the two runs
    # marked against each other; until the browser is quit, or the run was interrupted (Ctrl-C, a signal).
    while (app.rerun_request or app.lineage_request) is not None and not (app.read_only or app.served):
        from opencode_tui.run_command import AdmissionError, ConfigError, rerun_in_tui
        from opencode_tui_core.control import CANCELLED_BY_USER

        lineage = app.lineage_request  # a replay's `R` / `F` (issue 28)
        original = lineage.run_dir if lineage is not None else app.rerun_request
        assert original is not None
        notice, new = None, None
        try:
            if lineage is not None:
                from opencode_tui.lineage_command import lineage_in_tui

                try:
                    code, result = lineage_in_tui(lineage, from_browser=True)
                except ValueError as exc:  # said in the browser it returns to
                    raise AdmissionError(str(exc)) from None
            else:
                code, result = rerun_in_tui(original, from_browser=True)
        except (AdmissionError, ConfigError) as exc:
            verb = {"rerun": "rerun", "fork": "forked"}[lineage.lineage] if lineage is not None else "re-run"
            notice = f"{original.name} cannot be {verb}: {exc}"
            print(f"opencode-tui runs: {exc}", file=sys.stderr)
        else:
            if result is not None and result.cancelled_by not in (None, CANCELLED_BY_USER):
                return code  # Ctrl-C or a signal: leave, as from any run
            new = Path(result.run_dir) if result is not None else None
            what = lineage.lineage.capitalize() if lineage is not None else "Re-run"
            notice = (
                f"{what}: {result.summary}" if result is not None else f"The {what.lower()} did not finish."
            )
        app = OpenCodeTUI(runs_dir=runs_dir, theme=theme, rerun_of=(original, new), notice=notice)
        app.run()
    return ExitCode.OK


def _batch_groups(runs_dir: Path, batch_id: str, *, as_json: bool) -> int:
    """``runs --batch ID``: the batch's results (results.jsonl) with its failures grouped."""
    from opencode_tui_core.failure_groups import group_failures
    from opencode_tui_core.resume import RESULTS_FILE, load_batch

    results = load_batch(runs_dir, batch_id)
    if not results:
        print(
            f"opencode-tui runs: no result of batch {batch_id} in {runs_dir / RESULTS_FILE} (the id is on "
            "the stderr line `opencode-tui: batch ID` of run --batch; pass its --runs-dir)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    groups = group_failures(results)
    scored = sum(1 for r in results if r.scored)
    failed = sum(1 for r in results if not r.scored and r.started)
    with_failure = sum(g.count for g in groups)
    if as_json:
        doc = {
            "batch_id": batch_id,
            "total": len(results),
            "scored": scored,
            "failed": failed,
            "with_failure": with_failure,  # scored as zero (an oom) included: what the groups hold
            "groups": [g.model_dump(mode="json") for g in groups],
        }
        print(json.dumps(doc))
        return ExitCode.OK
    lines = [
        f"batch {batch_id}: {len(results)} episodes, {scored} scored, {failed} failed; "
        f"failures in {with_failure}, grouped:"
    ]
    for g in groups:
        lines.append(f"  {g.words()}")
        lines.extend(f"    {t}  {r or '(not started)'}" for t, r in zip(g.task_ids, g.run_ids, strict=True))
    _print_lines(lines)
    return ExitCode.OK


def cmd_diff(args: argparse.Namespace) -> int:
    from opencode_tui_core.artifacts import RunDirReader
    from opencode_tui_core.diff import diff_runs

    run_a, run_b = Path(args.run_a), Path(args.run_b)
    try:
        if args.json:
            print(diff_runs(run_a, run_b).model_dump_json())
            return ExitCode.OK
        if not on_terminal():  # a pipe or a file: the comparison as text
            from opencode_tui.plain_text import diff_lines

            _print_lines(diff_lines(diff_runs(run_a, run_b)))
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


def _stdin_streams() -> bool:
    """stdin is a terminal, a pipe or a socket: what ``attach`` can relay to the sandbox's shell
    (``echo 'ls' | opencode-tui attach RUN_DIR`` works; a file or /dev/null cannot be waited on)."""
    mode = os.fstat(sys.stdin.fileno()).st_mode
    return sys.stdin.isatty() or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def cmd_attach(args: argparse.Namespace) -> int:
    from opencode_tui import keep_commands

    if not _stdin_streams():
        try:  # an unknown or released target is said as such first (the process ends right after)
            provider, sandbox_id, run, _ = keep_commands._target(args.target)
            asyncio.run(keep_commands._connect(provider, sandbox_id, run))
        except keep_commands.UsageError as exc:
            print(f"opencode-tui attach: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        return _needs_terminal(
            "attach", "run it in a terminal, or pipe commands in: `echo ls | opencode-tui attach …`", "stdin"
        )
    return keep_commands.cmd_attach(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    from opencode_tui.admin_commands import cmd_doctor as doctor

    return doctor(args)
