"""Tar archives into and out of a local sandbox through its host-side binds."""

from __future__ import annotations

import asyncio
import tarfile
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from opencode_tui_core.failures import (
    FailureStage,
)
from opencode_tui_core.sandbox.errors import SandboxError, SandboxFileNotFoundError, sandbox_failure
from opencode_tui_core.sandbox.local.common import (
    _error,
)
from opencode_tui_core.sandbox.local.files import (
    _archive_pinned,
    _extract_pinned,
)
from opencode_tui_core.sandbox.tarsafe import check_archive

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# the sandbox


class SandboxTransfer:
    """``upload_tar``/``download_tar`` of ``LocalSandbox``."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into

        def __getattr__(self, name: str) -> Any: ...

    async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
        # Owners in the archive are not applied: whatever the engine writes appears inside as the
        # sandbox's one mapped user, which is what staging asks for.
        self._ensure_open("upload")
        bind, rel = self._translate(dest_dir, write=True, operation="upload")
        check_archive(archive)
        try:
            await asyncio.to_thread(_extract_pinned, bind.source, rel, archive, dest_dir)
        except SandboxError:
            raise
        except (OSError, tarfile.TarError) as exc:
            raise _error(
                "sandbox_file_failed",
                "upload",
                f"upload into {dest_dir!r} failed: {exc}",
                stage=FailureStage.AGENT,
                exc=exc,
            ) from exc

    async def download_tar(self, path: str) -> bytes:
        self._ensure_open("download")
        bind, rel = self._translate(path, write=False, operation="download")
        arcname = PurePosixPath(path).name or "root"
        try:
            return await asyncio.to_thread(_archive_pinned, bind.source, rel, arcname, path)
        except FileNotFoundError as exc:
            raise SandboxFileNotFoundError(
                f"{path!r} does not exist in local sandbox {self.sandbox_id}",
                failure=sandbox_failure(
                    "sandbox_file_failed",
                    stage=FailureStage.AGENT,
                    operation="download",
                    message=f"{path!r} does not exist",
                ),
            ) from exc
        except SandboxError:
            raise
        except (OSError, tarfile.TarError) as exc:
            raise _error(
                "sandbox_file_failed",
                "download",
                f"download of {path!r} failed: {exc}",
                stage=FailureStage.AGENT,
                exc=exc,
            ) from exc
