"""The task handed to a serve runner started ahead, over its model socket (issue 31).

A runner the warm pool started waits for its task. Uploading the task through the provider costs a
round trip each (docker: the task files' archive, the access check's exec, the prompt's archive, about
50 ms apiece, all before OpenCode sees the prompt). The runner already holds a line out: the relay to
the model socket, served by the episode's proxy. So the runner asks for its task there:

1. ``GET TASK_PATH`` (held until the episode offers it): one JSON line (workdir, the staged paths,
   the access check's script, the model socket) then the task files as a tar. The runner, as the
   sandbox user, unpacks it into the workdir and runs the access check;
2. ``POST STAGED_PATH`` with what the check printed: the episode judges it exactly as it judges the
   check run through the provider (``opencode_tui_core.runtime.access``). The answer is held until the agent
   phase: the prompt's files as a tar (``go``), or 409 when the episode ended first.

The proxy serves these paths only with the episode's token, and records none of them.
"""

from __future__ import annotations

import asyncio
import json

from pydantic import BaseModel, ConfigDict, ValidationError

from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.inside.serve_runner import HANDOFF_STAGED_PATH, HANDOFF_TASK_PATH
from opencode_tui_core.model._http import BufferedReader, Request, head_bytes, send_simple
from opencode_tui_core.sandbox.base import ExecResult
from opencode_tui_core.sandbox.errors import SandboxError


class TaskOffer(BaseModel):
    """The head line of the runner's task: where to unpack it and what to check there."""

    model_config = ConfigDict(extra="forbid")

    workdir: str
    listing: str  # the staged paths, one per line, relative to the workdir
    check: str  # the access check's shell script (``opencode_tui_core.runtime.access``)
    socket: str  # the model socket to check ("" when none)


class StagedReport(BaseModel):
    """What the runner says once the task is unpacked and checked (or why it could not be)."""

    model_config = ConfigDict(extra="forbid")

    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # unpacking failed, or the check could not run


class HandoffLost(SandboxError):
    """The runner did not take its task: it ended first, or did not answer in time."""


class TaskHandoff:
    """One runner's task, offered by its episode and fetched by the runner through the proxy."""

    def __init__(self) -> None:
        self._offer: asyncio.Future[tuple[TaskOffer, bytes]] | None = None
        self._staged: asyncio.Future[StagedReport] | None = None
        self._go: asyncio.Future[bytes | None] | None = None

    def _futures(self) -> None:
        if self._offer is None:  # made in the running loop, on first use
            loop = asyncio.get_running_loop()
            self._offer, self._staged, self._go = (
                loop.create_future(),
                loop.create_future(),
                loop.create_future(),
            )

    async def stage(
        self, offer: TaskOffer, files_tar: bytes, *, runner: asyncio.Future[ExecResult], timeout: float
    ) -> ExecResult:
        """Offer the task and wait for the runner's report: the access check's result, as an exec of
        it through the provider would give it. Raises HandoffLost when ``runner`` (its launch) ended
        first or nothing came within ``timeout``."""
        self._futures()
        assert self._offer is not None and self._staged is not None
        if not self._offer.done():
            self._offer.set_result((offer, files_tar))
        waits: set[asyncio.Future[StagedReport] | asyncio.Future[ExecResult]] = {self._staged, runner}
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when="FIRST_COMPLETED")
        if self._staged not in done:
            why = (
                "ended before it took its task"
                if runner in done
                else f"did not take its task in {timeout:g}s"
            )
            raise HandoffLost(f"OpenCode's server started ahead {why}")
        report, now = self._staged.result(), utcnow()
        return ExecResult(
            execution_id="handoff",
            exit_code=report.exit_code,
            observed=report.error is None,
            stdout=report.stdout.encode(),
            stderr=report.stderr.encode(),
            started_at=now,
            ended_at=now,
            error=report.error,
        )

    def go(self, session_tar: bytes) -> None:
        """The agent phase: the runner gets its prompt's files (this starts its run deadline)."""
        self._futures()
        assert self._go is not None
        if not self._go.done():
            self._go.set_result(session_tar)

    def withdraw(self) -> None:
        """The episode ends without giving the runner its prompt: a held report is answered 409."""
        if self._go is not None and not self._go.done():
            self._go.set_result(None)

    async def serve(self, req: Request, reader: BufferedReader, writer: asyncio.StreamWriter) -> bool:
        """One request of the runner under ``HANDOFF_PREFIX`` (the proxy checked its token)."""
        self._futures()
        assert self._offer is not None and self._staged is not None and self._go is not None
        if req.method == "GET" and req.path == HANDOFF_TASK_PATH:
            offer, files_tar = await asyncio.shield(self._offer)
            head = offer.model_dump_json().encode() + b"\n"
            await _send_bytes(writer, head + files_tar, "application/x-tar")
            return True
        if req.method == "POST" and req.path == HANDOFF_STAGED_PATH:
            try:
                report = StagedReport.model_validate(json.loads(req.body or b"null"))
            except (ValueError, ValidationError) as exc:
                report = StagedReport(error=f"the runner's report was not understood: {exc}")
            if not self._staged.done():
                self._staged.set_result(report)
            session_tar = await asyncio.shield(self._go)
            if session_tar is None:
                await send_simple(writer, 409, {"error": "the episode ended before its agent phase"})
                return False
            await _send_bytes(writer, session_tar, "application/x-tar")
            return True
        await send_simple(writer, 404, {"error": f"no {req.method} {req.path} here"})
        return True


async def _send_bytes(writer: asyncio.StreamWriter, body: bytes, content_type: str) -> None:
    writer.write(head_bytes(200, [("Content-Type", content_type), ("Content-Length", str(len(body)))]) + body)
    await writer.drain()
