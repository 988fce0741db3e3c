"""``opencode-tui doctor``: the environment checks (core/preflight.py), each provider's own
``preflight()`` among them, then the warm pool's recent batches and leftovers (core/warm_report.py)
(``sweep`` lives in keep_commands)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from opencode_tui_core import provider_registry as registry
from opencode_tui_core.config import ConfigError, load_config
from opencode_tui_core.exit_codes import ExitCode
from opencode_tui_core.preflight import environment_checks
from opencode_tui_core.provider_registry import Check
from opencode_tui_core.warm_report import warm_checks

CONTRACT_PLUGIN = "opencode_tui_core.sandbox.contract.plugin"
CONTRACT_SUITE = "opencode_tui_core.sandbox.contract.suite"
_CONTRACT_NEEDS = ("pytest", "pytest_asyncio")


def run_provider_contract(name: str, image: str | None, config_path: str | None) -> int:
    """The shipped contract suite against ``name``, in a pytest of its own (its output is the report).

    pytest reads no project's settings here (``-c`` an empty file): the suite's result must not
    depend on the directory it is started from."""
    try:
        registry.check_name(name)
    except registry.UnknownProviderError as exc:
        print(f"opencode-tui doctor: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    missing = [m for m in _CONTRACT_NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"opencode-tui doctor: the provider contract suite runs under pytest ({', '.join(missing)} "
            "missing); install it with: pip install 'opencode-tui[contract]'",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    argv = [sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", os.getcwd()]
    argv += ["-p", CONTRACT_PLUGIN, "-p", "no:cacheprovider", "--pyargs", CONTRACT_SUITE]
    argv += ["--contract-provider", name, "-rs", "-q"]
    if image:
        argv += ["--contract-image", image]
    if config_path:
        argv += ["--contract-config", os.path.abspath(config_path)]
    code = subprocess.run(argv, check=False).returncode
    verdict = {0: "passes", 1: "FAILS"}.get(code, f"could not be run (pytest exit {code})")
    print(f"opencode-tui doctor: the {name} provider {verdict} the contract suite", file=sys.stderr)
    return {0: ExitCode.OK, 1: ExitCode.INFRA, 2: ExitCode.INTERRUPTED}.get(code, ExitCode.USAGE)


def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"opencode-tui doctor: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if args.provider_contract:
        return run_provider_contract(args.provider_contract, args.contract_image, args.config)
    if args.contract_image:
        print("opencode-tui doctor: --contract-image goes with --provider-contract NAME", file=sys.stderr)
        return ExitCode.USAGE
    runs_dir = Path(args.runs_dir or config.runs_dir)

    async def all_checks() -> list[Check]:
        return [*await environment_checks(config), *await warm_checks(config, runs_dir)]

    checks = asyncio.run(all_checks())
    if args.json:
        for c in checks:
            print(c.model_dump_json())
    else:
        marks = {"ok": "✓", "warn": "!", "fail": "✗"}
        for c in checks:
            print(f"{marks[c.status]} {c.name:<20} {c.detail}")
    return ExitCode.INFRA if any(c.status == "fail" for c in checks) else ExitCode.OK
