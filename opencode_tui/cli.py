"""The ``opencode-tui`` command line.

Exit codes (stable, documented in README.md):
  0  every episode was scored (reward recorded, including count_as_zero)
  1  some episode failed on the model side (class model) and none on the infrastructure side
  2  usage or configuration error (bad task file, unknown field, missing image, ...)
  3  infrastructure failure (evaluation-side: sandbox, install, model endpoint, verifier)
  4  cleanup unconfirmed (a sandbox may still hold processes; see `opencode-tui sweep`)
  129/130/143 SIGHUP / interrupted (Ctrl-C) / SIGTERM, after cleanup
  141 stdout was closed early (e.g. `| head`): the output stops there, quietly, as for any command
`attach` and `sweep` exit 2 on bad input (an unknown, released or not-ours sandbox) with nothing touched.
A usage error is one line on stderr (what was wrong, where help is), exit 2.

Start-up stays cheap: nothing here imports the provider registry, pydantic or the config. The
``--provider`` choices are read from the installed metadata (core/provider_names.py, no plug-in
loaded) only when argparse needs them (help, or checking a given name), and the default provider's
name comes from ``opencode_tui_core.DEFAULT_PROVIDER``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

from opencode_tui_core import DEFAULT_PROVIDER, __version__
from opencode_tui_core.exit_codes import ExitCode

# httpx imports its own command line (click, rich, pygments: about 0.1 s, on the path from `run` to the
# first model call) whenever those packages are installed; this process never runs httpx's CLI. A None
# entry makes that one import fail at once, and httpx falls back to the stub ``main`` it defines for an
# install without its CLI extras.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None on purpose (above)


class _Parser(argparse.ArgumentParser):
    """A usage error is one line: what was wrong and where the help is (not a screen of usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: {message}; see `{self.prog} --help`\n")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse swallows a failed write; a closed pipe is main's to report, as for every command.
        if message:
            (file or sys.stderr).write(message)


class LazyChoices:
    """Choices read only when argparse iterates or tests them (for help, and for a value given on the
    command line): naming the providers, executors or export versions then costs nothing at start-up."""

    def __init__(self, load: Callable[[], Sequence[str]], *extra: str) -> None:
        self.load, self.extra = load, extra

    def _names(self) -> list[str]:
        return [*self.load(), *self.extra]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()


def _provider_names() -> list[str]:
    from opencode_tui_core.provider_names import names  # the installed metadata only: no plug-in is loaded

    return names()


def _executor_names() -> list[str]:
    from opencode_tui_core import executor_registry

    return executor_registry.names()


def _atif_version(value: str) -> str:
    from opencode_tui_core.export.atif_versions import VERSIONS

    if value not in VERSIONS:
        choices = ", ".join(repr(v) for v in VERSIONS)
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {choices})")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="opencode-tui",
        description="Run the OpenCode coding agent in a sandbox, watch it live, and trust why it failed.",
    )
    p.add_argument("--version", action="version", version=f"opencode-tui {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run task episodes (the run screen for one task, the batch screen for several, --batch: JSON lines)",
    )
    run.add_argument(
        "tasks",
        nargs="+",
        metavar="TASK",
        help="task directory or task.yaml, or the name of a bundled sample (see `opencode-tui samples`)",
    )
    run.add_argument("--batch", action="store_true", help="headless: JSON lines on stdout")
    # `serve --run TASK`: the batch screen for one task too (what a served batch shows)
    run.add_argument("--batch-screen", action="store_true", help=argparse.SUPPRESS)
    run.add_argument(
        "--jobs",
        type=int,
        help="episodes at once in a batch (default 1; with --executor ray: as many as the cluster fits)",
    )
    run.add_argument(
        "--executor",
        help="where --batch runs its episodes: this process (local, the default) or a Ray cluster",
    ).choices = LazyChoices(_executor_names)
    run.add_argument(
        "--ray-address", metavar="ADDR", help="the Ray cluster's head HOST:PORT (--executor ray)"
    )
    run.add_argument(
        "--ray-num-cpus-per-episode",
        type=float,
        metavar="N",
        help="Ray CPUs each episode attempt reserves (--executor ray; default 1)",
    )
    # choices are set after add_argument: that call formats the metavar, which would iterate them.
    run.add_argument(
        "--provider", help=f"sandbox provider (default: {DEFAULT_PROVIDER})"
    ).choices = LazyChoices(_provider_names)
    run.add_argument("--model-url", help="OpenAI-compatible base URL (default: the task's scripted model)")
    run.add_argument("--model", help="model name at --model-url")
    run.add_argument("--api-key-env", help="environment variable holding the model API key")
    run.add_argument(
        "--attempts",
        type=int,
        help="maximum attempts per episode (retry policy bound; batches only: one task's run screen runs one attempt)",
    )
    run.add_argument("--keep-sandbox", action="store_true", help="do not destroy the sandbox afterwards")
    run.add_argument("--runs-dir", help="where run directories go (default ./runs)")
    run.add_argument(
        "--force",
        action="store_true",
        help="--batch: run every task again, even one already scored with the same task content and config",
    )
    run.add_argument("--config", help="config file (YAML or TOML)")
    run.add_argument(
        "--break",
        dest="breaks",
        action="append",
        metavar="COND",
        help="hold the agent's model call when COND holds (repeatable): next, call:N, tool:NAME, warning, "
        "error, failure; then `opencode-tui ctl RUN continue|step|say|answer|abort`",
    )

    from opencode_tui.lineage_command import add_parsers as add_lineage

    add_lineage(sub, LazyChoices(_provider_names))
    op = sub.add_parser("open", help="open a run directory in the TUI (replay)")
    op.add_argument("run_dir")
    rs = sub.add_parser("runs", help="list run directories with their outcome")
    rs.add_argument("--runs-dir", default="runs")
    rs.add_argument("--json", action="store_true", help="one JSON object per run (with --batch: the groups)")
    rs.add_argument(
        "--batch", metavar="ID", help="that batch's failures grouped (kind × stage × evidence), with run ids"
    )
    df = sub.add_parser("diff", help="compare two run directories (drift, steps aligned, deltas)")
    df.add_argument("run_a", metavar="RUN_A")
    df.add_argument("run_b", metavar="RUN_B")
    df.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    at = sub.add_parser("attach", help="open a shell in a kept sandbox (after its run has ended)")
    at.add_argument("target", metavar="RUN_DIR|SANDBOX_ID", help="the run directory or the kept sandbox's id")
    sw = sub.add_parser(
        "sweep",
        help="remove sandboxes of ours: the named ones, a run's, or leftovers whose process is gone",
    )
    sw.add_argument("ids", nargs="*", metavar="ID", help="remove exactly these sandboxes (kept or not)")
    sw.add_argument("--run", metavar="RUN_ID", help="remove this run's sandbox(es)")
    sw.add_argument(
        "--batch",
        metavar="BATCH_ID",
        help="remove this batch's leftovers (its id is on every result line of run --batch)",
    )
    sw.add_argument("--kept", action="store_true", help="without ids: also remove kept sandboxes")
    sw.add_argument("--dry-run", action="store_true", help="list what would be removed")
    sw.add_argument(
        "--provider",
        default="all",
        # Which providers those are is known only by loading each plug-in: not for a help text.
        help="all = every provider that lists its sandboxes without configuration (the others: name them)",
    ).choices = LazyChoices(_provider_names, "all")
    sw.add_argument(
        "--all-owners",
        action="store_true",
        help="also remove sandboxes owned by other users/jobs (default: only yours, "
        "i.e. $OPENCODE_TUI_OWNER or user@host)",
    )
    ex = sub.add_parser("export", help="write run directories as ATIF trajectories or chat messages")
    ex.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    ex.add_argument("--format", choices=["atif", "messages"], default="atif", help="default: atif (v1.8)")
    ex.add_argument(
        "--atif-version",
        metavar="VERSION",
        # Checked when given, not listed in the help: naming the versions loads the exporter.
        type=_atif_version,
        help="ATIF version to write (default 1.8); 1.7 for Harbor releases before v1.8, written beside "
        "RUN_DIR/trajectory.json (which stays 1.8), saying what was dropped",
    )
    ex.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="file (one run), directory (several, atif) or - for stdout; "
        "default: RUN_DIR/trajectory.json (atif), stdout (messages)",
    )
    rp = sub.add_parser("report", help="write a run (or a batch's runs) as one self-contained HTML file")
    rp.add_argument("path", metavar="RUN_DIR", help="the run directory (with --batch: the runs directory)")
    rp.add_argument("--batch", metavar="ID", help="report every attempt of this batch found in RUNS_DIR")
    rp.add_argument(
        "-o", "--output", metavar="FILE", help="default: RUN_DIR/report.html, RUNS_DIR/report-ID.html"
    )
    sv = sub.add_parser(
        "serve", help="serve the TUI (runs browser, replays, re-runs, a batch) to a browser, behind a token"
    )
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others warn)")
    sv.add_argument("--port", type=int, default=8000, help="default 8000; 0 picks a free port")
    sv.add_argument("--read-only", action="store_true", help="no shell, cancel, keep or re-run")
    sv.add_argument("--runs-dir", default="runs")
    sv.add_argument("--max-sessions", type=int, default=4, help="browser sessions at once (default 4)")
    sv.add_argument(
        "--run",
        nargs="+",
        metavar="TASK",
        help="each browser session runs these tasks on the batch screen (into --runs-dir), as `run` would",
    )
    sv.add_argument("--jobs", type=int, help="with --run: episodes at once (default 1)")
    sv.add_argument("--provider", help="with --run: the sandbox provider")
    sm = sub.add_parser("samples", help="list the sample tasks that ship with opencode-tui, or copy them")
    sm_sub = sm.add_subparsers(dest="samples_command", metavar="ACTION")
    cp = sm_sub.add_parser("copy", help="copy sample tasks into a directory (all, or the named ones)")
    cp.add_argument("dest", metavar="DIR", help="where the samples go (each as DIR/NAME)")
    cp.add_argument("names", nargs="*", metavar="NAME", help="only these samples (default: all)")
    sub.add_parser(
        "gym-root",
        help="print the directory to put on NEMO_GYM_EXTRA_ROOTS: the NeMo Gym agent server "
        "(responses_api_agents/opencode_tui_agent; docs/gym.md)",
    )
    from opencode_tui.ctl_command import add_parser as add_ctl

    add_ctl(sub)
    dr = sub.add_parser(
        "doctor",
        help="check providers, bwrap, Docker, cache and the OpenCode pin; report recent batches' warm "
        "pools and prepared sandboxes left over",
    )
    dr.add_argument("--json", action="store_true")
    dr.add_argument(
        "--provider-contract",
        metavar="NAME",
        help="run the provider contract suite against this registered provider (needs pytest: "
        "pip install 'opencode-tui[contract]'); exit 0 when it passes, 3 when a test fails",
    )
    dr.add_argument(
        "--contract-image", metavar="IMAGE", help="with --provider-contract: the image of its sandboxes"
    )
    dr.add_argument("--config", help="config file whose sandbox.<name> settings configure the providers")
    dr.add_argument(
        "--runs-dir",
        help="whose recent batches' warm pools to report (default: the config's runs_dir, ./runs)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            code = _dispatch(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        # The reader has gone (`| head`): stop quietly. stdout points at /dev/null from here on so
        # that the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.PIPE_CLOSED
    return code


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return ExitCode.OK
    from opencode_tui import commands

    handler = getattr(commands, f"cmd_{args.command.replace('-', '_')}")
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
