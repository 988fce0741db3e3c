"""Tar archives into and out of one Docker container (the engine's archive API)."""

from __future__ import annotations

import asyncio
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import docker
import docker.errors

from opencode_tui_core.failures import (
    FailureStage,
)
from opencode_tui_core.sandbox import tarsafe
from opencode_tui_core.sandbox.docker.common import (
    CALL_DEADLINE_S,
    FILE_DEADLINE_S,
    _blocking,
    _engine_error,
    _http_status,
)
from opencode_tui_core.sandbox.errors import SandboxError, SandboxFileNotFoundError, sandbox_failure


class ContainerTransfer:
    """``upload_tar``/``download_tar`` of ``DockerSandbox``."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into

        def __getattr__(self, name: str) -> Any: ...

    async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
        self._ensure_open("upload")
        if not PurePosixPath(dest_dir).is_absolute():
            raise ValueError(f"dest_dir must be an absolute path inside the sandbox, got {dest_dir!r}")
        members = tarsafe.check_archive(archive)  # raises UnsafeArchiveError before anything is written
        archive = tarsafe.without_special_bits(archive)  # put_archive keeps setuid/setgid as given
        target = PurePosixPath(dest_dir)
        if target.name and any(m.isdir() and PurePosixPath(m.name) == PurePosixPath(".") for m in members):
            # The engine skips a "." entry when the target exists; extracted from the parent, the
            # target's own owner and mode come from the archive (and "." is the target by name).
            archive = tarsafe.reroot(archive, target.name)
            dest_dir = str(target.parent)
        try:
            try:
                ok = await self._put_archive(dest_dir, archive)
            except docker.errors.NotFound:
                # The destination does not exist yet (the engine refused before writing anything):
                # create it, as root whatever the image's user (the engine extracts as root with the
                # archive's owners), and put the archive once more. Usually it exists (the workdir,
                # /tmp): then no exec is spent on it.
                await self._mkdir_as_root(dest_dir)
                ok = await self._put_archive(dest_dir, archive)
        except SandboxError:
            raise
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=FailureStage.SEED,
                operation="upload",
                default_kind="sandbox_file_failed",
                what=f"upload into {dest_dir!r} failed",
            ) from exc
        if not ok:
            message = f"upload into {dest_dir!r}: the engine refused the archive"
            raise SandboxError(
                message,
                failure=sandbox_failure(
                    "sandbox_file_failed", stage=FailureStage.SEED, operation="upload", message=message
                ),
            )

    async def _put_archive(self, dest_dir: str, archive: bytes) -> bool:
        if self._engine is None:
            return await _blocking(
                self._api.put_archive, self.sandbox_id, dest_dir, archive, within=FILE_DEADLINE_S
            )
        await asyncio.wait_for(
            self._engine.request(
                "PUT",
                f"/containers/{self.sandbox_id}/archive?path={quote(dest_dir)}",
                archive,
                content_type="application/x-tar",
                timeout=FILE_DEADLINE_S,
            ),
            FILE_DEADLINE_S,
        )
        return True  # an error status raised

    async def _get_archive(self, path: str) -> bytes:
        if self._engine is None:

            def fetch() -> bytes:
                chunks, _stat = self._api.get_archive(self.sandbox_id, path)
                return b"".join(chunks)

            return await _blocking(fetch, within=FILE_DEADLINE_S)
        return await asyncio.wait_for(
            self._engine.request(
                "GET", f"/containers/{self.sandbox_id}/archive?path={quote(path)}", timeout=FILE_DEADLINE_S
            ),
            FILE_DEADLINE_S,
        )

    async def _mkdir_as_root(self, dest_dir: str) -> None:
        made = await self.exec(["mkdir", "-p", "--", dest_dir], timeout=CALL_DEADLINE_S, user="0")
        if not made.ok:
            detail = made.stderr.decode("utf-8", "replace").strip() or made.error or f"exit {made.exit_code}"
            message = f"upload: cannot create {dest_dir!r} in the sandbox: {detail}"
            raise SandboxError(
                message,
                failure=sandbox_failure(
                    "sandbox_file_failed", stage=FailureStage.SEED, operation="upload", message=message
                ),
            )

    async def download_tar(self, path: str) -> bytes:
        self._ensure_open("download")
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"path must be absolute inside the sandbox, got {path!r}")
        try:
            archive = await self._get_archive(path)
        except docker.errors.NotFound as exc:
            message = f"download: {path!r} does not exist in sandbox {self.sandbox_id[:12]}"
            raise SandboxFileNotFoundError(
                message,
                failure=sandbox_failure(
                    "sandbox_file_failed",
                    stage=FailureStage.SEED,
                    operation="download",
                    message=message,
                    cause=exc,
                    http_status=_http_status(exc),
                ),
            ) from exc
        except Exception as exc:
            raise _engine_error(
                exc,
                stage=FailureStage.SEED,
                operation="download",
                default_kind="sandbox_file_failed",
                what=f"download of {path!r} failed",
            ) from exc
        tarsafe.check_archive(archive)
        return archive
