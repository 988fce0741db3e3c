"""The provider contract suite, shipped with the package: what every sandbox provider owes the engine.

``suite.py`` holds the tests, ``plugin.py`` the pytest plugin that runs them against a registered
provider; ``opencode-tui doctor --provider-contract NAME`` runs both (docs/providers.md).
"""
