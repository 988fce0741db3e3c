"""The in-sandbox ``opencode --version`` check runs once per binary file and sandbox fingerprint.

Real sandboxes (docker and local), the real probe and the real read-only bind of the installer cache.
The "binary" in the cache entry is a two-line shell script printing a version: what is under test is
when the engine runs it, not OpenCode itself (the installer tests run the real binary).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from opencode_tui_core.runtime.installer import META_NAME, Installer, InstallerConfig
from opencode_tui_core.runtime.prepare import (
    RUNTIME_CACHE_MOUNT,
    VERIFIED_NAME,
    RuntimeNotReady,
    prepare_runtime,
    probe,
)
from opencode_tui_core.runtime.targets import select_target
from opencode_tui_core.sandbox.base import Mount, SandboxSpec
from tests.core.conftest import require_docker_image

PIN = "1.18.32"


class Counting:
    """Delegates to a sandbox and counts the ``opencode --version`` execs."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.version_checks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def exec(self, argv: Sequence[str], **kw: Any) -> Any:
        if list(argv)[-1:] == ["--version"] and argv[0].endswith("/opencode"):
            self.version_checks += 1
        return await self._inner.exec(argv, **kw)


def _write_entry(installer: Installer, target: Any, version_printed: str) -> Path:
    entry = installer.entry_dir(target)
    entry.mkdir(parents=True, exist_ok=True)
    binary = entry / "opencode"
    tmp = entry / ".opencode.new"
    data = f"#!/bin/sh\necho {version_printed}\n".encode()
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    os.replace(tmp, binary)  # a new inode, as a reinstall would make
    meta = {
        "version": PIN,
        "package": target.package_name,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "integrity": "sha512-x",
        "tarball": "https://registry.invalid/t.tgz",
    }
    (entry / META_NAME).write_text(json.dumps(meta))
    return binary


@pytest.mark.parametrize(
    "provider_name",
    [pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)],
)
async def test_version_check_once_per_binary_and_fingerprint(provider_name: str, tmp_path: Path) -> None:
    if provider_name == "docker":
        require_docker_image()
        from opencode_tui_core.sandbox.docker.provider import DockerProvider as Provider
    else:
        from opencode_tui_core.sandbox.local.provider import LocalProvider as Provider
    cache = tmp_path / "cache"
    cache.mkdir()
    installer = Installer(InstallerConfig(version=PIN, cache_dir=cache))
    provider = Provider()
    layout = SimpleNamespace(bin_dir="/tmp/.octui-test-bin")

    async def prepared() -> tuple[Counting, Any]:
        spec = SandboxSpec(
            run_id="test-prepare-verified",
            image="opencode-tui/base:bookworm",
            mounts=[Mount(source=str(cache), target=RUNTIME_CACHE_MOUNT)],
        )
        sb = await provider.create(spec)
        counting = Counting(sb)
        try:
            runtime = await prepare_runtime(counting, installer, layout, emit=lambda _e: None, version=PIN)
            return counting, runtime
        finally:
            await sb.release()

    spec = SandboxSpec(run_id="test-prepare-verified", image="opencode-tui/base:bookworm")
    sb = await provider.create(spec)
    try:
        target = select_target(await probe(sb))
    finally:
        await sb.release()
    binary = _write_entry(installer, target, PIN)

    first, runtime = await prepared()
    assert runtime.mounted and first.version_checks == 1
    assert len(json.loads((binary.parent / VERIFIED_NAME).read_text())) == 1
    second, _ = await prepared()
    assert second.version_checks == 0, "a verified binary on the same fingerprint is not run again"

    # A replaced file (new inode, mtime) is new: checked again, and a wrong version is still refused.
    _write_entry(installer, target, "1.18.33")
    with pytest.raises(RuntimeNotReady) as info:
        await prepared()
    assert info.value.failure.kind == "install_failed" and "1.18.33" in info.value.failure.message
