"""Asking the Docker engine about a container after the engine went away (``Sandbox.probe``).

A daemon stopped without live-restore stops every container on its way down (SIGTERM, then SIGKILL):
when it answers again, the container is ``exited`` and holds no process. That state, read from the
engine itself, proves that no process of the run is left even before the container is removed.

A restart can be over before anything of ours notices the engine was gone (the stop request then
finds the container merely "not running"). The engine's event log tells it apart from a container
that died on its own: it lives in the daemon's memory, so after a restart it holds no ``start`` event
for a container we saw started, while a daemon that stayed up still has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import docker.errors

from opencode_tui_core.failures import Evidence
from opencode_tui_core.sandbox.base import SandboxProbe, SandboxState
from opencode_tui_core.sandbox.docker.oom_rules import SOURCE_EVENTS, SOURCE_STATE

# The engine's own states that mean: no process of this container runs.
_DEAD = {"exited": SandboxState.EXITED, "dead": SandboxState.FAILED}

SOURCE_ENGINE = "docker.engine"


def _start_events(api: Any, container_id: str, since: float) -> int:
    stream = api.events(
        since=f"{since:.9f}",
        until=f"{time.time():.9f}",
        filters={"container": container_id, "type": "container", "event": ["start"]},
        decode=True,
    )
    try:
        return sum(1 for _ in stream)
    finally:
        with contextlib.suppress(Exception):
            stream.close()


async def probe_container(
    api: Any, container_id: str, timeout: float, *, since: float | None
) -> SandboxProbe:
    """``since``: when we created the container (epoch seconds), so its ``start`` event came after;
    None (a borrowed container): whether the engine restarted stays unknown."""
    """Ping the engine, then read the container's state; an unreachable engine is an answer."""
    short = container_id[:12]
    try:
        await asyncio.wait_for(asyncio.to_thread(api.ping), max(timeout, 0.05))
    except Exception as exc:  # refused, socket missing, timed out: the engine does not answer
        why = "did not answer in time" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        return SandboxProbe(
            engine_reachable=False,
            detail=f"the Docker engine is not reachable ({why})",
            evidence=[Evidence(source=SOURCE_ENGINE, data={"reachable": False, "error": why[:300]})],
        )
    engine = Evidence(source=SOURCE_ENGINE, data={"reachable": True})
    try:
        attrs = await asyncio.wait_for(
            asyncio.to_thread(api.inspect_container, container_id), max(timeout, 0.05)
        )
    except docker.errors.NotFound:
        return SandboxProbe(
            engine_reachable=True,
            dead=True,
            state=SandboxState.GONE,
            detail=f"container {short} no longer exists on the engine",
            evidence=[engine, Evidence(source=SOURCE_STATE, scope=container_id, data={"exists": False})],
        )
    except Exception as exc:  # the engine answered the ping but not this: nothing is proven
        return SandboxProbe(
            engine_reachable=True,
            detail=f"inspecting container {short} failed: {exc}",
            evidence=[engine],
        )
    state = attrs.get("State") or {}
    status = str(state.get("Status") or "")
    data = {
        key: state.get(key)
        for key in ("Status", "Running", "ExitCode", "OOMKilled", "StartedAt", "FinishedAt", "Pid")
    }
    dead = status in _DEAD and not state.get("Running")
    evidence = [engine, Evidence(source=SOURCE_STATE, scope=container_id, data=data)]
    restarted: bool | None = None
    if dead and since is not None:
        try:
            starts = await asyncio.wait_for(
                asyncio.to_thread(_start_events, api, container_id, since), max(timeout, 0.05)
            )
        except Exception:  # no answer: the restart stays unknown
            starts = None
        if starts is not None:
            restarted = starts == 0
            evidence.append(
                Evidence(
                    source=SOURCE_EVENTS,
                    scope=container_id,
                    data={"start_events_since_create": starts, "since": f"{since:.3f}"},
                )
            )
    detail = (
        f"container {short} is {status} (exit code {state.get('ExitCode')}, finished {state.get('FinishedAt')})"
        if dead
        else f"container {short} is {status or 'in an unknown state'}"
    )
    if restarted:
        detail += "; the engine's event log no longer has its start: the engine restarted"
    return SandboxProbe(
        engine_reachable=True,
        dead=dead,
        state=_DEAD.get(status, SandboxState.RUNNING if state.get("Running") else SandboxState.UNKNOWN),
        detail=detail,
        evidence=evidence,
        engine_lost=restarted,
    )
