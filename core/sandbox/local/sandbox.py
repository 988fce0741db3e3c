"""One local (bubblewrap) sandbox; the design is in core/sandbox/local/provider.py's docstring.

Above 800 lines because it is one class whose methods share the keeper, binds and cgroup state;
the mechanics (keeper, exec, files, cgroup, /proc) are already in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import os
import signal
import subprocess
import tarfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from core.events import SandboxFault
from core.failures import (
    CommandDetails,
    Delivery,
    Evidence,
    FailureStage,
)
from core.failures.evidence import utcnow
from core.sandbox.base import (
    SANDBOX_MODEL_SOCKET,
    ExecResult,
    NetworkPolicy,
    OutputCallback,
    PtyHandle,
    Sandbox,
    SandboxProbe,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    SandboxUser,
    SingleFlight,
    check_exec_args,
    new_execution_id,
)
from core.sandbox.errors import SandboxClosedError, SandboxError, SandboxFileNotFoundError, sandbox_failure
from core.sandbox.faults import NOT_WATCHED_NOTE, FaultWatcher, kernel_log_note
from core.sandbox.local.bwrap import _system_fs_args
from core.sandbox.local.cgroup import _Cgroup, _memory_cgroup_mount
from core.sandbox.local.common import (
    _HOST_ENV,
    LABEL_FILE,
    OVERLAYS_DIR,
    PROVIDER_NAME,
    RUN_DIR,
    SANDBOX_PATH,
    _error,
    _resolve_user,
)
from core.sandbox.local.execution import _ExecRun, _LocalPty
from core.sandbox.local.files import (
    _DIR_FLAGS,
    _archive_pinned,
    _extract_pinned,
    _rmtree,
    _SymlinkInTheWay,
    _walk,
)
from core.sandbox.local.keeper import (
    _CGROUP_WRAPPER,
    _CGROUPS_WRAPPER,
    _KEEPER_SCRIPT,
    _Keeper,
    _Launch,
    _read_token,
    _spawn_keeper,
    _StatusReader,
    _stop_keeper,
)
from core.sandbox.local.procs import (
    _ChildHandle,
    _ns_inode,
    _pids_in_ns,
    _proc_parent,
    _proc_stat,
    _protect_from_oom_killer,
)
from core.sandbox.oom import oom_confirmed
from core.sandbox.pids import pids_evidence
from core.sandbox.tarsafe import check_archive

if TYPE_CHECKING:
    from core.sandbox.local.provider import LocalProvider

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# the sandbox


@dataclass(frozen=True)
class _Bind:
    target: str  # path inside the sandbox
    source: Path  # host path
    writable: bool
    optional: bool = False  # --bind-try: the model socket may not exist yet


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
        # The pids cgroup (``limits.pids``) and its refused-fork counter at create/connect.
        pcg = meta.get("pids_cgroup")
        self._pids_cgroup = _Cgroup(Path(pcg)) if pcg else None
        self._pids_baseline: int | None = meta.get("pids_max_events_baseline")
        self._keeper: _Keeper | None = None
        k = meta.get("keeper")
        if k:
            self._keeper = _Keeper(
                pid=k["pid"], start_time=k["start_time"], pidns=k["pidns"], bwrap_pid=k.get("bwrap_pid")
            )
            self._keeper.pin()  # (a live one: a kept sandbox we connect to)
        self._released = False
        self._release_once = SingleFlight(self._release)
        self._lock = asyncio.Lock()
        self._ptys: set[_LocalPty] = set()
        # Exec bwrap processes still running (our children), with their pidfds: killed on release.
        self._execs: dict[asyncio.subprocess.Process, _ChildHandle] = {}
        self._binds = self._compute_binds()
        self._fs_cache: list[str] | None = None
        self._watcher: FaultWatcher | None = None  # the live watch (watch_faults), kept for inspect

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
                failure=sandbox_failure(
                    "sandbox_lost",
                    stage=FailureStage.AGENT,
                    operation=operation,
                    message=f"the state dir of {self.sandbox_id} is gone",
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
        keeper.pin()
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
        files = [str(c.procs_file) for c in (self._cgroup, self._pids_cgroup) if c is not None]
        if not files:
            return argv
        return ["/bin/sh", "-c", _CGROUP_WRAPPER if len(files) == 1 else _CGROUPS_WRAPPER, *files, *argv]

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
                    failure=sandbox_failure(
                        "sandbox_lost",
                        stage=FailureStage.AGENT,
                        operation=operation,
                        message=f"the keeper process of {self.sandbox_id} is gone",
                        evidence=evidence,
                    ),
                )
            # Borrowed, and its processes ended with their creator (--die-with-parent): the files are
            # still there, so start a new process namespace owned by this connection.
            if k is not None:
                k.unpin()
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
        pids_enforced = None if self.spec.pids_limit is None else self._pids_cgroup is not None
        disk_enforced = None if self.spec.disk_bytes is None else bool(self._meta.get("disk_mount"))
        if self._cgroup is None and not self._meta.get("disk_mount"):
            notes.append(NOT_WATCHED_NOTE + " (no memory cgroup and no size-limited disk here)")
        elif self._cgroup is not None and (note := kernel_log_note()):
            notes.append(note)
        evidence = [] if state in (SandboxState.RELEASED, SandboxState.GONE) else await self.inspect()
        return SandboxStatus(
            sandbox_id=self.sandbox_id,
            provider=PROVIDER_NAME,
            owned=self.owned,
            state=state,
            memory_limit_enforced=enforced,
            pids_limit_enforced=pids_enforced,
            disk_limit_enforced=disk_enforced,
            notes=notes,
            evidence=evidence,
        )

    async def inspect(self) -> list[Evidence]:
        if self._released:
            raise SandboxClosedError(f"local sandbox {self.sandbox_id} was released; inspect refused")
        out: list[Evidence] = []
        if self._cgroup is not None and self._cgroup.exists():
            out.append(self._cgroup.evidence(self._oom_baseline))
        if self._pids_cgroup is not None and self._pids_cgroup.exists():
            out.append(pids_evidence(self._pids_cgroup.path, self._pids_baseline))
        disk = self._fault_watcher().disk_evidence()
        if disk is not None:
            out.append(disk)
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

    def _fault_watcher(self) -> FaultWatcher:
        if self._watcher is None:
            memory, memcg = None, None
            mount = _memory_cgroup_mount()
            if self._cgroup is not None:
                memory = (self._cgroup.path, 1)
                if mount is not None and self._cgroup.path.is_relative_to(mount):
                    memcg = "/" + str(self._cgroup.path.relative_to(mount))
            disk_mount = self._meta.get("disk_mount")
            disk = (Path(disk_mount), self.spec.disk_bytes) if disk_mount and self.spec.disk_bytes else None
            self._watcher = FaultWatcher(
                scope=self.cgroup_path or self.sandbox_id,
                memory=memory,
                memcg=memcg,
                oom_baseline=self._oom_baseline,
                disk=disk,
                list_pids=None if self._cgroup is not None else self.host_pids,
            )
        return self._watcher

    async def watch_faults(self, stop: asyncio.Event) -> AsyncIterator[SandboxFault]:
        watcher = self._fault_watcher()
        if watcher.memory is None and watcher.disk is None:
            return  # no memory cgroup and no sized disk: nothing to watch (status().notes says so)
        async for fault in watcher.watch(stop):
            yield fault

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
        run = _ExecRun(self, eid, proc, launch, out_r, err_r, on_output)
        self._execs[proc] = run.launcher
        try:
            return await run.run(deadline, stdin, started)
        finally:
            await run.cleanup()
            self._execs.pop(proc, None)

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
                failure=sandbox_failure(
                    "sandbox_file_failed",
                    stage=FailureStage.AGENT,
                    operation="download",
                    message=f"{path!r} does not exist",
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
        # One release, however many callers (a caller cancelled midway would otherwise leave the
        # state directory behind): see SingleFlight.
        await self._release_once()

    async def _release(self) -> None:
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
            elif k is not None:
                k.unpin()
            return
        problems: list[str] = []
        if self._keeper is not None:
            await _stop_keeper(self._keeper)
        for proc, launcher in list(self._execs.items()):
            # By pidfd: ``returncode is None`` does not mean "not reaped" (see _ChildHandle).
            if proc.returncode is None:
                launcher.kill()
        for cgroup in (self._cgroup, self._pids_cgroup):
            if cgroup is None:
                continue
            if not await cgroup.kill_all():
                problems.append(f"processes still in cgroup {cgroup.path}: {cgroup.pids()}")
            elif not await cgroup.remove():
                problems.append(f"cannot remove cgroup {cgroup.path}")
        try:
            await asyncio.to_thread(_rmtree, self.state_dir)
        except OSError as exc:
            problems.append(f"cannot remove state dir {self.state_dir}: {exc}")
        if problems:
            msg = f"release of local sandbox {self.sandbox_id} incomplete: " + "; ".join(problems)
            raise _error("sandbox_release_failed", "release", msg, stage=FailureStage.CLEANUP)
