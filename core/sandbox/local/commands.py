"""Running commands in a local sandbox: ``exec`` and ``pty`` entered through its keeper's namespaces, as the
sandbox user, with its environment."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opencode_tui_core.failures import (
    CommandDetails,
    Delivery,
    FailureStage,
)
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.sandbox.base import (
    ExecResult,
    NetworkPolicy,
    OutputCallback,
    PtyHandle,
    SandboxUser,
    exec_start,
)
from opencode_tui_core.sandbox.local.common import (
    _HOST_ENV,
    SANDBOX_PATH,
    _error,
    _resolve_user,
)
from opencode_tui_core.sandbox.local.execution import _ExecRun, _LocalPty
from opencode_tui_core.sandbox.local.keeper import (
    _Launch,
    _StatusReader,
)

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# the sandbox


class SandboxCommands:
    """``exec``, ``pty`` and the users of ``LocalSandbox``."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into

        def __getattr__(self, name: str) -> Any: ...

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
            if not keeper.usable() or os.fstat(opened[1]).st_ino != keeper.pidns:
                raise _error(
                    "sandbox_lost",
                    operation,
                    f"local sandbox {self.sandbox_id}: its pid 1 exited while the command was starting "
                    "(every process in it was killed); nothing was started",
                    stage=FailureStage.AGENT,
                    details=CommandDetails(delivery=Delivery.NOT_SENT),
                )
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
        eid, deadline = exec_start(argv, timeout, execution_id)
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
        started = utcnow()
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
        run = _ExecRun(self, eid, proc, launch, out_r, err_r, on_output, argv)
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
