"""``opencode-tui rerun RUN_DIR`` and ``fork RUN_DIR --at STEP`` (issue 28): a child run answered from
its parent's record (core/episode/lineage.py), in the live TUI on a terminal, else headless with its
result as one JSON line on stdout (``--batch`` asks for that on a terminal too).

Bad input (no such run, no record of its model calls, a step beyond the recorded ones, a task that
changed since) is one line on stderr and exit 2, before anything starts; the parent is only read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opencode_tui.lineage_child import child_episode
from opencode_tui_core.exit_codes import ExitCode

if TYPE_CHECKING:  # the engine (and pydantic) load when a command runs, not for --help (start-up)
    from opencode_tui.lineage_request import LineageRequest
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.episode import Episode, EpisodeResult


def add_parsers(sub: Any, provider_choices: Any) -> None:
    """The two sub-commands (their options are the same but for --at and --on-divergence)."""
    rr = sub.add_parser(
        "rerun", help="run a recorded episode again, every model call answered from its record"
    )
    rr.add_argument("run_dir", metavar="RUN_DIR", nargs="+", help="several with --batch: one after another")
    rr.add_argument(
        "--on-divergence",
        choices=["stop", "continue", "live"],
        default="stop",
        help="at the first request that differs from the recorded one: stop the agent (default), "
        "continue answering from the record, or go live (the recorded model configuration)",
    )
    fk = sub.add_parser(
        "fork",
        help="a new run from a recorded one's step: its first STEP model calls "
        "answered from the record (the files as they were), then the live model",
    )
    fk.add_argument("run_dir", metavar="RUN_DIR", nargs="+", help="several with --batch: one after another")
    fk.add_argument(
        "--at", type=int, required=True, metavar="STEP", help="agent model calls answered from the record"
    )
    fk.add_argument("--model-url", help="the live model after the fork point (default: the recorded one)")
    fk.add_argument("--model", help="model name at --model-url")
    fk.add_argument("--api-key-env", help="environment variable holding the model API key")
    fk.add_argument(
        "--say", metavar="TEXT", help="a user message added at the fork point (the live model sees it)"
    )
    for p in (rr, fk):
        p.add_argument(
            "--provider", help="sandbox provider (default: the recorded one)"
        ).choices = provider_choices
        p.add_argument("--runs-dir", help="where the new run directory goes (default: beside RUN_DIR)")
        p.add_argument(
            "--allow-changed-task",
            action="store_true",
            help="start even though the task changed since RUN_DIR ran (to see where it diverges)",
        )
        p.add_argument("--batch", action="store_true", help="headless: the result as a JSON line on stdout")


def cmd_lineage(args: argparse.Namespace, *, terminal: bool) -> int:
    """``terminal``: both ends are one (then the live TUI, unless --batch). Several run directories:
    headless, one child after another, every one checked before the first starts."""
    name = args.command  # rerun | fork
    run_dirs = list(args.run_dir) if isinstance(args.run_dir, list) else [args.run_dir]
    if len(run_dirs) > 1 and not args.batch and terminal:
        print(
            f"opencode-tui {name}: several run directories need --batch (the TUI shows one run)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    children = []
    for run_dir in run_dirs:
        try:
            children.append(child_episode(argparse.Namespace(**{**vars(args), "run_dir": run_dir})))
        except ValueError as exc:
            print(f"opencode-tui {name}: {exc}", file=sys.stderr)
            return ExitCode.USAGE
    for (episode, _config), run_dir in zip(children, run_dirs, strict=True):
        plan = episode.replay_plan  # a fork that starts before its step: said before it starts
        if plan is not None and plan.moved:
            print(f"opencode-tui {name}: {Path(run_dir).name}: {plan.moved}", file=sys.stderr)
    if not args.batch and terminal:
        return _tui(*children[0])
    worst = ExitCode.OK
    for episode, _config in children:
        code, interrupted = _headless(name, episode)
        worst = max(worst, ExitCode(code), key=lambda c: c.severity)
        if interrupted:  # a signal ends the batch: the children not started stay so
            break
    return worst


def lineage_in_tui(
    request: LineageRequest, *, from_browser: bool = False
) -> tuple[int, EpisodeResult | None]:
    """A rerun or fork the TUI asked for, live: its exit code and result (None: it did not finish).
    ValueError (one line) when it cannot start as asked."""
    episode, config = child_episode(request.args())
    return _tui(episode, config, from_browser=from_browser), episode._result


def _announce(name: str) -> Any:
    def say(signal_name: str, first: bool) -> None:
        what = (
            "closing the episode (cleanup is confirmed); send it again to hurry"
            if first
            else "hurrying the close"
        )
        print(f"opencode-tui {name}: {signal_name}: {what}", file=sys.stderr, flush=True)

    return say


def _headless(name: str, episode: Episode) -> tuple[int, bool]:
    """Run one child; its result as a JSON line with how it went against its parent. (exit code,
    whether a signal cancelled it)."""
    import asyncio  # here, not at the top: --help stays cheap (benchmarks/startup.py)
    import json

    from opencode_tui_core.control import CANCELLED_BY_USER
    from opencode_tui_core.signals import closing_signals

    async def main() -> EpisodeResult:
        with closing_signals(episode.cancel, announce=_announce(name)):
            return await episode.run()

    result = asyncio.run(main())
    print(json.dumps(batch_line(episode, result)), flush=True)
    _say_result(name, episode, result)
    return result.exit_code, result.cancelled_by not in (None, CANCELLED_BY_USER)


def batch_line(episode: Episode, result: EpisodeResult) -> dict[str, Any]:
    """The result's JSON, and the child's lineage: ``reproduced`` (a rerun with no divergence; None for
    a fork) and ``divergence_step`` (None when none)."""
    line = result.model_dump(mode="json")
    child = episode.child
    if child is not None:
        s = child.summary
        line["lineage"] = child.plan.lineage
        line["parent_run_id"] = child.plan.parent_run_id
        line["fork_step"] = child.plan.fork_step
        if child.plan.moved:  # the step asked for, and why the fork started before it
            line["asked_step"] = child.plan.asked_step
            line["fork_moved"] = child.plan.moved
        line["reproduced"] = (s.divergence_step is None) if child.plan.lineage == "rerun" else None
        line["divergence_step"] = s.divergence_step
    return line


def _say_result(name: str, episode: Episode, result: EpisodeResult) -> None:
    child = episode.child
    line = f"opencode-tui {name}: {result.summary} — run directory: {result.run_dir}"
    if child is not None:
        s = child.summary
        if s.divergence_step is not None:
            line += f"; diverged at step {s.divergence_step}: {s.divergence}"
        elif name == "rerun":
            line += "; reproduced: no divergence"
        if s.workspace_check:
            line += f"; workspace: {s.workspace_check}"
    print(line, file=sys.stderr, flush=True)


def _tui(episode: Episode, config: AgentConfig, *, from_browser: bool = False) -> int:
    from opencode_tui.app import OpenCodeTUI

    app = OpenCodeTUI(control=episode, theme=config.theme, run_episode=episode.run, from_browser=from_browser)
    app.run()
    result = episode._result
    if result is None:
        print("opencode-tui: the episode did not finish", file=sys.stderr)
        return ExitCode.INFRA
    _say_result(
        "rerun" if episode.child and episode.child.plan.lineage == "rerun" else "fork", episode, result
    )
    return result.exit_code
