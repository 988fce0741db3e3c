"""Admission: what may start. Everything checked before any sandbox exists (the tasks, the model, the
key, the provider's own quick checks), the same for ``run``, a re-run from the runs browser and each
node of a remote executor; and whether another attempt may follow one in a borrowed sandbox.

A refusal is an ``AdmissionError`` (one line for the user, exit 2, nothing started); a config that
does not validate stays a ``ConfigError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from opencode_tui_core import executor_registry
from opencode_tui_core import provider_registry as registry
from opencode_tui_core.artifacts import RunInfo
from opencode_tui_core.config import AgentConfig, ConfigError
from opencode_tui_core.failures import Outcome
from opencode_tui_core.session import SandboxSession
from opencode_tui_core.tasks import Task, load_task


class AdmissionError(Exception):
    """Bad input, phrased for the user: printed as one line, exit code 2, nothing started."""


class RerunError(AdmissionError):
    """A run that cannot be run again as recorded (its task directory or configuration is gone)."""


def admit_run(
    config: AgentConfig, tasks: list[Task], *, batch: bool, attempts: int | None, jobs: int | None
) -> None:
    """What ``run`` checks once its configuration and tasks are loaded; raises AdmissionError/ConfigError."""
    built = [t for t in tasks if t.build is not None]
    if built:
        from opencode_tui_core.image_build import build_refusal

        refusal = build_refusal(built[0], config)
        if refusal:
            raise AdmissionError(refusal)
    # Several tasks without --batch: the TUI's batch screen (the same batch engine, shown live).
    screen = not batch and len(tasks) > 1
    if not batch and not screen and attempts is not None:
        # The run screen shows one episode and never retries: accepting the bound would silently ignore it.
        raise AdmissionError(
            "--attempts applies to batches only: the TUI runs one attempt of one task (pass --batch, "
            "or several tasks, to retry)"
        )
    if jobs is not None and jobs < 1:
        raise AdmissionError("--jobs must be at least 1")
    if executor_registry.get(config.executor.name).remote and not batch and not screen:
        raise AdmissionError(
            f"--executor {config.executor.name} runs batches only (--batch, or several tasks on the "
            "batch screen): the TUI runs its one episode here"
        )
    check_runs_dir(Path(config.runs_dir))
    check_inputs(config, tasks)


def check_runs_dir(runs_dir: Path) -> None:
    """The runs directory is, or can become, a directory: neither it nor a parent is a file. Said before
    anything starts (the episode's own mkdir would say it only once the screen is up, as an
    infrastructure failure). Whether it can be written is the first write's to say."""
    for path in (runs_dir, *runs_dir.parents):
        if path.is_dir():
            return
        if path.exists() or path.is_symlink():  # a file, a dangling link, a device: not a directory
            where = "is" if path == runs_dir else f"cannot be created: {path} is"
            raise AdmissionError(
                f"the runs directory {runs_dir} {where} not a directory; choose another --runs-dir"
            )


def check_inputs(config: AgentConfig, tasks: list[Task]) -> None:
    """The model, the key and the provider's own checks for these tasks (``run``, and a re-run from
    the runs browser); raises AdmissionError/ConfigError."""
    if config.model.url is None:
        missing = [t.id for t in tasks if t.trajectory_path is None]
        if missing:
            raise AdmissionError(
                f"task(s) {', '.join(missing)} have no model.trajectory for the embedded scripted model; "
                "pass --model-url (and --model) to use a real model"
            )
        from opencode_tui_core.model.trajectory import load_trajectory

        for t in tasks:
            assert t.trajectory_path is not None
            load_trajectory(t.trajectory_path)  # a broken trajectory is bad input, not a failed episode
    else:
        _check_model_url(config)
    if config.model.api_key_env and not os.environ.get(config.model.api_key_env):
        raise AdmissionError(
            f"--api-key-env names {config.model.api_key_env}, which is not set in the environment"
        )
    if config.sandbox.mode == "owned" and not executor_registry.get(config.executor.name).remote:
        # A remote executor's nodes run the sandboxes: the provider's checks run there (its probe).
        failed = provider_refusals(config, admission_images(config, tasks))
        if failed:
            raise AdmissionError(failed[0])


