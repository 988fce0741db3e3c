"""What every part of the local provider shares: its name, file names, host paths, failures."""

from __future__ import annotations

import pwd
import re
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from opencode_tui_core.failures import Evidence, FailureStage
from opencode_tui_core.sandbox.base import (
    SANDBOX_MODEL_SOCKET,
    parse_user_spec,
)
from opencode_tui_core.sandbox.errors import SandboxError, sandbox_failure

PROVIDER_NAME = "local"
LABEL_FILE = "sandbox.json"
OVERLAYS_DIR = "root-overlays"
RUN_DIR = str(PurePosixPath(SANDBOX_MODEL_SOCKET).parent)  # /run/opencode-tui
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ID_RE = re.compile(r"local-[0-9a-f]{12}")
_HOST_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Paths a workdir may not be at or under: they are the host's read-only system or kernel mounts.
_RESERVED = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/dev", "/sys")


# ---------------------------------------------------------------------------------------------
# failures


def _error(
    kind: str,
    operation: str,
    message: str,
    *,
    stage: FailureStage = FailureStage.SEED,
    exc: BaseException | None = None,
    evidence: Sequence[Evidence] = (),
    details: Any = None,
) -> SandboxError:
    """A SandboxError for this provider; ``stage`` defaults to ``seed`` (create/connect)."""
    failure = sandbox_failure(
        kind, stage=stage, operation=operation, message=message, cause=exc, evidence=evidence, details=details
    )
    return SandboxError(message, failure=failure)


def _resolve_user(value: str) -> tuple[int, int]:
    """A sandbox user (name, uid or uid:gid) as ids; names and default groups from the host's
    passwd, which is also the sandbox's (the local provider shows the host's /etc)."""
    name, uid, gid = parse_user_spec(value)
    try:
        pw = pwd.getpwnam(name) if name is not None else pwd.getpwuid(uid)  # type: ignore[arg-type]
    except KeyError:
        if name is not None:
            raise ValueError(
                f"no user {name!r} on this host (the local sandbox uses the host's users)"
            ) from None
        pw = None
    assert uid is not None or pw is not None
    uid = pw.pw_uid if uid is None else uid  # type: ignore[union-attr]
    if gid is None:
        gid = pw.pw_gid if pw is not None else uid
    return uid, gid


def _home_for(uid: int) -> tuple[str, str]:
    try:
        pw = pwd.getpwuid(uid)
        name, home = pw.pw_name, pw.pw_dir
    except KeyError:
        name, home = "sandbox", "/home/sandbox"
    p = PurePosixPath(home)
    if (
        not p.is_absolute()
        or str(p) == "/"
        or ".." in p.parts
        or any(p == PurePosixPath(r) or p.is_relative_to(r) for r in (*_RESERVED, "/tmp", RUN_DIR))
    ):
        home = "/home/sandbox"
    return name, home
