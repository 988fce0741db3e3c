"""``opencode-tui run``: admission checks, then the TUI (one task) or headless batch (JSON lines)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from opencode_tui_core import api, executor_registry
from opencode_tui_core.admission import AdmissionError, check_inputs, rerun_inputs
from opencode_tui_core.artifacts import RunInfo
from opencode_tui_core.batch import (
    BatchSummary,
    ExecutorError,
    RunsDirError,
)
from opencode_tui_core.config import AgentConfig, ConfigError
from opencode_tui_core.episode import Episode, EpisodeResult
from opencode_tui_core.executor_registry import ExecutorHooks
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.failure_groups import groups_line
from opencode_tui_core.failures import Outcome
from opencode_tui_core.outcome import exit_code as outcome_exit_code
from opencode_tui_core.signals import closing_signals
from opencode_tui_core.tasks import Task

if TYPE_CHECKING:
    from opencode_tui.batch_app import BatchTUI


def options(args: argparse.Namespace) -> api.RunOptions:
    """The command line's flags as the API's run options (the CLI is a client of opencode_tui_core.api)."""
    if args.attempts is not None and args.attempts < 1:
        raise api.RunRefused("--attempts must be at least 1")
    if args.jobs is not None and args.jobs < 1:
        raise api.RunRefused("--jobs must be at least 1")
    ray: dict[str, Any] = {}
    if args.ray_address:
        ray["address"] = args.ray_address
    if args.ray_num_cpus_per_episode is not None:
        ray["num_cpus_per_episode"] = args.ray_num_cpus_per_episode
    return api.RunOptions(
        config=Path(args.config) if args.config else None,
        settings={"executor": {"ray": ray}} if ray else {},
        provider=args.provider,
        model_url=args.model_url,
        model=args.model,
        api_key_env=args.api_key_env,
        runs_dir=Path(args.runs_dir) if args.runs_dir else None,
        keep_sandbox=bool(args.keep_sandbox),
        attempts=args.attempts,
        jobs=args.jobs,
        force=bool(getattr(args, "force", False)),
        breaks=list(getattr(args, "breaks", None) or []),
        executor=args.executor,
    )


def admit(args: argparse.Namespace) -> api.Prepared:
    """Everything that can be checked before any sandbox exists (``api.prepare``); raises
    ``api.RunRefused``. Says which bundled sample a name resolved to, and a Harbor task's unknown fields."""
    prepared = api.prepare(args.tasks, options(args), batch=args.batch)
    for note in prepared.notes:
        print(f"opencode-tui run: {note}", file=sys.stderr)
    return prepared


def cmd_run(args: argparse.Namespace) -> int:
    try:
        prepared = admit(args)
    except api.RunRefused as exc:
        print(f"opencode-tui run: {exc}", file=sys.stderr)
        return exc.exit_code
    config, tasks, runs_dir = prepared.config, prepared.tasks, prepared.runs_dir
    if args.batch:
        return _batch(prepared)
    if len(tasks) > 1 or getattr(args, "batch_screen", False):
        return _batch_tui(config, tasks, runs_dir, args.jobs, args.attempts, force=args.force)
    return _tui(config, tasks[0], runs_dir)


def batch_tui(
    config: AgentConfig,
    tasks: list[Task],
    runs_dir: Path,
    jobs: int | None,
    attempts: int | None,
    *,
    force: bool = False,
) -> BatchTUI:
    """The batch screen's app with the configured executor, ready (a remote one has joined its cluster;
    raises ExecutorError when it cannot). A remote executor's attempts run elsewhere: their rows come
    from its hooks (started, phase, node), not from in-process episodes."""
    from opencode_tui.batch_app import BatchTUI

    app: BatchTUI | None = None
    remote = executor_registry.get(config.executor.name).remote

    def attach(episode: Episode) -> None:
        assert app is not None
        app.attach(episode)

    def started(task_id: str, attempt: int, run_id: str) -> None:
        assert app is not None
        app.started_elsewhere(task_id, attempt, run_id)

    def phase(run_id: str, name: str) -> None:
        assert app is not None
        app.phase_elsewhere(run_id, name)

    def placed(run_id: str, node_id: str, address: str) -> None:
        assert app is not None
        app.placed(run_id, node_id, address)

    hooks = ExecutorHooks(on_episode=attach)
    if remote:
        # As in --batch: one path every node sees; the cluster's queue bounds concurrency unless --jobs does.
        runs_dir = runs_dir.resolve()
        jobs = jobs or len(tasks)
        hooks = ExecutorHooks(on_started=started, on_phase=phase, on_node=placed)
    executor = executor_registry.get(config.executor.name).executor(config, hooks)
    app = BatchTUI(
        tasks,
        config,
        runs_dir,
        jobs=jobs or 1,
        attempts=attempts,
        executor=executor,
        force=force,
        remote=remote,
    )
    return app


