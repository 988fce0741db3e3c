"""Plug-ins found by entry point: the one discovery rule of the provider and executor registries.

A plug-in is an object named by an entry point of a group (``opencode_tui.providers``,
``opencode_tui.executors``). The first one on ``sys.path`` wins for a name, as for imports; the
built-in ones are also named here so that a source tree that is not installed (or an editable install
made before the entry points existed) still finds them.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping

NAME = re.compile(r"[a-z][a-z0-9_-]*")


def entry_points(group: str, builtin: Mapping[str, str]) -> dict[str, importlib.metadata.EntryPoint]:
    """The entry points of ``group`` by name (``builtin``: name → ``module:object`` when not installed)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=group):
        found.setdefault(ep.name, ep)
    for name, value in builtin.items():
        found.setdefault(name, importlib.metadata.EntryPoint(name, value, group))
    return {name: ep for name, ep in found.items() if NAME.fullmatch(name)}
