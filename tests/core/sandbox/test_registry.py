"""Providers as plug-ins: the registry, provider-owned settings, capabilities instead of names, one
exception module. (The toy provider from another package is in tests/toy_provider.)"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from opencode_tui_core import provider_registry as registry
from opencode_tui_core.config import AgentConfig, ConfigError, load_config
from opencode_tui_core.sandbox import errors
from opencode_tui_core.sandbox.base import SandboxSpec

ROOT = Path(__file__).resolve().parents[3]
BUILTIN_NAMES = ("docker", "local", "opensandbox")

# String constants equal to a provider name that may stay outside core/sandbox/, with the reason.
ALLOWED_NAMES = {
    ("core/__init__.py", "local"): "the default of sandbox.provider (one place, free of imports)",
    **{
        (
            "core/provider_names.py",
            name,
        ): "the built-ins' fallback entry points (a test keeps them equal to pyproject)"
        for name in BUILTIN_NAMES
    },
}


# ------------------------------------------------------------------------------- no provider names


def _about_the_executor(node: ast.AST, parents: dict[ast.AST, ast.AST], source: str) -> bool:
    """``local`` is also the name of the batch executor (``executor.name: local|ray``), a homonym:
    a constant whose own statement, or whose enclosing class or function (by name), is about the
    executor. (Only the innermost statement's text counts: an ``if`` about the executor does not
    excuse a provider comparison inside it.)"""
    innermost = True
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            return "executor" in node.name.lower()
        if isinstance(node, ast.stmt) and innermost:
            innermost = False
            if "executor" in (ast.get_source_segment(source, node) or "").lower():
                return True
    return False


def _violations(root: Path, packages: tuple[str, ...] = ("core", "opencode_tui")) -> list[str]:
    """Every place outside core/sandbox/ that names a built-in provider: a string constant equal to
    its name (a comparison, a choices list, a default) or an import of its package."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("core/sandbox/"):
                continue
            source = path.read_text()
            tree = ast.parse(source, rel)
            parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    word = node.value.lower()
                    if (
                        word in BUILTIN_NAMES
                        and (rel, word) not in ALLOWED_NAMES
                        and not (word == "local" and _about_the_executor(node, parents, source))
                    ):
                        found.append(f"{rel}:{node.lineno}: {node.value!r}")
                elif isinstance(node, ast.Import | ast.ImportFrom):
                    modules = (
                        [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    )
                    for module in modules:
                        parts = module.split(".")
                        if (
                            parts[:2] == ["opencode_tui_core", "sandbox"]
                            and len(parts) > 2
                            and parts[2] in BUILTIN_NAMES
                        ):
                            found.append(f"{rel}:{node.lineno}: imports {module}")
                        elif parts[0] == "docker":
                            found.append(f"{rel}:{node.lineno}: imports {module}")
                elif isinstance(node, ast.Attribute) and node.attr.lower() in BUILTIN_NAMES:
                    found.append(f"{rel}:{node.lineno}: .{node.attr}")
    return found


def test_nothing_outside_core_sandbox_names_a_provider() -> None:
    assert _violations(ROOT) == []


def test_the_name_check_finds_a_planted_provider_comparison(tmp_path: Path) -> None:
    (tmp_path / "core" / "runtime").mkdir(parents=True)
    (tmp_path / "opencode_tui").mkdir()
    (tmp_path / "core" / "runtime" / "leak.py").write_text(
        'def f(config):\n    return config.sandbox.provider == "opensandbox"\n'
    )
    (tmp_path / "opencode_tui" / "leak.py").write_text(
        "from opencode_tui_core.sandbox.local.provider import LocalProvider\nCHOICES = ['docker', 'x']\n"
        # the executor's "local" is a homonym; the provider's is not, even beside it
        "def g(config):\n    if config.executor.name == 'local':\n        return config.sandbox.provider == 'local'\n"
    )
    assert _violations(tmp_path) == [
        "core/runtime/leak.py:2: 'opensandbox'",
        "opencode_tui/leak.py:1: imports opencode_tui_core.sandbox.local.provider",
        "opencode_tui/leak.py:2: 'docker'",
        "opencode_tui/leak.py:5: 'local'",
    ]


# ---------------------------------------------------------------------------------------- registry


def test_the_builtin_entry_points_are_declared_in_pyproject() -> None:
    """The fallback table (for installs made before the entry points existed) and pyproject.toml
    say the same thing."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][registry.ENTRY_POINT_GROUP] == registry.BUILTIN


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_each_builtin_plugin_is_complete(name: str) -> None:
    plugin = registry.get(name)
    assert isinstance(plugin, registry.ProviderPlugin) and plugin.name == name and plugin.summary
    assert plugin.settings_model.model_config.get("extra") == "forbid"
    assert isinstance(plugin.capabilities, registry.Capabilities)
    made = plugin.provider(plugin.settings())
    assert made.name == name
    assert name in registry.names()


def test_an_unknown_provider_is_refused_with_the_registered_names() -> None:
    with pytest.raises(
        registry.UnknownProviderError, match=r"'dockr'; registered: docker, local, opensandbox"
    ):
        registry.get("dockr")
    with pytest.raises(
        ConfigError, match=r"sandbox\.provider: unknown sandbox provider 'dockr'; registered: "
    ):
        load_config(None, {"sandbox": {"provider": "dockr"}})


# -------------------------------------------------------------------------------- provider settings


@pytest.mark.parametrize(
    ("sandbox", "says"),
    [
        ({"opensandbox": {"urll": "http://x"}}, "sandbox.opensandbox.urll: unknown field"),
        (
            {"opensandbox": {"url": "ftp://x"}},
            "sandbox.opensandbox.url: opensandbox url 'ftp://x' must start",
        ),
        (
            {"docker": {"api_timeout_s": 0}},
            "sandbox.docker.api_timeout_s: api_timeout_s must be a finite number",
        ),
        ({"local": {"cgroups": "maybe"}}, "sandbox.local.cgroups: Input should be a valid boolean"),
        ({"opensandbx": {"url": "http://x"}}, "sandbox.opensandbx: unknown field"),
    ],
)
def test_a_typo_in_provider_settings_names_the_field(tmp_path: Path, sandbox: dict, says: str) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"sandbox": sandbox}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}: {says}" in str(info.value)


def test_provider_settings_are_the_providers_own_models_and_survive_a_round_trip() -> None:
    from opencode_tui_core.sandbox.docker.settings import DockerSettings
    from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxSettings

    config = AgentConfig.model_validate(
        {
            "sandbox": {
                "provider": "opensandbox",
                "opensandbox": {"url": "http://127.0.0.1:9/", "max_connections": 3},
            }
        }
    )
    settings = config.sandbox.settings_for()
    assert isinstance(settings, OpenSandboxSettings) and settings.url == "http://127.0.0.1:9"
    assert config.sandbox.opensandbox is settings  # the key named after the provider
    assert config.sandbox.settings_for("docker") == DockerSettings()  # not given: the defaults
    again = AgentConfig.model_validate(config.model_dump(mode="json"))  # as run.json stores it
    assert again.sandbox.settings_for() == settings


# -------------------------------------------------------------------------------------- exceptions


def test_every_sandbox_exception_is_defined_in_errors_py() -> None:
    public = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    assert {"SandboxError", "SandboxClosedError", "ExpectedRefusal", "UnsafeArchiveError"} <= public
    assert "SandboxFileNotFoundError" in public
    elsewhere = []
    for path in sorted((ROOT / "core" / "sandbox").rglob("*.py")):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if node.name in public or bases & public:
                    elsewhere.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert elsewhere == []


@pytest.mark.bwrap
async def test_catching_the_shared_file_not_found_catches_the_local_providers(tmp_path: Path) -> None:
    """The local provider used to raise its own look-alike SandboxFileNotFoundError."""
    from opencode_tui_core.sandbox import base
    from opencode_tui_core.sandbox.local.provider import LocalProvider

    sb = await LocalProvider(base_dir=tmp_path).create(SandboxSpec(run_id="pytest-errors"))
    try:
        with pytest.raises(errors.SandboxFileNotFoundError):
            await sb.download_tar("/app/no/such/file")
        try:
            await sb.download_tar("/tmp/nothing-here")
        except base.SandboxFileNotFoundError as exc:  # the name callers import from base
            assert isinstance(exc, FileNotFoundError)
        else:
            pytest.fail("download_tar of a missing path did not raise")
    finally:
        await sb.release()
