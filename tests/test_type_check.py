"""The type checker's strictness at phase boundaries: scripts/test runs mypy on this tree (at no errors);
these tests show the configuration in pyproject.toml bites where it must. A handle that one episode
phase passes to the next, typed ``Any`` with the real type in a comment, is an error in
``opencode_tui_core.episode.*``; the same handle with its real type passes, and so does ``Any`` in a module the
override does not cover.

Runs the real mypy with this repository's pyproject.toml on a small tree of planted modules.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HANDLE = """from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Harness:
    layout: str = "/session"


@dataclass(frozen=True)
class Installed:
    harness: {annotation}
"""


def _mypy(tmp_path: Path, module: str, source: str) -> subprocess.CompletedProcess:
    """mypy, configured as scripts/test runs it, on one planted module (dotted name ``module``)."""
    tree = tmp_path / "tree"
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    parts = module.split(".")
    for depth in range(1, len(parts)):
        package = tree.joinpath(*parts[:depth])
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
    target = tree.joinpath(*parts[:-1], parts[-1] + ".py")
    target.write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(tmp_path / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            str(target.relative_to(tree)),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_any_typed_phase_handle_is_an_error(tmp_path):
    r = _mypy(tmp_path, "opencode_tui_core.episode.planted", HANDLE.format(annotation="Any  # Harness"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'Explicit "Any" is not allowed  [explicit-any]' in r.stdout
    assert "opencode_tui_core/episode/planted.py:13: error" in r.stdout


def test_the_same_handle_with_its_real_type_passes(tmp_path):
    r = _mypy(tmp_path, "opencode_tui_core.episode.planted", HANDLE.format(annotation="Harness"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_any_outside_the_phase_boundaries_is_allowed(tmp_path):
    # JSON payloads (e.g. an event's ``dict[str, Any]``) keep Any where no override applies.
    r = _mypy(tmp_path, "opencode_tui_core.planted", HANDLE.format(annotation="Any"))
    assert r.returncode == 0, r.stdout + r.stderr
