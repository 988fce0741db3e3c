"""An interactive terminal in an OpenSandbox sandbox, over execd's PTY WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Protocol

import httpx

from opencode_tui_core.failures import (
    FailureDetails,
    FailureEvent,
    FailureStage,
    GenericDetails,
    Recovery,
)
from opencode_tui_core.sandbox.base import (
    PtyHandle,
    QueuedOutput,
)
from opencode_tui_core.sandbox.errors import SandboxClosedError, sandbox_error, sandbox_failure
from opencode_tui_core.sandbox.opensandbox.diagnostics import Diagnosis
from opencode_tui_core.sandbox.opensandbox.settings import OpenSandboxPolicyConfig, OpenSandboxSettings

log = logging.getLogger(__name__)


class TerminalHost(Protocol):
    """What a terminal needs of its sandbox (``OpenSandboxSandbox`` is one): its settings, execd,
    its record of failures and recoveries, and the diagnosis of a loss."""

    owned: bool
    settings: OpenSandboxSettings
    policy: OpenSandboxPolicyConfig
    _ptys: set[OpenSandboxPty]  # open terminals (one forgets itself when it closes)

    @property
    def closed(self) -> bool: ...

    async def _execd_request(
        self, operation: str, method: str, path: str, **kwargs: Any
    ) -> httpx.Response: ...

    async def _pty_socket(self, session_id: str, *, since: int = 0) -> Any: ...

    async def _diagnose(self, deadline: float, into: Diagnosis | None = None) -> Diagnosis: ...

    def _lost_failure(
        self,
        diagnosis: Diagnosis,
        *,
        default_kind: str,
        operation: str,
        what: str,
        cause: BaseException | None = None,
        details: FailureDetails | None = None,
    ) -> FailureEvent: ...

    def _observe(self, failure: FailureEvent) -> None: ...

    def _recovered(self, failure: FailureEvent, how: Recovery) -> None: ...


class OpenSandboxPty(PtyHandle):
    """An interactive terminal over execd's PTY WebSocket (binary 0x00+stdin in, 0x01..+output out)."""

    def __init__(self, sandbox: TerminalHost, session_id: str, ws: Any):
        self._sandbox = sandbox
        self.session_id = session_id
        self._ws = ws
        self._out = QueuedOutput()
        self._closed = False
        self.exit_code: int | None = None
        self.failure: FailureEvent | None = None  # set when the terminal broke unexpectedly
        self.output_offset = 0
        self._reattached = False
        self._reattach_error: BaseException | None = None
        self._closing: asyncio.Future[Any] | None = None
        self._reader = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            while True:
                try:
                    async for message in self._ws:
                        self._on_message(message)
                except (ConnectionClosed, OSError):
                    pass
                if self._closed or self.exit_code is not None:
                    return  # closed by us, or the process ended and said so
                # The socket closed without an exit report: re-attach once from where we were.
                if not await self._reattach():
                    await self._broken()
                    return
        finally:
            self._out.put(b"")

    def _on_message(self, message: bytes | str) -> None:
        if isinstance(message, bytes):
            if message[:1] in (b"\x01", b"\x02", b"\x03") and len(message) > 1:
                self.output_offset += len(message) - 1
                self._out.put(message[1:])
            return
        with contextlib.suppress(ValueError):
            msg = json.loads(message)
            if isinstance(msg, dict) and msg.get("type") == "exit":
                code = msg.get("exit_code")
                self.exit_code = code if isinstance(code, int) else -1

    async def _reattach(self) -> bool:
        if self._closed or self._sandbox.closed:
            return False
        if self._reattached:
            return False
        self._reattached = True
        try:
            self._ws = await self._sandbox._pty_socket(self.session_id, since=self.output_offset)
        except Exception as exc:
            log.debug("pty %s: re-attach failed: %s", self.session_id, exc)
            self._reattach_error = exc
            return False
        # An observation, not only the provider's memory: the episode puts it in events.jsonl.
        dropped = sandbox_failure(
            "sandbox_pty_failed",
            stage=FailureStage.AGENT,
            operation="pty.attach",
            message=f"terminal {self.session_id}: its socket dropped without an exit report; "
            f"re-attached from output offset {self.output_offset}",
            details=GenericDetails(data={"session_id": self.session_id, "output_offset": self.output_offset}),
        )
        self._sandbox._observe(dropped)
        self._sandbox._recovered(dropped, Recovery.REATTACHED)
        return True

    async def _broken(self) -> None:
        """Diagnose (shared entry point, own bounded budget) and record the terminal's failure."""
        sb = self._sandbox
        loop = asyncio.get_running_loop()
        diagnosis = await sb._diagnose(loop.time() + sb.policy.evidence_polling.budget_s + 5.0)
        again = f"; re-attaching failed: {self._reattach_error}" if self._reattach_error else ""
        self.failure = sb._lost_failure(
            diagnosis,
            default_kind="sandbox_pty_failed",
            operation="pty",
            what=f"terminal {self.session_id} closed without an exit report{again}",
            cause=self._reattach_error,
            details=GenericDetails(data={"session_id": self.session_id, "output_offset": self.output_offset}),
        )
        sb._observe(self.failure)
        sb._recovered(self.failure, Recovery.TERMINAL_ENDED)

    async def read(self, max_bytes: int = 65536) -> bytes:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if self._closed:
            return b""
        return await self._out.read(max_bytes)

    async def _send(self, operation: str, message: bytes | str) -> None:
        if self._closed or self._sandbox.closed:
            raise SandboxClosedError("the terminal is closed")
        try:
            await asyncio.wait_for(self._ws.send(message), self._sandbox.settings.request_timeout_s)
        except Exception as exc:
            failure = sandbox_failure(
                "sandbox_pty_failed",
                stage=FailureStage.AGENT,
                operation=f"pty.{operation}",
                message=f"terminal {operation} failed: {type(exc).__name__}: {exc}",
                cause=exc,
                details=GenericDetails(data={"session_id": self.session_id}),
            )
            raise sandbox_error(failure, exc) from exc

    async def write(self, data: bytes) -> None:
        await self._send("write", b"\x00" + bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        if cols <= 0 or rows <= 0:
            raise ValueError("cols and rows must be positive")
        await self._send("resize", json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def close(self) -> None:
        """End the terminal's process (DELETE /pty/{id}) and disconnect. Idempotent."""
        if self._closed:
            return
        self.close_now()
        if self._sandbox.closed and self._sandbox.owned:
            return
        with contextlib.suppress(Exception):
            await self._sandbox._execd_request(
                "pty",
                "DELETE",
                f"/pty/{self.session_id}",
                timeout=self._sandbox.settings.request_timeout_s,
                accept=(404,),
            )

    def close_now(self) -> None:
        """Disconnect only (the owned sandbox is about to be deleted)."""
        if self._closed:
            return
        self._closed = True
        self._reader.cancel()
        self._sandbox._ptys.discard(self)
        with contextlib.suppress(Exception):
            self._closing = asyncio.ensure_future(self._ws.close())


# ==================================================================================================
