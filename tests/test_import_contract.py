"""The import contract: `core` never imports Textual or the TUI package.

Runs the real import-linter against this tree (must pass) and against a copy of it where a core
module imports textual (must fail), so the contract itself is shown to bite.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    # import-linter imports from sys.path: put the tree under test first.
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, '.'); from importlinter.cli import lint_imports_command;"
            " lint_imports_command()",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_contract_holds_on_this_tree():
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KEPT" in r.stdout


def test_contract_breaks_when_core_imports_textual(tmp_path):
    copy = tmp_path / "tree"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy)
    for pkg in ("core", "opencode_tui"):
        shutil.copytree(ROOT / pkg, copy / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "core" / "leak.py").write_text("import textual  # forbidden\n")
    r = _lint(copy)
    assert r.returncode != 0
    assert "BROKEN" in r.stdout
    assert "core.leak -> textual" in r.stdout
