"""What the wheel installs: only import names of this distribution's own. The engine's folder in the
repository is ``core/``; a top-level ``core`` in site-packages is a name any other distribution may
claim too (one install then overwrites the other), so the wheel installs it as ``opencode_tui_core``.

Builds the real wheel from a copy of this tree with pip and reads what it would put in site-packages."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
import zipfile

import pytest

from tests.wheel import REPO, build_wheel

# The distribution's import names: the front end (CLI and TUI) and the engine.
OURS = {"opencode_tui", "opencode_tui_core"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    return zipfile.ZipFile(build_wheel(tmp_path_factory.mktemp("wheel")))


def test_the_wheel_installs_no_top_level_name_but_its_own(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    info = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
    assert len(info) == 1 and next(iter(info)).startswith("opencode_tui-")
    top = {n.split("/")[0] for n in names} - info
    assert top == OURS, f"the wheel installs top-level names that are not this project's: {top - OURS}"
    [listed] = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert set(wheel.read(listed).decode().split()) == OURS


def test_the_wheel_carries_the_engine_whole_under_its_own_name(wheel: zipfile.ZipFile) -> None:
    """Every module of core/ (and the in-sandbox programs' data files, the bundled samples, the Gym
    server directory) is in
    the wheel as opencode_tui_core/..., and every entry point names a module that is there."""
    names = set(wheel.namelist())
    engine = REPO / "core"
    for path in engine.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".js", ".sh") and "__pycache__" not in path.parts:
            assert f"opencode_tui_core/{path.relative_to(engine).as_posix()}" in names, path
    assert "opencode_tui_core/sample_tasks/hello-file/task.yaml" in names
    # The Gym server directory whole (NEMO_GYM_EXTRA_ROOTS=$(opencode-tui gym-root) finds it there).
    gym = "opencode_tui_core/gym/root/responses_api_agents/opencode_tui_agent"
    for part in ("app.py", "requirements.txt", "configs/opencode_tui_agent.yaml"):
        assert f"{gym}/{part}" in names, part
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    targets = [project["scripts"]["opencode-tui"]] + [
        target for group in project["entry-points"].values() for target in group.values()
    ]
    for target in targets:
        module = target.split(":")[0]
        assert module.split(".")[0] in OURS, target
        as_path = module.replace(".", "/")
        assert f"{as_path}.py" in names or f"{as_path}/__init__.py" in names, target


def test_no_module_of_ours_imports_the_folder_name() -> None:
    """``import core`` works only from a checkout (and loads a second copy of every module there):
    nothing in the package, the tests, the benchmarks or the scripts says it."""
    offenders = []
    for root in ("core", "opencode_tui", "tests", "benchmarks", "scripts"):
        for path in sorted((REPO / root).rglob("*")):
            if not path.is_file() or "fixtures" in path.parts:
                continue
            first_line = path.read_bytes()[:80].split(b"\n")[0]
            if path.suffix != ".py" and not (first_line.startswith(b"#!") and b"python" in first_line):
                continue
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                modules = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and node.level == 0
                    else []
                )
                offenders += [
                    f"{path.relative_to(REPO)}:{node.lineno}" for m in modules if m.split(".")[0] == "core"
                ]
    assert offenders == []


def _requirement_name(spec: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", spec.strip(), maxsplit=1)[0]


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_package_the_tests_import_is_declared() -> None:
    """A fresh ``pip install -e '.[test]'`` (plus the ``ray`` and ``realmodel`` extras scripts/test
    installs) can run every test module: each third-party package a test imports is a dependency or in
    one of those extras. (``hypothesis`` once was not: tests/core/test_artifacts.py failed to import.)"""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = {
        _normalized(_requirement_name(r))
        for r in [*project["dependencies"], *extras["test"], *extras["ray"], *extras["realmodel"]]
    }
    declared.add("opencode-tui")
    providers = importlib.metadata.packages_distributions()
    ours = {
        "opencode_tui",
        "opencode_tui_core",
        "tests",
        "toy_provider",
        "_bench",
        "bench_tui",
        "bench_episode",
    }
    local = {p.stem for p in (REPO / "tests").rglob("*.py")} | {
        p.name for p in (REPO / "tests").rglob("*") if p.is_dir()
    }
    missing: dict[str, str] = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        if "fixtures" in path.parts and "execd_standin" not in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ours or top in local or top == "__future__":
                    continue
                dists = {_normalized(d) for d in providers.get(top, [top])}
                if not dists & declared:
                    missing[top] = f"{path.relative_to(REPO)}:{node.lineno} ({', '.join(sorted(dists))})"
    assert missing == {}, "imported by tests but declared in no extra scripts/test installs: " + str(missing)