def _check_model_url(config: AgentConfig) -> None:
    import httpx

    url = f"{config.model.url}/models"
    try:
        httpx.get(url, timeout=5.0)
    except httpx.HTTPError as exc:
        raise AdmissionError(
            f"cannot reach --model-url {config.model.url} ({type(exc).__name__}: {exc}); "
            "check the URL and that the server is running"
        ) from exc


def admission_images(config: AgentConfig, tasks: Sequence[Task]) -> list[str]:
    """The images the provider's admission checks must find. A task built from its Dockerfile gets its
    image at seed (cached by the context's hash): not before."""
    return sorted({config.sandbox.image or t.image for t in tasks if t.build is None})


def provider_refusals(config: AgentConfig, images: Sequence[str]) -> list[str]:
    """The provider's own quick checks for a run of owned sandboxes from ``images`` (its engine is up,
    the images exist), on this machine: what failed, one line each."""
    checks = asyncio.run(registry.get(config.sandbox.provider).admit(config, images))
    return [c.detail for c in checks if c.status == "fail"]


def rerun_inputs(info: RunInfo | None, path: Path) -> tuple[AgentConfig, Task]:
    """The task and configuration a run directory recorded (run.json), checked like `run` checks them."""
    if info is None:
        raise RerunError(f"{path.name}: run.json is missing or unreadable; nothing to re-run")
    if not info.task_dir:
        raise RerunError(f"{path.name}: run.json does not name its task directory")
    try:
        config = AgentConfig.model_validate(info.config)
        task = load_task(info.task_dir)
    except (ConfigError, ValueError, OSError) as exc:
        raise RerunError(f"{path.name} cannot be re-run as recorded: {exc}") from exc
    return config, task


# ---- another attempt after this one ---------------------------------------------------------------

BORROWED_UNCLEAN = (
    "no further attempt: the borrowed sandbox's cleanup is unconfirmed (its session directory stays "
    "there for a later close)"
)


async def next_attempt_blocked(
    session: SandboxSession | None,
    action: Outcome,
    cleanup_confirmed: bool | None,
    config: AgentConfig,
    *,
    may_retry: bool,
    cancelled: bool,
) -> str | None:
    """Why no further attempt may follow an attempt that ended with ``action`` (its episode's
    ``session``) even if the policy asks for one (None: the policy decides). Every executor asks this
    where the episode ran."""
    if may_retry and action is Outcome.RETRY and not cancelled:
        if not await borrowed_sandbox_is_clean(session, cleanup_confirmed, config):
            return BORROWED_UNCLEAN
    return None


async def borrowed_sandbox_is_clean(
    session: SandboxSession | None, cleanup_confirmed: bool | None, config: AgentConfig
) -> bool:
    """Whether another attempt may start in the sandbox of the last attempt's ``session``.

    An owned sandbox is new for every attempt. A borrowed one whose cleanup was not confirmed may
    still run the last attempt's processes: the close is retried once from the session directory
    the release kept (within the close budget), and only a confirmed receipt lets another attempt in.
    """
    if config.sandbox.mode != "borrowed" or cleanup_confirmed is not False:
        return True
    if session is None or not session.keeps_session_dir or config.sandbox.sandbox_id is None:
        return False
    from opencode_tui_core.sandbox.providers import get_provider

    later: SandboxSession | None = None
    try:
        sandbox = await get_provider(config.sandbox.provider, config).connect(config.sandbox.sandbox_id)
        later = SandboxSession.reattach(
            sandbox, session.paths.session_dir, close_timeout_s=config.budgets.close_s
        )
        await later.close()
        return True
    except Exception:  # unconfirmed again, or the sandbox is gone: no further attempt there
        if later is not None:
            with contextlib.suppress(Exception):
                await later.release()  # disconnect; the session directory stays for yet another close
        return False
