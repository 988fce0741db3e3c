"""Plug-ins found by entry point: the one registry behind the sandbox providers
(core/provider_registry.py) and the executors (core/executor_registry.py).

A plug-in is an object named by an entry point of a group (``opencode_tui.providers``,
``opencode_tui.executors``). The first one on ``sys.path`` wins for a name, as for imports; the
built-in ones are also named by the registry so that a source tree that is not installed (or an
editable install made before the entry points existed) still finds them.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from typing import Generic, Protocol, TypeVar, cast

NAME = re.compile(r"[a-z][a-z0-9_-]*")


def scan(group: str, builtin: Mapping[str, str]) -> dict[str, importlib.metadata.EntryPoint]:
    """Each name's entry point in ``group`` (none loaded): the installed metadata, then ``builtin``
    for a name it lacks. Cheap: no plug-in is imported (the command line names them in its help)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=group):
        found.setdefault(ep.name, ep)  # the first on sys.path wins, as for imports
    for name, value in builtin.items():
        found.setdefault(name, importlib.metadata.EntryPoint(name, value, group))
    return {name: ep for name, ep in found.items() if NAME.fullmatch(name)}


class Named(Protocol):
    name: str


P = TypeVar("P", bound=Named)


class Registry(Generic[P]):
    """The plug-ins of one entry-point group, each a ``kind`` instance, loaded once when first asked."""

    def __init__(
        self,
        group: str,
        builtin: Mapping[str, str],
        what: str,
        # ``type``, not ``type[P]``: the plug-in base classes are abstract (type checkers refuse an
        # abstract class for ``type[P]``); the caller names P in its annotation.
        kind: type,
        unknown: type[Exception],
        load_error: type[Exception],
    ) -> None:
        self.group, self.builtin, self.what, self.kind = group, dict(builtin), what, kind
        self.unknown, self.load_error = unknown, load_error
        self._found: dict[str, importlib.metadata.EntryPoint] | None = None
        self._loaded: dict[str, P] = {}

    def entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        if self._found is None:
            self._found = scan(self.group, self.builtin)
        return self._found

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self.entry_points())

    def check_name(self, name: str) -> str:
        if name not in self.entry_points():
            raise self.unknown(f"unknown {self.what} {name!r}; registered: {', '.join(self.names())}")
        return name

    def get(self, name: str) -> P:
        """The plug-in registered as ``name`` (loaded once)."""
        plugin = self._loaded.get(name)
        if plugin is None:
            plugin = self._loaded[name] = self._load(name)
        return plugin

    def _load(self, name: str) -> P:
        ep = self.entry_points()[self.check_name(name)]
        try:
            plugin = ep.load()
        except Exception as exc:
            raise self.load_error(f"{self.what} {name!r} ({ep.value}) cannot be loaded: {exc}") from exc
        if not isinstance(plugin, self.kind):
            raise self.load_error(
                f"{self.what} {name!r} ({ep.value}) is a {type(plugin).__name__}, not a {self.kind.__name__}"
            )
        loaded = cast(P, plugin)  # an instance of ``kind``, the class P stands for
        if loaded.name != name:
            raise self.load_error(
                f"entry point {name!r} ({ep.value}) holds the plug-in named {loaded.name!r}"
            )
        return loaded
