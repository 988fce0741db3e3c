"""Shells a person opens in an episode's sandbox: recorded, and said in the record.

Every shell is an event pair (``ShellOpened`` / ``ShellClosed``) and its own asciinema cast with what
was typed and what was shown, at the terminal's size (opened at it, and each resize recorded). A shell opened before verification has finished marks the sample: the
hand in the sandbox may have changed what the verifier sees, so such an episode is never a clean score.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from opencode_tui_core.artifacts import CastWriter
from opencode_tui_core.sandbox.base import PtyHandle


class RecordedShell(PtyHandle):
    """A PTY handle that writes both directions to a cast and reports its close once."""

    def __init__(
        self, inner: PtyHandle, cast: CastWriter, on_close: Callable[[float, int, int], None]
    ) -> None:
        self._inner = inner
        self._cast = cast
        self._on_close = on_close
        self._started = time.monotonic()
        self._bytes_in = self._bytes_out = 0
        self._closed = False

    async def read(self, max_bytes: int = 65536) -> bytes:
        data = await self._inner.read(max_bytes)
        if data:
            self._bytes_out += len(data)
            self._cast.output(data.decode("utf-8", "replace"))
        else:
            self._finish()
        return data

    async def write(self, data: bytes) -> None:
        self._bytes_in += len(data)
        self._cast.input(data.decode("utf-8", "replace"))
        await self._inner.write(data)

    async def resize(self, cols: int, rows: int) -> None:
        await self._inner.resize(cols, rows)
        if not self._closed:
            with contextlib.suppress(OSError):  # as for output: the shell outlives a full disk
                self._cast.resize(cols, rows)

    async def close(self) -> None:
        try:
            await self._inner.close()
        finally:
            self._finish()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):  # a full disk must not break the person's shell
            self._cast.close()
        self._on_close(round(time.monotonic() - self._started, 3), self._bytes_in, self._bytes_out)
