"""The child episode a rerun or fork asks for (issue 28), made from its parent's record: used by the
``rerun``/``fork`` commands and by a served app that runs the child inside itself. It imports nothing
of the app, so both can."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine (and pydantic) load when a child is made, not for --help (start-up)
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.episode import Episode


def child_episode(args: argparse.Namespace) -> tuple[Episode, AgentConfig]:
    """The child episode (not started); ValueError with one line when it cannot start as asked.
    Its admission checks run their own event loop: inside an app, call it on a thread."""
    from opencode_tui_core.admission import AdmissionError, check_inputs
    from opencode_tui_core.config import ConfigError
    from opencode_tui_core.episode import Episode, LineageError, child_inputs, load_parent

    name = args.command  # rerun | fork
    path = Path(args.run_dir)
    try:
        parent = load_parent(path)
        config, task, plan = child_inputs(
            parent,
            lineage=name,
            fork_step=getattr(args, "at", None),
            on_divergence=getattr(args, "on_divergence", "stop"),
            allow_changed_task=args.allow_changed_task,
            overrides=_overrides(args),
            say=getattr(args, "say", None),
        )
        if not args.runs_dir:
            config = config.model_copy(update={"runs_dir": str(path.resolve().parent)})
        check_inputs(config, [task])
    except (LineageError, AdmissionError, ConfigError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    return Episode(task, config, runs_dir=Path(config.runs_dir), child_of=(plan, parent)), config


def _overrides(args: argparse.Namespace) -> Any:
    from opencode_tui_core.config import AgentConfig

    def apply(config: AgentConfig) -> AgentConfig:
        data = config.model_dump(mode="json")
        if args.provider:
            data["sandbox"]["provider"] = args.provider
        if args.runs_dir:
            data["runs_dir"] = args.runs_dir
        for option, key in (("model_url", "url"), ("model", "name"), ("api_key_env", "api_key_env")):
            value = getattr(args, option, None)
            if value:
                data["model"][key] = value
        return AgentConfig.model_validate(data)

    return apply
