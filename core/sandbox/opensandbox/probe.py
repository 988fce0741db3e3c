"""Asking the OpenSandbox server about a sandbox after the server went away (``Sandbox.probe``).

The lifecycle API is the authority: ``Terminated``/``Failed`` or a 404 (deleted, expired) means no
process of the sandbox runs. A request that gets no HTTP answer at all (refused, reset, timed out)
means the server is not reachable, which is the probe's answer, not an error.
"""

from __future__ import annotations

import asyncio

from opencode_tui_core.failures import Evidence
from opencode_tui_core.sandbox.base import SandboxProbe, SandboxState
from opencode_tui_core.sandbox.opensandbox.http import Http, RequestFailed
from opencode_tui_core.sandbox.opensandbox.oom_rules import SOURCE_OS_LIFECYCLE as SOURCE_LIFECYCLE

SOURCE_SERVER = "opensandbox.server"
_DEAD = {"Terminated": SandboxState.EXITED, "Failed": SandboxState.FAILED}


async def probe_sandbox(http: Http, url: str, sandbox_id: str, timeout: float) -> SandboxProbe:
    """What the server at ``url`` (the sandbox's lifecycle resource) says about ``sandbox_id``."""
    loop = asyncio.get_running_loop()
    try:
        response = await http.request(
            "read", "GET", url, timeout=max(timeout, 0.05), deadline=loop.time() + max(timeout, 0.05)
        )
    except RequestFailed as exc:
        if exc.http_status == 404:
            return SandboxProbe(
                engine_reachable=True,
                dead=True,
                state=SandboxState.GONE,
                detail=f"sandbox {sandbox_id} no longer exists on the OpenSandbox server",
                evidence=[Evidence(source=SOURCE_LIFECYCLE, scope=sandbox_id, data={"exists": False})],
            )
        reachable = not exc.transport
        return SandboxProbe(
            engine_reachable=reachable,
            detail=f"the OpenSandbox server {'answered' if reachable else 'is not reachable'}: {exc}"[:500],
            evidence=[Evidence(source=SOURCE_SERVER, data={"reachable": reachable, "error": str(exc)[:300]})],
        )
    try:
        body = response.json()
    except ValueError:
        body = None
    status = body.get("status") if isinstance(body, dict) else None
    state = (status.get("state") if isinstance(status, dict) else status) if status is not None else None
    dead = state in _DEAD
    return SandboxProbe(
        engine_reachable=True,
        dead=dead,
        state=_DEAD.get(str(state), SandboxState.RUNNING if state == "Running" else SandboxState.UNKNOWN),
        detail=f"sandbox {sandbox_id} is {state or 'in an unknown state'} on the OpenSandbox server",
        evidence=[
            Evidence(source=SOURCE_SERVER, data={"reachable": True}),
            Evidence(source=SOURCE_LIFECYCLE, scope=sandbox_id, data={"state": state}),
        ],
    )
