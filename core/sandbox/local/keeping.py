"""Starting a local sandbox's keeper (its pid 1, in its own namespaces and cgroup) and finding it alive,
or starting a new one for a borrowed sandbox whose processes ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from typing import TYPE_CHECKING, Any

from opencode_tui_core.failures import (
    FailureStage,
)
from opencode_tui_core.sandbox.base import (
    NetworkPolicy,
)
from opencode_tui_core.sandbox.errors import SandboxError, sandbox_failure
from opencode_tui_core.sandbox.local.common import (
    _HOST_ENV,
    SANDBOX_PATH,
    _error,
)
from opencode_tui_core.sandbox.local.keeper import (
    _CGROUP_WRAPPER,
    _CGROUPS_WRAPPER,
    _KEEPER_SCRIPT,
    _Keeper,
    _read_token,
    _spawn_keeper,
    _StatusReader,
)
from opencode_tui_core.sandbox.local.procs import (
    _ns_inode,
    _proc_parent,
    _proc_stat,
    _protect_from_oom_killer,
)
from opencode_tui_core.sandbox.oom import oom_confirmed

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# the sandbox


class SandboxKeeper:
    """The keeper of ``LocalSandbox``: start, revive, put commands in its cgroup."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into
        _keeper: _Keeper | None

        def __getattr__(self, name: str) -> Any: ...

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
            if k is not None and k.usable():
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
