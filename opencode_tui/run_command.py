"""``opencode-tui run``: admission checks, then the TUI (one task) or headless batch (JSON lines)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from core.artifacts import RunInfo
from core.batch import BatchControl, BatchSummary, RunsDirError, run_batch
from core.config import AgentConfig, ConfigError, load_config
from core.episode import Episode, EpisodeResult
from core.exit_codes import ExitCode
from core.outcome import exit_code as outcome_exit_code
from core.signals import closing_signals
from core.tasks import Task, load_task


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2, nothing started."""


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    o: dict[str, Any] = {}
    if args.provider:
        o.setdefault("sandbox", {})["provider"] = args.provider
    if args.keep_sandbox:
        o.setdefault("sandbox", {})["keep_sandbox"] = True
    if args.model_url:
        o.setdefault("model", {})["url"] = args.model_url
    if args.model:
        o.setdefault("model", {})["name"] = args.model
    if args.api_key_env:
        o.setdefault("model", {})["api_key_env"] = args.api_key_env
    if args.attempts is not None:
        if args.attempts < 1:
            raise UsageError("--attempts must be at least 1")
        o["policy"] = {"max_attempts": args.attempts}
    if args.runs_dir:
        o["runs_dir"] = args.runs_dir
    return o


def admit(args: argparse.Namespace) -> tuple[AgentConfig, list[Task]]:
    """Everything that can be checked before any sandbox exists; raises UsageError/ConfigError."""
    config = load_config(args.config, _overrides(args))
    tasks = [load_task(t) for t in args.tasks]
    if not args.batch and len(tasks) > 1:
        raise UsageError("the TUI runs one task at a time; pass --batch to run several")
    if not args.batch and args.attempts is not None:
        # The TUI shows one episode and never retries: accepting the bound would silently ignore it.
        raise UsageError(
            "--attempts applies to --batch only: the TUI runs one attempt (pass --batch to retry)"
        )
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if config.model.url is None:
        missing = [t.id for t in tasks if t.trajectory_path is None]
        if missing:
            raise UsageError(
                f"task(s) {', '.join(missing)} have no model.trajectory for the embedded scripted model; "
                "pass --model-url (and --model) to use a real model"
            )
        from core.model.trajectory import load_trajectory

        for t in tasks:
            assert t.trajectory_path is not None
            load_trajectory(t.trajectory_path)  # a broken trajectory is bad input, not a failed episode
    else:
        _check_model_url(config)
    if config.model.api_key_env and not os.environ.get(config.model.api_key_env):
        raise UsageError(
            f"--api-key-env names {config.model.api_key_env}, which is not set in the environment"
        )
    if config.sandbox.mode == "owned":
        _admit_provider(config, tasks)
    return config, tasks


def _check_model_url(config: AgentConfig) -> None:
    import httpx

    url = f"{config.model.url}/models"
    try:
        httpx.get(url, timeout=5.0)
    except httpx.HTTPError as exc:
        raise UsageError(
            f"cannot reach --model-url {config.model.url} ({type(exc).__name__}: {exc}); "
            "check the URL and that the server is running"
        ) from exc


def _admit_provider(config: AgentConfig, tasks: list[Task]) -> None:
    """The provider's own quick checks for this run (e.g. its engine is up, the images exist)."""
    from core import provider_registry as registry

    images = sorted({config.sandbox.image or t.image for t in tasks})
    checks = asyncio.run(registry.get(config.sandbox.provider).admit(config, images))
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        raise UsageError(failed[0].detail)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config, tasks = admit(args)
    except (UsageError, ConfigError) as exc:
        print(f"opencode-tui run: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    runs_dir = Path(config.runs_dir)
    if args.batch:
        return _batch(config, tasks, runs_dir, args.jobs, args.attempts)
    return _tui(config, tasks[0], runs_dir)


def _batch(config: AgentConfig, tasks: list[Task], runs_dir: Path, jobs: int, attempts: int | None) -> int:
    from opencode_tui.batch_progress import BatchProgress

    progress = BatchProgress(len(tasks), sys.stderr)

    def on_result(result: EpisodeResult) -> None:
        print(json.dumps(result.model_dump(mode="json")), flush=True)
        progress.finished(result)
        if result.artifacts_error is not None:
            print(
                f"opencode-tui run: {result.artifacts_error}; the sandbox was still closed and released, "
                "what was written before is kept; no further episode starts",
                file=sys.stderr,
                flush=True,
            )

    control = BatchControl()

    async def main() -> BatchSummary:
        with progress, closing_signals(control.cancel, announce=_announce):
            return await run_batch(
                tasks,
                config,
                runs_dir=runs_dir,
                jobs=jobs,
                max_attempts=attempts,
                on_result=on_result,
                on_episode=progress.attach,
                control=control,
                on_orphan=_report_orphan,
            )

    try:
        summary = asyncio.run(main())
    except RunsDirError as exc:
        print(f"opencode-tui run: {exc.strerror}; free space or choose another --runs-dir", file=sys.stderr)
        return ExitCode.INFRA
    print(f"opencode-tui: {summary.line()}", file=sys.stderr)
    return outcome_exit_code((r.exit_code for r in summary.results), cancelled_by=summary.cancelled_by)


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


def _tui(config: AgentConfig, task: Task, runs_dir: Path) -> int:
    from opencode_tui.app import OpenCodeTUI

    episode = Episode(task, config, runs_dir=runs_dir)
    app = OpenCodeTUI(control=episode, theme=config.theme, run_episode=episode.run)
    app.run()
    result = episode._result
    if result is None:
        print("opencode-tui run: the episode did not finish", file=sys.stderr)
        return ExitCode.INFRA
    print(f"opencode-tui: {result.summary} — run directory: {result.run_dir}", file=sys.stderr)
    if result.sandbox_kept:
        print(
            f"opencode-tui: sandbox {result.sandbox_id} ({result.provider}) was kept for debugging; "
            f"remove it with `opencode-tui sweep --provider {result.provider}`",
            file=sys.stderr,
        )
    return result.exit_code
