"""Themes as data: TOML files read into ``textual.theme.Theme`` objects.

Built-in themes ship inside the package (``opencode_tui/themes/*.toml``) so they work from an installed
wheel; the repository's top-level ``themes/`` directory documents the format. Extra directories (for user
themes) come from ``OPENCODE_TUI_THEME_DIR`` (``os.pathsep``-separated) or the ``extra_dirs`` argument;
a user file with a built-in theme's name replaces it.

A theme file holds the fields of :class:`textual.theme.Theme` at the top level and an optional
``[variables]`` table for CSS variables (the app's own ones are listed in :data:`APP_VARIABLES`).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Iterable
from pathlib import Path

from textual.theme import Theme

BUILTIN_DIR = Path(__file__).with_name("themes")
DEFAULT_THEME = "opencode-dark"
BUILTIN_ORDER = ("opencode-dark", "opencode-light", "opencode-high-contrast")
ENV_THEME_DIR = "OPENCODE_TUI_THEME_DIR"

# CSS variables the app's stylesheet uses beyond Textual's own; a theme may override any of them.
APP_VARIABLES: dict[str, str] = {
    "terminal-background": "$background",
    "terminal-foreground": "$foreground",
    "state-pending": "$foreground-muted",
    "state-running": "$secondary",
    "state-ok": "$success",
    "state-failed": "$error",
    "state-skipped": "$warning",
}

_FIELDS = {f.name for f in dataclasses.fields(Theme)}


class ThemeError(ValueError):
    """A theme file that cannot be used; the message names the file and the problem."""


def load_theme_file(path: Path) -> Theme:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ThemeError(f"{path}: cannot read theme: {exc}") from exc
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ThemeError(f"{path}: unknown theme keys {unknown}; allowed: {sorted(_FIELDS)}")
    if "name" not in data or "primary" not in data:
        raise ThemeError(f"{path}: a theme needs at least 'name' and 'primary'")
    variables = data.get("variables", {})
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise ThemeError(f"{path}: [variables] must map names to strings")
    try:
        return Theme(**data)
    except (TypeError, ValueError) as exc:
        raise ThemeError(f"{path}: {exc}") from exc


def theme_dirs(extra_dirs: Iterable[Path] = ()) -> list[Path]:
    dirs = [BUILTIN_DIR]
    env = os.environ.get(ENV_THEME_DIR, "")
    dirs += [Path(p) for p in env.split(os.pathsep) if p]
    dirs += [Path(p) for p in extra_dirs]
    return dirs


def load_themes(extra_dirs: Iterable[Path] = ()) -> dict[str, Theme]:
    """All themes, built-ins first (in :data:`BUILTIN_ORDER`), then user themes by name."""
    found: dict[str, Theme] = {}
    for directory in theme_dirs(extra_dirs):
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.toml")):
            theme = load_theme_file(path)
            found[theme.name] = theme
    ordered = {name: found[name] for name in BUILTIN_ORDER if name in found}
    ordered.update({name: theme for name, theme in found.items() if name not in ordered})
    return ordered


def next_theme(names: list[str], current: str) -> str:
    """The theme after ``current`` in ``names`` (wrapping); the first one if ``current`` is not there."""
    if not names:
        return current
    try:
        return names[(names.index(current) + 1) % len(names)]
    except ValueError:
        return names[0]
