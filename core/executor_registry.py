"""Executors as plug-ins, found through the entry-point group ``opencode_tui.executors``: where a batch's
episode attempts run (this process, a Ray cluster, ...), chosen by ``executor.name`` in the config.

The same kind of registry as the sandbox providers' (core/provider_registry.py): an entry point names an
``ExecutorPlugin``; the CLI's ``--executor`` choices and the config's ``executor.name`` come from here,
and the CLI and admission ask the plug-in (``remote``) instead of comparing executor names.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opencode_tui_core.plugins import Registry

if TYPE_CHECKING:
    from pathlib import Path

    from opencode_tui_core.batch import Executor
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.episode import Episode

ENTRY_POINT_GROUP = "opencode_tui.executors"

# Also declared as entry points in pyproject.toml (a test keeps the two equal); used when the installed
# metadata lacks them.
BUILTIN = {
    "local": "opencode_tui_core.batch:LOCAL",
    "ray": "opencode_tui_core.ray_executor:PLUGIN",
}


@dataclass
class ExecutorHooks:
    """What the caller wants to hear while a batch runs (each may be None)."""

    on_episode: Callable[[Episode], None] | None = None  # an in-process episode was created (its live view)
    on_started: Callable[[str, int, str], None] | None = None  # (task id, attempt, run id) started elsewhere
    on_phase: Callable[[str, str], None] | None = None  # (run id, phase) reported from elsewhere
    # (run id, node id, node address): the machine an attempt started elsewhere runs on, once it has
    # started there (a Ray node's id and the address it registered).
    on_node: Callable[[str, str, str], None] | None = None


class ExecutorPlugin(abc.ABC):
    """One executor as the rest of the program sees it (the entry point's object)."""

    name: str
    summary: str = ""  # one line for help texts
    # The episodes run on other machines: the runs directory must be one path every node sees, the
    # provider's admission checks run there, and only batches can use it (``--batch`` or the batch
    # screen; not the one-episode TUI, whose episode runs here).
    remote: bool = False

    @abc.abstractmethod
    def executor(self, config: AgentConfig, hooks: ExecutorHooks) -> Executor:
        """An executor ready to run attempts (a remote one has joined its cluster; raises
        ``opencode_tui_core.batch.ExecutorError`` when it cannot)."""

    def output_to(self, path: Path) -> AbstractContextManager[None]:
        """While open, what the executor's own machinery would print or log in this process (a
        cluster client's messages) goes to the file ``path`` instead: for a front end that owns the
        terminal. Entered before ``executor`` is called; nothing by default."""
        return contextlib.nullcontext()


class UnknownExecutorError(ValueError):
    """An executor name no plug-in registers; the message lists the registered ones."""


class ExecutorLoadError(UnknownExecutorError):
    """A registered executor that cannot be loaded or is not an ExecutorPlugin."""


_REGISTRY: Registry[ExecutorPlugin] = Registry(
    ENTRY_POINT_GROUP, BUILTIN, "executor", ExecutorPlugin, UnknownExecutorError, ExecutorLoadError
)


# Every registered name (sorted); a name checked (UnknownExecutorError names the registered ones); the
# plug-in registered as a name (loaded once; its module imports nothing heavy).
names = _REGISTRY.names
check_name = _REGISTRY.check_name
get = _REGISTRY.get
