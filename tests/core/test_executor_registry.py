"""Executors as plug-ins (core/executor_registry.py): the built-ins are declared as entry points, the
config and the CLI take their names from the registry, and callers ask ``remote`` instead of names."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from opencode_tui.cli import build_parser
from opencode_tui_core import executor_registry
from opencode_tui_core.batch import LocalExecutor
from opencode_tui_core.config import AgentConfig, ConfigError, load_config
from opencode_tui_core.executor_registry import ExecutorHooks, UnknownExecutorError

ROOT = Path(__file__).resolve().parents[2]


def test_the_builtin_entry_points_are_declared_in_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][executor_registry.ENTRY_POINT_GROUP] == executor_registry.BUILTIN


def test_the_builtins_load_and_say_where_their_episodes_run() -> None:
    assert executor_registry.names() == ["local", "ray"]
    local, ray = executor_registry.get("local"), executor_registry.get("ray")
    assert (local.name, local.remote, ray.name, ray.remote) == ("local", False, "ray", True)
    seen: list[object] = []
    executor = local.executor(AgentConfig(), ExecutorHooks(on_episode=seen.append))
    assert isinstance(executor, LocalExecutor) and executor.on_episode == seen.append


def test_an_unknown_executor_is_a_config_error_naming_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownExecutorError, match="registered: local, ray"):
        executor_registry.get("slurm")
    with pytest.raises(ConfigError, match="unknown executor 'slurm'; registered: local, ray"):
        load_config(None, {"executor": {"name": "slurm"}})


def test_the_cli_offers_the_registered_executors() -> None:
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    [option] = [a for a in run._actions if "--executor" in a.option_strings]
    assert list(option.choices) == executor_registry.names()
