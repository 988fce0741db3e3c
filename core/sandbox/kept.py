"""Kept sandboxes: the host-side list that lets `attach` find one and `sweep` leave it alone.

A run that keeps its sandbox (``--keep-sandbox``, ``k``) ends without releasing it. The episode then
calls ``keep_for_later``: the provider makes the sandbox outlive the engine (``Sandbox.keep``) and a
record ``<kept dir>/<provider>-<sandbox id>.json`` names it, its run and its run directory. Labels set
at create cannot say this (Docker labels are immutable), hence a file. ``sweep`` removes the record
with the sandbox. The kept dir is ``$OPENCODE_TUI_KEPT_DIR`` or ``$XDG_STATE_HOME/opencode-tui/kept``.
"""

from __future__ import annotations

import contextlib
import os
import re
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.sandbox.base import Sandbox, default_owner

KEPT_DIR_ENV = "OPENCODE_TUI_KEPT_DIR"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class KeptRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    provider: str
    sandbox_id: str
    run_id: str
    run_dir: str | None = None
    owner: str = Field(default_factory=default_owner)
    kept_at: datetime = Field(default_factory=utcnow)


def kept_dir() -> Path:
    explicit = os.environ.get(KEPT_DIR_ENV)
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "opencode-tui" / "kept"


def _path(provider: str, sandbox_id: str) -> Path:
    return kept_dir() / f"{_UNSAFE.sub('_', provider)}-{_UNSAFE.sub('_', sandbox_id)}.json"


def remember(record: KeptRecord) -> Path:
    d = kept_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = _path(record.provider, record.sandbox_id)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(record.model_dump_json(indent=2) + "\n")
    tmp.replace(target)
    return target


def forget(provider: str, sandbox_id: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _path(provider, sandbox_id).unlink()


def all_kept() -> list[KeptRecord]:
    out: list[KeptRecord] = []
    d = kept_dir()
    if not d.is_dir():
        return out
    for f in sorted(d.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append(KeptRecord.model_validate_json(f.read_text()))
    return out


def is_kept(provider: str, sandbox_id: str) -> bool:
    return _path(provider, sandbox_id).exists()


def find(ref: str) -> list[KeptRecord]:
    """Kept sandboxes whose id is ``ref`` or starts with it (a Docker short id)."""
    exact = [r for r in all_kept() if r.sandbox_id == ref]
    return exact or [r for r in all_kept() if r.sandbox_id.startswith(ref)]


async def keep_for_later(sandbox: Sandbox, run_id: str, run_dir: Path | None) -> KeptRecord:
    """Make ``sandbox`` outlive this process and record it for ``attach`` and ``sweep``."""
    await sandbox.keep()
    record = KeptRecord(
        provider=sandbox.provider,
        sandbox_id=sandbox.sandbox_id,
        run_id=run_id,
        run_dir=os.path.abspath(run_dir) if run_dir is not None else None,  # noqa: ASYNC240 (no I/O)
    )
    remember(record)
    return record
