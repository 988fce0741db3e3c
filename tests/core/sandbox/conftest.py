"""Fixtures for the sandbox provider tests: real providers, real containers, nothing leaked.

Every container these tests create carries ``opencode-tui.run=<TEST_RUN_ID>``; at the end of the
session no container with that label may remain (leftovers are removed, then the check fails).
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from core.sandbox.base import LABEL_RUN, Sandbox, SandboxProvider, SandboxSpec

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


@pytest.fixture(
    params=[
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("local", marks=pytest.mark.bwrap),
    ]
)
async def provider(request: pytest.FixtureRequest) -> SandboxProvider:
    if request.param == "docker":
        request.getfixturevalue("docker_client")
        from core.sandbox.docker import DockerProvider

        return DockerProvider()
    try:
        from core.sandbox.local import LocalProvider
    except ImportError:
        pytest.skip("local provider not implemented yet")
    return LocalProvider()


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


@pytest.fixture
async def make_sandbox(provider: SandboxProvider) -> AsyncIterator[MakeSandbox]:
    """A factory for owned sandboxes from ``provider``; every one is released at teardown."""
    created: list[Sandbox] = []

    async def make(**overrides: Any) -> Sandbox:
        sandbox = await provider.create(sandbox_spec(**overrides))
        created.append(sandbox)
        return sandbox

    try:
        yield make
    finally:
        errors: list[BaseException] = []
        for sandbox in created:
            try:
                await sandbox.release()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
async def sandbox(make_sandbox: MakeSandbox) -> Sandbox:
    return await make_sandbox()
