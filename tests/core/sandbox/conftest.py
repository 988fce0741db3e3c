"""Fixtures for the sandbox provider tests: real providers, real containers, nothing leaked.

Every container these tests create carries ``opencode-tui.run=<TEST_RUN_ID>``; at the end of the
session no container with that label may remain (leftovers are removed, then the check fails).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opencode_tui_core.sandbox.base import LABEL_RUN, Sandbox, SandboxProvider, SandboxSpec

TEST_RUN_ID = f"pytest-{uuid.uuid4().hex[:12]}"
BASE_IMAGE = "opencode-tui/base:bookworm"
DEFAULT_MEMORY = 512 << 20

MakeSandbox = Callable[..., Awaitable[Sandbox]]


def _docker_client() -> Any | None:
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
        return client
    except Exception:
        return None


def _labelled_containers(run_id: str) -> list[str]:
    """``docker ps -aq --filter label=opencode-tui.run=<run_id>`` (the CLI, independent of our code)."""
    if shutil.which("docker"):
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={LABEL_RUN}={run_id}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout.split()
    client = _docker_client()
    if client is None:
        return []
    return [c.id for c in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})]


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_containers() -> Any:
    yield
    if _docker_client() is None:
        return
    leaked = _labelled_containers(TEST_RUN_ID)
    if leaked:
        subprocess.run(["docker", "rm", "-f", *leaked], capture_output=True, timeout=60, check=False)
    assert not leaked, f"sandbox tests leaked containers labelled {LABEL_RUN}={TEST_RUN_ID}: {leaked}"


@pytest.fixture(scope="session")
def docker_client() -> Any:
    client = _docker_client()
    if client is None:
        pytest.skip("the Docker engine is not reachable (start it with scripts/start-dockerd)")
    try:
        client.images.get(BASE_IMAGE)
    except Exception:
        pytest.skip(f"image {BASE_IMAGE} is missing (build it with scripts/build-images)")
    return client


# ----------------------------------------------------------------------------------- opensandbox
# The real opensandbox-server (a test extra) on 127.0.0.1 with an API key, host networking and a temp
# state dir; the in-sandbox daemon is our execd stand-in (tests/fixtures/execd_standin), because the
# real execd is not obtainable on this machine. In host mode every sandbox's execd binds the same
# port (here one free port per test session), so OpenSandbox tests use one sandbox at a time.

STANDIN_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "execd_standin"


def load_standin_harness() -> Any:
    name = "execd_standin_harness"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, STANDIN_DIR / "harness.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def opensandbox_server(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running ``opensandbox-server`` for the session (its execd image is our stand-in)."""
    harness = load_standin_harness()
    if harness.server_executable() is None:
        pytest.skip("opensandbox-server is not installed (pip install -e '.[test]')")
    from opencode_tui_core.runtime.installer import default_cache_dir

    image = harness.ensure_standin_image(docker_client, BASE_IMAGE)
    server = harness.OpenSandboxServer(
        tmp_path_factory.mktemp("opensandbox"),
        image,
        run_label=(LABEL_RUN, TEST_RUN_ID),
        # Episodes bind the OpenCode runtime cache read-only into the sandbox (a host volume).
        allowed_host_paths=[str(default_cache_dir())],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def opensandbox_settings(server: Any, **overrides: Any) -> Any:
    from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxSettings

    fields: dict[str, Any] = {
        "url": server.url,
        "api_key_env": None,
        "sandbox_timeout_s": 900,
        "execd_port": server.execd_port,
    }
    fields.update(overrides)
    return OpenSandboxSettings(**fields)


OPENSANDBOX_KEY_ENV = "OPENCODE_TUI_TEST_OPENSANDBOX_KEY"  # the server's API key, for episode configs


def opensandbox_agent_config(server: Any, **sections: Any) -> Any:
    """An episode's config on the test OpenSandbox server (key read from ``OPENSANDBOX_KEY_ENV``, one
    attempt); ``sections`` are further top-level config sections, e.g. ``budgets={"close_s": 60}``."""
    from opencode_tui_core.config import AgentConfig

    settings = {"url": server.url, "api_key_env": OPENSANDBOX_KEY_ENV, "sandbox_timeout_s": 1800}
    return AgentConfig.model_validate(
        {
            "sandbox": {
                "provider": "opensandbox",
                "opensandbox": settings | {"execd_port": server.execd_port},
            },
            "policy": {"max_attempts": 1},
            **sections,
        }
    )


@pytest.fixture(scope="session")
def standin_harness() -> Any:
    """The execd stand-in's test harness module (server process, image, fault controls)."""
    return load_standin_harness()


@pytest.fixture
def opensandbox_settings_factory(opensandbox_server: Any) -> Callable[..., Any]:
    """``OpenSandboxSettings`` for the test server, with overrides."""
    return lambda **overrides: opensandbox_settings(opensandbox_server, **overrides)


# The contract suite (core/sandbox/contract) runs against every registered provider, the built-in ones
# and any plug-in on the path; --contract-provider or OPENCODE_TUI_CONTRACT_PROVIDERS narrows it. The
# built-ins need this test environment (a Docker engine, bwrap, the OpenSandbox server fixture); a
# plug-in is made from its default settings, as the shipped plug-in does.
_BUILTIN_MARKS: dict[str, list[Any]] = {
    "docker": [pytest.mark.docker],
    "local": [pytest.mark.bwrap],
    "opensandbox": [pytest.mark.docker, pytest.mark.opensandbox],
}


def pytest_opencode_contract_marks(name: str) -> list[Any]:
    return _BUILTIN_MARKS.get(name, [])


@pytest.fixture(scope="session")
def contract_run_id() -> str:
    return TEST_RUN_ID  # the label the leak check above looks for


@pytest.fixture
def contract_provider_factory(
    request: pytest.FixtureRequest, contract_provider_factory: Callable[[str], Any]
) -> Callable[[str], Any]:
    default = contract_provider_factory  # the plug-in's own, for providers from other packages

    @contextlib.asynccontextmanager
    async def make(name: str) -> AsyncIterator[SandboxProvider]:
        if name == "docker":
            request.getfixturevalue("docker_client")
            from opencode_tui_core.sandbox.docker.provider import DockerProvider

            yield DockerProvider()
        elif name == "opensandbox":
            server = request.getfixturevalue("opensandbox_server")
            from opencode_tui_core.sandbox.opensandbox.provider import OpenSandboxProvider

            os_provider = OpenSandboxProvider(opensandbox_settings(server), api_key=server.api_key)
            try:
                yield os_provider
            finally:
                await os_provider.aclose()
        elif name == "local":
            from opencode_tui_core.sandbox.local.provider import LocalProvider

            yield LocalProvider()
        else:
            async with default(name) as made:
                yield made

    return make


def sandbox_spec(**overrides: Any) -> SandboxSpec:
    fields: dict[str, Any] = {
        "run_id": TEST_RUN_ID,
        "image": BASE_IMAGE,
        "memory_bytes": DEFAULT_MEMORY,
        "cpus": 1.0,
        "ready_timeout_s": 30.0,
    }
    fields.update(overrides)
    return SandboxSpec(**fields)


@pytest.fixture(scope="session")
def test_run_id() -> str:
    """The ``opencode-tui.run`` label value of every container this test session creates."""
    return TEST_RUN_ID


@pytest.fixture
def spec_factory() -> Callable[..., SandboxSpec]:
    return sandbox_spec
