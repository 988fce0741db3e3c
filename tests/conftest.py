"""Session-wide settings: every sandbox a test creates carries one owner label, and none may leak.

Under pytest-xdist (``scripts/test`` runs ``-n 3 --dist loadgroup``) every worker is a session of its
own: it gets an owner of its own (checks that count "our" containers must not see a neighbour's), and
the tests that share an expensive fixture are kept on one worker (``xdist_group``, set below).
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

# The provider contract suite's fixtures and options (shipped in the package, for third-party providers
# too); tests/core/sandbox/conftest.py gives the built-in providers this repository's test environment.
pytest_plugins = ["opencode_tui_core.sandbox.contract.plugin"]

TEST_OWNER = f"pytest-{uuid.uuid4().hex[:10]}"
# Set before any provider is created, so every owned sandbox of this session carries it. An xdist
# worker inherits the controller's value (its conftest ran first) and adds its own name to it: each
# worker's leak check and "no container of ours is left" assertions then count only its own sandboxes.
os.environ.setdefault("OPENCODE_TUI_OWNER", TEST_OWNER)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and not os.environ["OPENCODE_TUI_OWNER"].endswith(f"-{_WORKER}"):
    os.environ["OPENCODE_TUI_OWNER"] = f"{os.environ['OPENCODE_TUI_OWNER']}-{_WORKER}"

# The marker of the tests that use the OpenSandbox server, a session fixture worth starting once rather
# than once per worker (the contract tests reach it through ``request.getfixturevalue``).
_SHARED_SERVER_MARK = "opensandbox"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the marks into node-id suffixes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup``, keep together what shares set-up: the tests of a module that use one
    of its module-scoped fixtures (one sample batch, one Ray head, one private dockerd) form one group
    per fixture parameter, and the tests that use the OpenSandbox server another. The rest are
    scheduled one test at a time. Without xdist the marks are inert."""
    for item in items:
        if any(True for _ in item.iter_markers("xdist_group")):
            continue
        if any(True for _ in item.iter_markers(_SHARED_SERVER_MARK)):
            item.add_marker(pytest.mark.xdist_group(_SHARED_SERVER_MARK))
            continue
        info = getattr(item, "_fixtureinfo", None)
        callspec = getattr(item, "callspec", None)
        shared = []
        for name in info.names_closure if info is not None else ():
            defs = info.name2fixturedefs.get(name)
            if defs and defs[-1].scope in ("module", "class", "package"):
                param = callspec.params.get(name) if callspec is not None else None
                shared.append(name if param is None else f"{name}={param}")
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.path.name}:{','.join(sorted(shared))}"))


@pytest.fixture(scope="session")
def test_owner() -> str:
    return os.environ["OPENCODE_TUI_OWNER"]


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_owned_containers():
    yield
    owner = os.environ["OPENCODE_TUI_OWNER"]
    try:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=opencode-tui.owner={owner}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return
    leaked = out.stdout.split()
    if leaked:
        subprocess.run(["docker", "rm", "-f", *leaked], capture_output=True, timeout=60)
    assert not leaked, f"tests leaked containers owned by {owner}: {leaked}"