def executor_logs(config: AgentConfig, runs_dir: Path) -> contextlib.AbstractContextManager[None]:
    """Under the batch screen, a remote executor's driver logs go to the runs directory's EXECUTOR_LOG:
    the terminal is the screen's."""
    plugin = executor_registry.get(config.executor.name)
    if not plugin.remote:
        return contextlib.nullcontext()
    with contextlib.suppress(OSError):  # (run_batch says it if the runs directory cannot be made)
        runs_dir.resolve().mkdir(parents=True, exist_ok=True, mode=0o700)
    return plugin.output_to(runs_dir.resolve() / EXECUTOR_LOG)


def _batch_tui(
    config: AgentConfig,
    tasks: list[Task],
    runs_dir: Path,
    jobs: int | None,
    attempts: int | None,
    *,
    force: bool = False,
) -> int:
    """Several tasks without --batch: the batch engine on the batch screen."""
    with executor_logs(config, runs_dir):
        try:
            app = batch_tui(config, tasks, runs_dir, jobs, attempts, force=force)
        except ExecutorError as exc:
            print(f"opencode-tui run: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        app.run()
    for note in getattr(app.executor, "notes", ()):
        print(f"opencode-tui run: {note}", file=sys.stderr)
    if app.error is not None:
        print(f"opencode-tui run: {app.error}", file=sys.stderr)
        return app.error_code
    summary = app.summary
    if summary is None:
        print("opencode-tui run: the batch did not finish", file=sys.stderr)
        return app.exit_code()
    print(f"opencode-tui: batch {summary.batch_id}", file=sys.stderr)
    groups = groups_line(summary.results)
    if groups:  # before the summary, which stays the last line (scripts read it)
        print(f"opencode-tui: {groups}", file=sys.stderr)
    print(f"opencode-tui: {summary.line()}", file=sys.stderr)
    return app.exit_code()


EXECUTOR_LOG = "executor.log"  # in the runs directory: a remote executor's driver messages, under the screen


def _batch(prepared: api.Prepared) -> int:
    data = sys.stdout  # the JSON lines, and nothing else
    if executor_registry.get(prepared.config.executor.name).remote:
        # A cluster's driver prints its messages (a worker died, ...) to sys.stdout: diagnostics.
        with contextlib.redirect_stdout(sys.stderr):
            return _run_batch(prepared, data)
    return _run_batch(prepared, data)


def _run_batch(prepared: api.Prepared, data: TextIO) -> int:
    from opencode_tui.batch_progress import BatchProgress

    progress = BatchProgress(len(prepared.tasks), sys.stderr)

    def on_result(result: EpisodeResult) -> None:
        if result.resumed:  # same task content and configuration, already scored: not run again
            print(f"skipped: already scored in {result.run_dir}", file=sys.stderr, flush=True)
        print(json.dumps(result.model_dump(mode="json")), file=data, flush=True)
        progress.finished(result)
        if result.artifacts_error is not None:
            print(
                f"opencode-tui run: {result.artifacts_error}; the sandbox was still closed and released, "
                "what was written before is kept; no further episode starts",
                file=sys.stderr,
                flush=True,
            )

    hooks = api.BatchHooks(
        on_result=on_result,
        on_orphan=_report_orphan,
        on_warning=_warn,
        executor=ExecutorHooks(
            on_episode=progress.attach,
            on_started=progress.started,
            # Live phases only where they are shown (a terminal): otherwise the workers report nothing.
            on_phase=progress.phase if progress.tty else None,
        ),
    )
    run = api.BatchRun(prepared, hooks)
    try:
        # Ready before the signal handlers (a remote executor joins its cluster, which may replace them).
        executor = run.make_executor()
    except api.RunRefused as exc:
        print(f"opencode-tui run: {exc}", file=sys.stderr)
        return exc.exit_code

    async def main() -> BatchSummary:
        try:
            with progress, closing_signals(run.control.cancel, announce=_announce):
                return await run.summary()
        finally:
            for note in getattr(executor, "notes", ()):
                print(f"opencode-tui run: {note}", file=sys.stderr, flush=True)

    try:
        summary = asyncio.run(main())
    except api.RunRefused as exc:
        print(f"opencode-tui run: {exc}", file=sys.stderr)
        return exc.exit_code
    # The batch's id is on every result line too; `sweep --batch ID` finds what a lost node left.
    print(f"opencode-tui: batch {summary.batch_id}", file=sys.stderr)
    groups = groups_line(summary.results)
    if groups:  # before the summary, which stays the last line (scripts read it)
        print(f"opencode-tui: {groups}", file=sys.stderr)
    print(f"opencode-tui: {summary.line()}", file=sys.stderr)
    return outcome_exit_code((r.exit_code for r in summary.results), cancelled_by=summary.cancelled_by)


def _runs_dir_failed(exc: OSError) -> int:
    """The runs directory could not be created or written: one line with the hint that fits the cause."""
    refusal = api.runs_dir_refusal(exc)
    print(f"opencode-tui run: {refusal}", file=sys.stderr)
    return refusal.exit_code


def _warn(words: str) -> None:
    print(f"opencode-tui run: warning: {words}", file=sys.stderr, flush=True)


def _report_orphan(info: RunInfo) -> None:
    assert info.outcome is not None
    print(f"opencode-tui run: {info.run_id} was {info.outcome.summary}", file=sys.stderr, flush=True)


def _announce(name: str, first: bool) -> None:
    if first:
        print(
            f"opencode-tui run: {name}: closing every running episode (cleanup is confirmed); "
            "send it again to hurry",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(f"opencode-tui run: {name} again: hurrying the close", file=sys.stderr, flush=True)


def rerun(path: Path) -> int:
    """`r` in the runs browser: the run's task again with its recorded configuration, in the live TUI
    (same runs directory), admitted like `run`."""
    try:
        code, _ = rerun_in_tui(path)
    except (AdmissionError, ConfigError) as exc:
        print(f"opencode-tui runs: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    return code


def rerun_in_tui(path: Path, *, from_browser: bool = False) -> tuple[int, EpisodeResult | None]:
    """Re-run ``path`` in the live TUI: its exit code and result (None: it did not finish). Raises
    AdmissionError/ConfigError when the run cannot start as recorded (nothing started).
    ``from_browser``: Esc (and `q`) on the run lead back to the browser that asked for it."""
    from opencode_tui_core.artifacts import RunDirReader

    try:
        config, task = rerun_inputs(RunDirReader(path).info(), path)
        check_inputs(config, [task])
    except (FileNotFoundError, ValueError) as exc:
        raise AdmissionError(str(exc)) from exc
    print(f"opencode-tui: re-running {task.id} as recorded in {path}", file=sys.stderr)
    return _run_tui(config, task, path.parent, from_browser=from_browser)


def _tui(config: AgentConfig, task: Task, runs_dir: Path) -> int:
    return _run_tui(config, task, runs_dir)[0]


def _run_tui(
    config: AgentConfig, task: Task, runs_dir: Path, *, from_browser: bool = False
) -> tuple[int, EpisodeResult | None]:
    from opencode_tui.app import OpenCodeTUI

    try:  # as a batch does: a runs directory that cannot be made is said before the screen opens
        runs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        return _runs_dir_failed(RunsDirError(runs_dir, exc)), None
    from opencode_tui.warm_run import run_app, warm_line
    from opencode_tui_core.episode.warm_next import WarmNext

    # issue 31: the first sandbox starts preparing as the app's loop starts (before the screen is
    # drawn) and the episode takes it; each run that ends by itself has the next one prepared for `r`.
    warm = WarmNext()
    episode = Episode(task, config, runs_dir=runs_dir, pool=warm.pool_for(task, config))
    app = OpenCodeTUI(
        control=episode,
        theme=config.theme,
        run_episode=episode.run,
        from_browser=from_browser,
        warm=warm,
        inputs=(task, config),
    )
    counts = run_app(app, first=(task, config))
    results = [r for r in (getattr(e, "_result", None) for e in app.ran) if r is not None]
    for result in results:
        for line in result_lines(result):
            print(f"opencode-tui: {line}", file=sys.stderr)
    if counts is not None:
        print(f"opencode-tui: {warm_line(counts)}", file=sys.stderr)
    last = getattr(app.ran[-1], "_result", None)
    if last is None:
        print("opencode-tui run: the episode did not finish", file=sys.stderr)
        return ExitCode.INFRA, None
    return last.exit_code, last


def result_lines(result: EpisodeResult) -> list[str]:
    """What the TUI says when its episode has ended: the outcome and where it is recorded, and what
    follows from it (a retry it did not do, a sandbox it kept)."""
    lines = [f"{result.summary} — run directory: {result.run_dir}"]
    if result.action is Outcome.RETRY:  # the policy's word for what a batch does next: not done here
        lines.append("not retried: the TUI runs one attempt; `opencode-tui run --batch` would retry it")
    if result.sandbox_kept:
        # A kept sandbox is what `sweep` leaves alone unless named: say how to use it and how to remove it.
        lines.append(
            f"sandbox {result.sandbox_id} ({result.provider}) was kept for debugging; "
            f"open a shell in it with `opencode-tui attach {result.run_dir}`, "
            f"remove it with `opencode-tui sweep {result.sandbox_id}`"
        )
    return lines
