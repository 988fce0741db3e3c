"""The pytest plugin behind the provider contract suite: options, fixtures and skips by capability.

Loaded with ``-p opencode_tui_core.sandbox.contract.plugin`` (``opencode-tui doctor --provider-contract NAME`` does
it). It parametrises every suite test that takes ``provider`` over the chosen providers and builds each
from the registry, so a third-party package needs nothing of this repository's ``tests/``.

A test environment that must build a provider its own way (a server to start first, a daemon to
check) overrides the ``contract_provider_factory`` fixture; ``contract_run_id`` and
``contract_spec_factory`` can be overridden the same way, and the hook
``pytest_opencode_contract_marks`` adds marks to one provider's tests.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from opencode_tui_core import provider_registry as registry
from opencode_tui_core.config import DEFAULT_IMAGE
from opencode_tui_core.sandbox.base import Sandbox, SandboxProvider, SandboxSpec

# Still honoured: the way the suite was narrowed before it shipped in the package.
PROVIDERS_ENV = "OPENCODE_TUI_CONTRACT_PROVIDERS"
DEFAULT_MEMORY_BYTES = 512 << 20

MakeSandbox = Callable[..., Awaitable[Sandbox]]
ProviderFactory = Callable[[str], contextlib.AbstractAsyncContextManager[SandboxProvider]]


class _Hooks:
    @pytest.hookspec(firstresult=False)
    def pytest_opencode_contract_marks(self, name: str) -> list[Any]:  # type: ignore[empty-body]
        """Marks for the contract tests of the provider ``name`` (each implementation returns a list)."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(_Hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("opencode-tui provider contract")
    group.addoption(
        "--contract-provider",
        action="append",
        default=[],
        metavar="NAME",
        help="run the contract suite against this registered provider (repeatable; default: all)",
    )
    group.addoption(
        "--contract-image",
        default=DEFAULT_IMAGE,
        metavar="IMAGE",
        help=f"the image of every contract sandbox (providers with images; default {DEFAULT_IMAGE})",
    )
    group.addoption(
        "--contract-config",
        metavar="FILE",
        help="an opencode-tui config file whose sandbox.<name> settings configure the provider",
    )


def pytest_configure(config: pytest.Config) -> None:
    # The suite's tests and fixtures are coroutines; run them without asking the caller for
    # ``-o asyncio_mode=auto`` (an explicit --asyncio-mode still wins).
    if getattr(config.option, "asyncio_mode", "auto") is None:
        config.option.asyncio_mode = "auto"
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): a test's time limit (with pytest-timeout)")
    config.addinivalue_line(
        "markers",
        "requires(*capabilities): a contract test that needs these provider capabilities "
        "(opencode_tui_core.provider_registry.Capabilities); skipped for a provider that does not declare them",
    )


def chosen_providers(config: pytest.Config) -> list[str]:
    """The providers to test: ``--contract-provider``, else $OPENCODE_TUI_CONTRACT_PROVIDERS, else all.

    An unknown name stops the run with the registry's message (which lists the registered ones)."""
    wanted: list[str] = []
    for value in [*config.getoption("contract_provider"), os.environ.get(PROVIDERS_ENV, "")]:
        wanted += [n.strip() for n in value.split(",") if n.strip()]
        if wanted:
            break
    if not wanted:
        return registry.names()
    try:
        return [registry.check_name(n) for n in dict.fromkeys(wanted)]
    except registry.UnknownProviderError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every test using this plug-in's ``provider`` fixture (the suite's, and a project's own tests
    # that take it), never one whose module defines a ``provider`` fixture of its own.
    defs = metafunc._arg2fixturedefs.get("provider")
    if not defs or getattr(defs[-1].func, "__module__", None) != __name__:
        return
    hook = metafunc.config.hook.pytest_opencode_contract_marks
    params = []
    for name in chosen_providers(metafunc.config):
        marks = [m for found in hook(name=name) for m in found]
        params.append(pytest.param(name, marks=marks, id=name))
    metafunc.parametrize("provider", params, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip, by capability and never by name, the tests a provider does not claim to meet."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("provider") if callspec is not None else None
        if name is None:
            continue
        caps = registry.get(name).capabilities
        for marker in item.iter_markers("requires"):
            missing = [c for c in marker.args if not getattr(caps, c)]
            if missing:
                item.add_marker(
                    pytest.mark.skip(reason=f"the {name} provider does not declare {', '.join(missing)}")
                )


def _settings_from_config(path: str | None, name: str) -> Any:
    if path is None:
        return registry.get(name).settings()
    from opencode_tui_core.config import load_config

    return load_config(Path(path)).sandbox.settings_for(name)


@pytest.fixture(scope="session")
def contract_run_id() -> str:
    """The ``opencode-tui.run`` label of every sandbox the suite creates."""
    return f"contract-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def contract_spec_factory(request: pytest.FixtureRequest, contract_run_id: str) -> Callable[..., SandboxSpec]:
    """``SandboxSpec`` for a contract sandbox; keyword arguments override its fields."""
    image = request.config.getoption("contract_image")

    def make(**overrides: Any) -> SandboxSpec:
        fields: dict[str, Any] = {
            "run_id": contract_run_id,
            "image": image,
            "memory_bytes": DEFAULT_MEMORY_BYTES,
            "cpus": 1.0,
            "ready_timeout_s": 30.0,
        }
        return SandboxSpec(**(fields | overrides))

    return make


@pytest.fixture
def contract_provider_factory(request: pytest.FixtureRequest) -> ProviderFactory:
    """Builds the provider ``name`` from the registry with its configured (or default) settings."""
    config_path = request.config.getoption("contract_config")

    @contextlib.asynccontextmanager
    async def make(name: str) -> AsyncIterator[SandboxProvider]:
        made = registry.get(name).provider(_settings_from_config(config_path, name))
        try:
            yield made
        finally:
            aclose = getattr(made, "aclose", None)
            if aclose is not None:
                await aclose()

    return make


@pytest.fixture
async def provider(
    request: pytest.FixtureRequest, contract_provider_factory: ProviderFactory
) -> AsyncIterator[SandboxProvider]:
    async with contract_provider_factory(request.param) as made:
        yield made


@pytest.fixture
async def make_sandbox(
    provider: SandboxProvider,
    contract_spec_factory: Callable[..., SandboxSpec],
    request: pytest.FixtureRequest,
) -> AsyncIterator[MakeSandbox]:
    """A factory for owned sandboxes from ``provider``. At teardown every one is released, and a
    provider that lists its sandboxes must no longer list any of them."""
    created: list[Sandbox] = []

    async def make(**overrides: Any) -> Sandbox:
        sandbox = await provider.create(contract_spec_factory(**overrides))
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
        if created and registry.get(request.node.callspec.params["provider"]).capabilities.listing:
            left = {r.sandbox_id for r in await provider.listed()} & {s.sandbox_id for s in created}
            assert not left, f"released sandboxes are still listed: {sorted(left)}"


@pytest.fixture
async def sandbox(make_sandbox: MakeSandbox) -> Sandbox:
    return await make_sandbox()
