"""``opencode-tui doctor``: the environment checks (core/preflight.py), each provider's own
``preflight()`` among them (``sweep`` lives in keep_commands)."""

from __future__ import annotations

import argparse
import asyncio

from core.config import AgentConfig
from core.exit_codes import ExitCode
from core.preflight import environment_checks


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = asyncio.run(environment_checks(AgentConfig()))
    if args.json:
        for c in checks:
            print(c.model_dump_json())
    else:
        marks = {"ok": "✓", "warn": "!", "fail": "✗"}
        for c in checks:
            print(f"{marks[c.status]} {c.name:<20} {c.detail}")
    return ExitCode.INFRA if any(c.status == "fail" for c in checks) else ExitCode.OK
