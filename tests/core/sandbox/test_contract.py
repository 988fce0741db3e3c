"""The provider contract suite shipped in the package (core/sandbox/contract/suite.py), run here against
every registered provider: the built-in ones get this repository's test environment (a Docker engine,
bwrap, the OpenSandbox server) through ``contract_provider_factory`` in conftest.py."""

from opencode_tui_core.sandbox.contract.suite import *  # noqa: F403
