"""File transfer into and out of one OpenSandbox sandbox over execd (single files and tar archives)."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from opencode_tui_core.failures import (
    FailureStage,
)
from opencode_tui_core.sandbox import tarsafe
from opencode_tui_core.sandbox.base import (
    ExecResult,
)
from opencode_tui_core.sandbox.errors import (
    ExpectedRefusal,
    SandboxError,
    SandboxFileNotFoundError,
    sandbox_error,
    sandbox_failure,
)
from opencode_tui_core.sandbox.opensandbox.common import (
    NOT_FOUND_EXIT,
)
from opencode_tui_core.sandbox.opensandbox.http import RequestFailed


class ExecdFiles:
    """The file transfer of ``OpenSandboxSandbox``."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into

        def __getattr__(self, name: str) -> Any: ...

    async def _upload_bytes(
        self, path: str, data: bytes, mode: int, *, operation: str = "upload", deadline: float | None = None
    ) -> None:
        metadata = json.dumps({"path": path, "mode": int(f"{mode & 0o7777 & ~tarsafe.SPECIAL_BITS:o}")})
        try:
            await self._execd_request(
                "upload",
                "POST",
                "/files/upload",
                files={
                    "metadata": (None, metadata, "application/json"),
                    "file": (PurePosixPath(path).name, data, "application/octet-stream"),
                },
                timeout=self.settings.file_timeout_s,
                deadline=deadline,
                default_kind="sandbox_file_failed",
            )
        except RequestFailed as exc:
            raise sandbox_error(
                exc.failure(
                    stage=FailureStage.SEED, operation=operation, message=f"upload of {path!r} failed: {exc}"
                ),
                exc,
            ) from exc

    async def upload_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._ensure_open("upload")
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"path must be absolute inside the sandbox, got {path!r}")
        await self._upload_bytes(path, data, mode)

    async def download_file(self, path: str) -> bytes:
        self._ensure_open("download")
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"path must be absolute inside the sandbox, got {path!r}")
        try:
            response = await self._execd_request(
                "download",
                "GET",
                "/files/download",
                params={"path": path},
                timeout=self.settings.file_timeout_s,
                default_kind="sandbox_file_failed",
            )
        except RequestFailed as exc:
            failure = exc.failure(
                stage=FailureStage.SEED, operation="download", message=f"download of {path!r} failed: {exc}"
            )
            if exc.http_status == 404:
                raise SandboxFileNotFoundError(
                    f"download: {path!r} does not exist in sandbox {self.sandbox_id}", failure=failure
                ) from exc
            raise sandbox_error(failure, exc) from exc
        return response.content

    def _file_error(self, operation: str, message: str, result: ExecResult | None = None) -> SandboxError:
        detail = ""
        if result is not None:
            detail = (
                result.stderr.decode("utf-8", "replace").strip() or result.error or f"exit {result.exit_code}"
            )
        return SandboxError(
            f"{message}: {detail}" if detail else message,
            failure=sandbox_failure(
                "sandbox_file_failed",
                stage=FailureStage.SEED,
                operation=operation,
                message=f"{message}: {detail}" if detail else message,
            ),
        )

    async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
        self._ensure_open("upload")
        if not PurePosixPath(dest_dir).is_absolute():
            raise ValueError(f"dest_dir must be an absolute path inside the sandbox, got {dest_dir!r}")
        tarsafe.check_archive(archive)  # raises UnsafeArchiveError before anything is written
        archive = tarsafe.without_special_bits(archive)  # tar as root keeps setuid/setgid as given
        tmp = f"/tmp/.opencode-tui-upload-{uuid.uuid4().hex[:16]}.tar"
        await self._upload_bytes(tmp, archive, 0o600)
        script = 'mkdir -p -- "$1" && tar -xf "$2" -C "$1"; rc=$?; rm -f -- "$2"; exit $rc'
        argv = ["/bin/sh", "-c", script, "sh", dest_dir, tmp]
        result = None
        if self.user_ids is not None or self.settings.command_uid is not None:
            # Commands run as a chosen user: extract as root so the archive's owners and modes
            # apply (as that user, tar could neither chown nor set the mode of a root-owned target).
            with contextlib.suppress(ExpectedRefusal):
                result = await self.exec(argv, cwd="/", timeout=self.settings.file_timeout_s, uid=0, gid=0)
        if result is None:
            result = await self.exec(argv, cwd="/", timeout=self.settings.file_timeout_s)
        if not result.ok:
            raise self._file_error("upload", f"extracting into {dest_dir!r} failed", result)

    async def download_tar(self, path: str) -> bytes:
        self._ensure_open("download")
        p = PurePosixPath(path)
        if not p.is_absolute():
            raise ValueError(f"path must be absolute inside the sandbox, got {path!r}")
        parent, name = (str(p.parent), p.name) if p.name else ("/", ".")
        tmp = f"/tmp/.opencode-tui-download-{uuid.uuid4().hex[:16]}.tar"
        script = f'[ -e "$1/$2" ] || [ -L "$1/$2" ] || exit {NOT_FOUND_EXIT}; tar -cf "$3" -C "$1" -- "$2"'
        result = await self.exec(
            ["/bin/sh", "-c", script, "sh", parent, name, tmp], cwd="/", timeout=self.settings.file_timeout_s
        )
        try:
            if result.observed and result.exit_code == NOT_FOUND_EXIT:
                message = f"download: {path!r} does not exist in sandbox {self.sandbox_id}"
                raise SandboxFileNotFoundError(
                    message,
                    failure=sandbox_failure(
                        "sandbox_file_failed", stage=FailureStage.SEED, operation="download", message=message
                    ),
                )
            if not result.ok:
                raise self._file_error("download", f"archiving {path!r} failed", result)
            archive = await self.download_file(tmp)
        finally:
            if result.observed:
                with contextlib.suppress(SandboxError):
                    await self.exec(["rm", "-f", "--", tmp], cwd="/", timeout=30)
        tarsafe.check_archive(archive)
        return archive
