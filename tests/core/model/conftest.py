"""Fixtures for the model-layer tests: the real OpenCode binary for the end-to-end test.

``opencode_bin`` downloads ``opencode-linux-x64@<pin>`` from the npm registry with ``npm pack`` (npm checks
the registry's integrity digest) into the pytest cache, once; later sessions reuse it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.runtime.installer import DEFAULT_OPENCODE_VERSION

PACKAGE = "opencode-linux-x64"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fetch(cache: Path, binary: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is needed to download the OpenCode binary for the end-to-end test")
    work = Path(tempfile.mkdtemp(dir=cache, prefix="pack-"))
    try:
        spec = f"{PACKAGE}@{DEFAULT_OPENCODE_VERSION}"
        proc = subprocess.run(
            [npm, "pack", spec, "--pack-destination", str(work), "--silent"],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=work,
            check=False,
        )
        tarballs = list(work.glob("*.tgz"))
        if proc.returncode != 0 or not tarballs:
            pytest.fail(f"npm pack {spec} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        with tarfile.open(tarballs[0]) as tf:
            member = tf.getmember("package/bin/opencode")
            if not member.isfile():
                pytest.fail(f"{spec}: package/bin/opencode is not a regular file")
            src = tf.extractfile(member)
            assert src is not None
            partial = binary.with_suffix(".partial")
            with src, partial.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        partial.chmod(0o755)
        os.replace(partial, binary)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def opencode_bin(request: pytest.FixtureRequest) -> Path:
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(
            f"the end-to-end test runs {PACKAGE} (this host is {platform.system()}/{platform.machine()})"
        )
    cache = Path(request.config.cache.mkdir(f"{PACKAGE}-{DEFAULT_OPENCODE_VERSION}"))
    binary = cache / "opencode"
    with _locked(cache / ".lock"):
        if not binary.exists():
            _fetch(cache, binary)
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=120, check=False)
    if out.stdout.strip() != DEFAULT_OPENCODE_VERSION:
        pytest.fail(f"{binary} --version said {out.stdout.strip()!r} {out.stderr.strip()[-500:]!r}")
    return binary
