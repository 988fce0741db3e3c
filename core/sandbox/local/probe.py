"""Asking a local sandbox's keeper whether it still lives (``Sandbox.probe``).

The keeper is the sandbox's pid 1: when something outside kills it, the kernel kills every process
in its PID namespace before the keeper is gone. A dead keeper (checked by pid *and* start time, so
a recycled pid is never taken for it) and an empty memory cgroup therefore prove that no process of
the run is left. There is no daemon: the "engine" always answers.
"""

from __future__ import annotations

import asyncio
import time

from opencode_tui_core.failures import Evidence
from opencode_tui_core.sandbox.base import SandboxProbe, SandboxState
from opencode_tui_core.sandbox.local.cgroup import _Cgroup
from opencode_tui_core.sandbox.local.keeper import _Keeper
from opencode_tui_core.sandbox.local.procs import _ns_inode

SOURCE_KEEPER = "local.keeper"


def _probe(sandbox_id: str, k: _Keeper | None, cgroup: _Cgroup | None, timeout: float) -> SandboxProbe:
    if k is None:
        return SandboxProbe(engine_reachable=True, detail=f"local sandbox {sandbox_id} has no keeper")
    # A killed pid 1 first drops its namespaces (its /proc/PID/ns/uts no longer opens; ns/pid still
    # does) and leaves its cgroup, then waits for the kernel to kill everything else in its PID
    # namespace: while it shows in /proc like that it is on its way out, so wait (bounded) for it.
    end = time.monotonic() + timeout
    alive = k.alive()
    while alive and _ns_inode(k.pid, "uts") is None and time.monotonic() < end:
        time.sleep(0.05)
        alive = k.alive()
    cgroup_pids = cgroup.pids() if cgroup is not None and cgroup.exists() else None
    data = {"pid": k.pid, "start_time": k.start_time, "pidns": k.pidns, "alive": alive}
    evidence = [Evidence(source=SOURCE_KEEPER, scope=sandbox_id, data=data)]
    if cgroup is not None and cgroup_pids is not None:
        evidence.append(Evidence(source="cgroup.procs", scope=str(cgroup.path), data={"pids": cgroup_pids}))
    if alive:
        return SandboxProbe(
            engine_reachable=True,
            dead=False,
            state=SandboxState.RUNNING,
            detail=f"the keeper (pid {k.pid}) of local sandbox {sandbox_id} is alive",
            evidence=evidence,
        )
    # pid 1 of a PID namespace is only gone once the kernel has killed every process in it. What the
    # cgroup may still hold then are our bwrap launchers, outside the namespace (release kills them).
    where = (
        f"; {len(cgroup_pids)} launcher process(es) outside it remain in its cgroup" if cgroup_pids else ""
    )
    return SandboxProbe(
        engine_reachable=True,
        dead=True,
        engine_lost=True,  # nothing of ours kills the keeper before the release: it was killed from outside
        state=SandboxState.EXITED,
        detail=f"the keeper (pid {k.pid}, the sandbox's pid 1) of local sandbox {sandbox_id} is gone: "
        f"the kernel ended every process in its PID namespace{where}",
        evidence=evidence,
    )


async def probe_local(
    sandbox_id: str, keeper: _Keeper | None, cgroup: _Cgroup | None, timeout: float
) -> SandboxProbe:
    """Whether ``keeper`` (the sandbox's pid 1) lives, with its memory cgroup's remaining pids."""
    return await asyncio.wait_for(
        asyncio.to_thread(_probe, sandbox_id, keeper, cgroup, timeout * 0.8), max(timeout, 0.05)
    )
