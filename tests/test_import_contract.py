"""The import contracts: `core` never imports Textual or the TUI package; the engine's layers
(pyproject.toml, exhaustive: every core module is placed); the in-sandbox programs import nothing
from opencode_tui_core; the front end uses only core's public surface (not the sandbox, runtime and model
packages' submodules); and no import circle among the modules of both packages.

Runs the real import-linter against this tree (must pass) and against copies of it with one planted
violation each (must fail, naming the planted import), so each contract is shown to bite.
"""

import ast
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


def _planted(tmp_path: Path, path: str, source: str) -> subprocess.CompletedProcess:
    """import-linter on a copy of this tree with one file added."""
    copy = tmp_path / "tree"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy)
    for pkg in ("opencode_tui_core", "opencode_tui"):
        shutil.copytree(ROOT / pkg, copy / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / path).write_text(source)
    return _lint(copy)


def test_contract_breaks_when_core_imports_textual(tmp_path):
    r = _planted(tmp_path, "opencode_tui_core/leak.py", "import textual  # forbidden\n")
    assert r.returncode != 0
    assert "BROKEN" in r.stdout
    assert "opencode_tui_core.leak -> textual" in r.stdout


def test_layers_break_when_a_lower_layer_imports_a_higher_one(tmp_path):
    # The sandbox layer reaching up into the episode: the shape of every upward import.
    r = _planted(
        tmp_path,
        "opencode_tui_core/sandbox/leak.py",
        "from opencode_tui_core.episode import Episode  # upward\n",
    )
    assert r.returncode != 0
    assert "The engine's layers" in r.stdout and "BROKEN" in r.stdout
    assert "opencode_tui_core.sandbox.leak -> opencode_tui_core.episode" in r.stdout


def test_layers_break_when_independent_siblings_import_each_other(tmp_path):
    # runtime and model share a layer as independent siblings.
    r = _planted(
        tmp_path, "opencode_tui_core/model/leak.py", "import opencode_tui_core.runtime.stream  # sideways\n"
    )
    assert r.returncode != 0
    assert "opencode_tui_core.model.leak -> opencode_tui_core.runtime.stream" in r.stdout


def test_layers_break_when_a_new_module_is_not_placed(tmp_path):
    # Exhaustive: a new top-level core module must be given a layer.
    r = _planted(tmp_path, "opencode_tui_core/unplaced.py", "X = 1\n")
    assert r.returncode != 0
    assert "opencode_tui_core.unplaced" in r.stdout


def test_inside_programs_break_when_they_import_core(tmp_path):
    r = _planted(
        tmp_path,
        "opencode_tui_core/inside/leak.py",
        "from opencode_tui_core.config import AgentConfig  # not on the sandbox\n",
    )
    assert r.returncode != 0
    assert "opencode_tui_core.inside" in r.stdout and "BROKEN" in r.stdout
    assert "opencode_tui_core.inside.leak -> opencode_tui_core.config" in r.stdout


def test_front_end_breaks_when_it_imports_an_engine_internal(tmp_path):
    r = _planted(
        tmp_path, "opencode_tui/leak.py", "from opencode_tui_core.sandbox.base import PtyHandle  # internal\n"
    )
    assert r.returncode != 0
    assert "public surface" in r.stdout and "BROKEN" in r.stdout
    assert "opencode_tui.leak -> opencode_tui_core.sandbox.base" in r.stdout


def test_front_end_may_use_the_packages_public_names(tmp_path):
    r = _planted(
        tmp_path, "opencode_tui/fine.py", "from opencode_tui_core.sandbox import PtyHandle  # public\n"
    )
    assert r.returncode == 0, r.stdout


def test_no_import_circles():
    """No two modules of core and opencode_tui import each other, directly or round a longer circle
    (function-level imports count; TYPE_CHECKING ones do not)."""
    import grimp

    graph = grimp.build_graph("opencode_tui_core", "opencode_tui", exclude_type_checking_imports=True)
    circles = [
        (a, b)
        for a in sorted(graph.modules)
        for b in sorted(graph.find_modules_directly_imported_by(a))
        if b in graph.modules and graph.chain_exists(importer=b, imported=a)
    ]
    assert circles == []


def test_inside_programs_import_only_the_standard_library():
    """Stricter than the contract (which names core and the engine's dependencies): every import of
    every program in core/inside/ is a standard-library module, as the sandbox's Python has it."""
    programs = sorted((ROOT / "core" / "inside").glob("*.py"))
    assert {p.name for p in programs} >= {"supervisor.py", "serve_runner.py", "relay.py"}
    for program in programs:
        for node in ast.walk(ast.parse(program.read_text(), str(program))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{program.name}: relative import"
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", f"{program.name} imports {name}"
