"""What a local sandbox sees of the host: its binds (workdir, overlays, the model socket), the bubblewrap
filesystem arguments built from them, and how a sandbox path maps to a host path."""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from opencode_tui_core.failures import (
    CommandDetails,
    Delivery,
    FailureStage,
)
from opencode_tui_core.sandbox.base import (
    SANDBOX_MODEL_SOCKET,
)
from opencode_tui_core.sandbox.errors import SandboxError
from opencode_tui_core.sandbox.local.bwrap import _system_fs_args
from opencode_tui_core.sandbox.local.common import (
    OVERLAYS_DIR,
    RUN_DIR,
    _error,
)
from opencode_tui_core.sandbox.local.files import (
    _DIR_FLAGS,
    _SymlinkInTheWay,
    _walk,
)

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# the sandbox


@functools.lru_cache(maxsize=8)
def _etc_allowed(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """The ``/etc`` names shown in a sandbox, as one expression: matched once per name (the patterns
    one by one were most of a local sandbox's set-up in the controller)."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns) or r"(?!)")


@dataclass(frozen=True)
class Bind:
    target: str  # path inside the sandbox
    source: Path  # host path
    writable: bool
    optional: bool = False  # --bind-try: the model socket may not exist yet


class SandboxBinds:
    """The binds and path translation of ``LocalSandbox``."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into
        _fs_cache: list[str] | None

        def __getattr__(self, name: str) -> Any: ...

    @property
    def overlays(self) -> Path:
        return self.state_dir / OVERLAYS_DIR

    def overlay_path(self, sandbox_path: str) -> Path:
        """Host path of a path inside one of the overlay binds (e.g. the workdir)."""
        return self.overlays / PurePosixPath(sandbox_path).relative_to("/")

    def _compute_binds(self) -> list[Bind]:
        targets = [self.spec.workdir, self.home, "/tmp", "/dev/shm", RUN_DIR]
        binds: list[Bind] = []
        seen: list[str] = []
        for t in targets:
            # A target inside another overlay is the same host directory already: no second bind.
            if any(t == s or PurePosixPath(t).is_relative_to(s) for s in seen):
                continue
            seen.append(t)
            binds.append(Bind(t, self.overlay_path(t), True))
        if self.spec.model_socket:
            binds.append(Bind(SANDBOX_MODEL_SOCKET, Path(self.spec.model_socket), True, optional=True))
        for m in self.spec.mounts:
            binds.append(Bind(m.target, Path(m.source), not m.read_only))
        # Parents before children; for equal depth, later binds (mounts) cover earlier ones.
        order = {id(b): i for i, b in enumerate(binds)}
        return sorted(binds, key=lambda b: (len(PurePosixPath(b.target).parts), order[id(b)]))

    def _fs_args(self) -> list[str]:
        if self._fs_cache is None:
            self._fs_cache = self._build_fs_args()
        return list(self._fs_cache)

    def _build_fs_args(self) -> list[str]:
        args = _system_fs_args()
        args += ["--dir", "/etc"]
        try:
            names = sorted(os.listdir("/etc"))
        except OSError:
            names = []
        allowed = _etc_allowed(tuple(self._provider.etc_allow))
        for name in names:
            if not allowed.match(name):
                continue
            src = f"/etc/{name}"
            if os.path.islink(src):
                # Keep a link whose target is visible inside (os-release, localtime, mtab); bind the
                # file itself when it points elsewhere (resolv.conf -> /run/systemd/...).
                if os.path.realpath(src).startswith(("/usr/", "/etc/", "/proc/")):
                    args += ["--symlink", os.readlink(src), src]
                elif os.path.exists(src):
                    args += ["--ro-bind", src, src]
            else:
                args += ["--ro-bind", src, src]
        args += ["--proc", "/proc", "--dev", "/dev"]
        for b in self._binds:
            if b.optional:
                args += ["--bind-try", str(b.source), b.target]
            else:
                args += ["--bind" if b.writable else "--ro-bind", str(b.source), b.target]
        if "/var/tmp" not in [b.target for b in self._binds]:
            args += ["--symlink", "../tmp", "/var/tmp"]
        args += ["--remount-ro", "/"]
        return args

    def _translate(self, path: str, *, write: bool, operation: str) -> tuple[Bind, tuple[str, ...]]:
        p = PurePosixPath(path)
        if not p.is_absolute() or ".." in p.parts:
            raise ValueError(f"sandbox path {path!r} must be absolute and without '..'")
        best: tuple[int, int, Bind] | None = None
        for i, b in enumerate(self._binds):
            if p == PurePosixPath(b.target) or p.is_relative_to(b.target):
                key = (len(PurePosixPath(b.target).parts), i)
                if best is None or key > best[:2]:
                    best = (*key, b)
        writable = ", ".join(b.target for b in self._binds if b.writable and not b.optional)
        if best is None:
            raise _error(
                "sandbox_file_failed",
                operation,
                f"{path!r} is not under a directory the local sandbox binds from the host ({writable}, "
                "or a configured mount); the local provider transfers files only there",
                stage=FailureStage.AGENT,
            )
        bind = best[2]
        if write and (not bind.writable or bind.optional):
            raise _error(
                "sandbox_file_failed",
                operation,
                f"{path!r} is under the read-only bind {bind.target}; writable: {writable}",
                stage=FailureStage.AGENT,
            )
        return bind, tuple(p.relative_to(bind.target).parts)

    def _check_cwd(self, cwd: str, operation: str) -> None:
        """Refuse, before anything starts, a working directory that does not exist under its bind.

        (bwrap changes directory only after it has started the command's process, so its failure
        would look like the command's exit 1.) Paths outside the binds, or reached through a
        symlink, are left to bwrap."""
        p = PurePosixPath(cwd)
        if not p.is_absolute() or ".." in p.parts:
            raise ValueError(f"cwd {cwd!r} must be absolute and without '..'")
        try:
            bind, rel = self._translate(cwd, write=False, operation=operation)
        except SandboxError:
            return
        try:
            root = os.open(bind.source, _DIR_FLAGS)
        except OSError:
            return
        try:
            os.close(_walk(root, rel, create=False))
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise _error(
                "command_failed",
                operation,
                f"the working directory {cwd!r} does not exist in local sandbox {self.sandbox_id}; "
                "nothing was started",
                stage=FailureStage.AGENT,
                details=CommandDetails(delivery=Delivery.NOT_SENT),
            ) from exc
        except (_SymlinkInTheWay, OSError):
            return
        finally:
            os.close(root)
