"""Opening an interactive terminal in one OpenSandbox sandbox (execd's PTY sessions; the handle is pty.py's)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opencode_tui_core.failures import (
    Delivery,
    FailureStage,
)
from opencode_tui_core.sandbox.base import (
    PtyHandle,
)
from opencode_tui_core.sandbox.errors import (
    SandboxError,
    sandbox_error,
    sandbox_failure,
)
from opencode_tui_core.sandbox.opensandbox.common import (
    _DROP_TO_USER_SH,
    PTY_OPEN_TIMEOUT_S,
)
from opencode_tui_core.sandbox.opensandbox.http import RequestFailed
from opencode_tui_core.sandbox.opensandbox.pty import OpenSandboxPty


class ExecdTerminal:
    """``pty()`` of ``OpenSandboxSandbox``."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into

        def __getattr__(self, name: str) -> Any: ...

    async def _pty_socket(self, session_id: str, *, since: int = 0) -> Any:
        from websockets.asyncio.client import connect

        if self._execd_base is None:
            await self._resolve_execd()
        base = self._execd_url(f"/pty/{session_id}/ws")
        uri = re.sub(r"^http", "ws", base) + f"?pty=1&since={since}"
        headers = {
            **(self._http.server_headers() if self.settings.use_server_proxy else {}),
            **self._execd_headers,
        }
        return await connect(
            uri,
            additional_headers=headers or None,
            open_timeout=PTY_OPEN_TIMEOUT_S,
            max_size=None,
            ping_interval=None,
            proxy=None,
        )

    async def pty(
        self, argv: Sequence[str], *, cols: int = 80, rows: int = 24, cwd: str | None = None
    ) -> PtyHandle:
        self._ensure_open("pty")
        if not argv:
            raise ValueError("argv must not be empty")
        ids = self.user_ids or (
            (self.settings.command_uid, self.settings.command_gid)
            if self.settings.command_uid is not None
            else None
        )
        if ids is not None:
            # execd's terminal takes no uid/gid: the terminal drops to the sandbox user itself.
            uid, gid = ids[0], ids[1] if ids[1] is not None else 0
            argv = ["/bin/sh", "-c", _DROP_TO_USER_SH.format(uid=uid, gid=gid), "sh", *argv]

        async def not_sent(failed: RequestFailed) -> bool:
            # POST /pty starts a process: a request that may have reached the daemon is never sent
            # again (a second terminal would run beside the first, unseen).
            return failed.delivery is Delivery.NOT_SENT

        try:
            response = await self._execd_request(
                "pty",
                "POST",
                "/pty",
                json={
                    "command": shlex.join(argv),
                    **({"cwd": cwd or self.workdir} if (cwd or self.workdir) else {}),
                },
                timeout=PTY_OPEN_TIMEOUT_S,
                default_kind="sandbox_pty_failed",
                retry_gate=not_sent,
            )
            session_id = response.json()["session_id"]
            ws = await self._pty_socket(session_id)
        except RequestFailed as exc:
            uncertain = (
                exc.operation == "pty" and exc.method == "POST" and exc.delivery is not Delivery.NOT_SENT
            )
            raise sandbox_error(
                exc.failure(
                    stage=FailureStage.AGENT,
                    operation="pty.open",
                    kind="sandbox_pty_failed" if uncertain else None,
                    message=(
                        f"opening a terminal failed: {exc}"
                        + (
                            f" (after {exc.attempts} request(s); the last may have reached the daemon, so a "
                            "terminal may exist there; it was not requested again)"
                            if uncertain
                            else ""
                        )
                    ),
                ),
                exc,
            ) from exc
        except Exception as exc:
            failure = sandbox_failure(
                "sandbox_pty_failed",
                stage=FailureStage.AGENT,
                operation="pty.open",
                message=f"opening a terminal ({argv[0]!r}) failed: {type(exc).__name__}: {exc}",
                cause=exc,
            )
            raise sandbox_error(failure, exc) from exc
        handle = OpenSandboxPty(self, session_id, ws)
        self._ptys.add(handle)
        try:
            await handle.resize(cols, rows)
        except SandboxError:
            # A short-lived command can end (and its socket close) before the first resize: the
            # terminal opened, and its reader reports the exit. Any other resize failure is real.
            if getattr(ws, "close_code", None) is None:
                raise
        return handle
