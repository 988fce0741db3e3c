"""One local (bubblewrap) sandbox: its state dir and metadata, status, evidence, fault watch and release.

The design is in core/sandbox/local/provider.py's docstring. Its other parts are mixins over the
same state, one module each: binds and path translation (binds.py), the keeper (keeping.py),
commands and terminals (commands.py), tar transfer (transfer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from opencode_tui_core.events import SandboxFault
from opencode_tui_core.failures import (
    Evidence,
    FailureStage,
)
from opencode_tui_core.json_text import indented_json
from opencode_tui_core.sandbox.base import (
    Sandbox,
    SandboxProbe,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    SingleFlight,
)
from opencode_tui_core.sandbox.errors import SandboxClosedError, sandbox_failure
from opencode_tui_core.sandbox.faults import NOT_WATCHED_NOTE, FaultWatcher, kernel_log_note
from opencode_tui_core.sandbox.local.binds import SandboxBinds
from opencode_tui_core.sandbox.local.bwrap import HostTools
from opencode_tui_core.sandbox.local.cgroup import _Cgroup, _memory_cgroup_mount
from opencode_tui_core.sandbox.local.commands import SandboxCommands
from opencode_tui_core.sandbox.local.common import (
    LABEL_FILE,
    PROVIDER_NAME,
    _error,
)
from opencode_tui_core.sandbox.local.execution import _LocalPty
from opencode_tui_core.sandbox.local.files import (
    _rmtree,
)
from opencode_tui_core.sandbox.local.keeper import (
    _Keeper,
    _stop_keeper,
)
from opencode_tui_core.sandbox.local.keeping import SandboxKeeper
from opencode_tui_core.sandbox.local.probe import probe_local
from opencode_tui_core.sandbox.local.procs import (
    _ChildHandle,
    _pids_in_ns,
)
from opencode_tui_core.sandbox.local.transfer import SandboxTransfer
from opencode_tui_core.sandbox.oom import oom_confirmed
from opencode_tui_core.sandbox.pids import pids_evidence

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# the sandbox


class LocalSandbox(SandboxTransfer, SandboxCommands, SandboxKeeper, SandboxBinds, Sandbox):
    """One local (bubblewrap) sandbox: a state dir, a keeper and, where possible, a memory cgroup."""

    provider = PROVIDER_NAME

    def __init__(self, provider: HostTools, state_dir: Path, meta: dict[str, Any], *, owned: bool):
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
    def cgroup_path(self) -> str | None:
        return str(self._cgroup.path) if self._cgroup else None

    @property
    def pidns(self) -> int | None:
        return self._keeper.pidns if self._keeper else None

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
        tmp.write_text(indented_json(self._meta, sort_keys=True))
        tmp.chmod(0o600)
        tmp.replace(self.state_dir / LABEL_FILE)

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

    def _command_started(self, host_pid: int, argv: Sequence[str]) -> None:
        if self._watcher is not None:
            self._watcher.remember(host_pid, shlex.join(argv))

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
        return await probe_local(self.sandbox_id, self._keeper, self._cgroup, timeout)

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
