"""The pinned OpenCode installer and target selection.

Fault tests run against a real HTTP server on 127.0.0.1 acting as a registry mirror; one slow test installs
the real package from registry.npmjs.org and runs its ``--version``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from opencode_tui_core.runtime.installer import (
    DEFAULT_OPENCODE_VERSION,
    InstalledBinary,
    Installer,
    InstallerConfig,
    InstallError,
    check_version_output,
    default_cache_dir,
    verify_version_command,
)
from opencode_tui_core.runtime.targets import (
    ProbeError,
    SandboxFacts,
    Target,
    UnsupportedTargetError,
    parse_probe,
    probe_script,
    select_target,
)

PIN = DEFAULT_OPENCODE_VERSION
X64 = Target(arch="x64")


# --------------------------------------------------------------------------------------------------
# A registry mirror on 127.0.0.1
# --------------------------------------------------------------------------------------------------


def build_tarball(
    version: str = PIN, *, blob_size: int = 512 * 1024, extra: list[tarfile.TarInfo] | None = None
) -> bytes:
    """An npm-style package tarball whose ``package/bin/opencode`` is a script printing ``version``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:

        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tf.addfile(info, io.BytesIO(data))

        add("package/package.json", json.dumps({"name": "opencode-linux-x64", "version": version}).encode())
        add("package/bin/opencode", f"#!/bin/sh\necho {version}\n".encode(), 0o755)
        # Incompressible padding so a dripped download takes a while.
        add("package/blob.bin", os.urandom(blob_size))
        for info in extra or []:
            tf.addfile(info)
    return buf.getvalue()


def sri(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


@dataclass
class Mirror:
    """Registry behaviour knobs and request log; the handler reads them under ``lock``."""

    tarballs: dict[str, bytes] = field(default_factory=dict)  # package -> tarball
    integrity_override: dict[str, str] = field(default_factory=dict)
    versions_hint: dict[str, list[str]] = field(default_factory=dict)  # packument versions
    tarball_statuses: list[int] = field(default_factory=list)  # popped per tarball request (500 once...)
    cut_after: list[int | None] = field(default_factory=list)  # popped per tarball request: close after N
    drip_chunk: int = 0
    drip_delay: float = 0.0
    range_mode: str = "ok"  # ok | ignore (answer 200) | bad (wrong Content-Range)
    metadata_requests: int = 0
    tarball_requests: int = 0
    range_headers: list[str | None] = field(default_factory=list)
    body_bytes_sent: int = 0
    tarball_started: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""


def _handler(mirror: Mirror) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _json(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if len(parts) == 3 and parts[1] == "-":
                return self._tarball(parts[0])
            if len(parts) == 2:
                name, version = parts
                with mirror.lock:
                    mirror.metadata_requests += 1
                    data = mirror.tarballs.get(name)
                    integrity = mirror.integrity_override.get(name)
                if data is None or version != PIN:
                    return self._json(404, {"error": "version not found: " + version})
                tarball = f"{mirror.url}/{name}/-/{name}-{version}.tgz"
                return self._json(
                    200,
                    {
                        "name": name,
                        "version": version,
                        "dist": {"tarball": tarball, "integrity": integrity or sri(data), "shasum": "x"},
                    },
                )
            if len(parts) == 1 and parts[0] in mirror.versions_hint:
                versions = {v: {} for v in mirror.versions_hint[parts[0]]}
                return self._json(200, {"name": parts[0], "versions": versions})
            return self._json(404, {"error": "not found"})

        def _tarball(self, name: str) -> None:
            rng = self.headers.get("range")
            with mirror.lock:
                mirror.tarball_requests += 1
                mirror.range_headers.append(rng)
                data = mirror.tarballs[name]
                status = mirror.tarball_statuses.pop(0) if mirror.tarball_statuses else 200
                cut = mirror.cut_after.pop(0) if mirror.cut_after else None
            if status != 200:
                return self._json(status, {"error": "boom"})
            start = 0
            if rng and mirror.range_mode != "ignore":
                start = int(rng.removeprefix("bytes=").rstrip("-"))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("content-range", f"bytes */{len(data)}")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                shown = start + 1 if mirror.range_mode == "bad" else start
                self.send_header("content-range", f"bytes {shown}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("content-type", "application/octet-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            mirror.tarball_started.set()
            if cut is not None:
                body = body[:cut]
            step = mirror.drip_chunk or len(body) or 1
            try:
                for i in range(0, len(body), step):
                    piece = body[i : i + step]
                    self.wfile.write(piece)
                    self.wfile.flush()
                    with mirror.lock:
                        mirror.body_bytes_sent += len(piece)
                    if mirror.drip_delay:
                        time.sleep(mirror.drip_delay)
            except (BrokenPipeError, ConnectionResetError):
                pass
            if cut is not None:
                self.close_connection = True

    return Handler


@pytest.fixture
def mirror() -> Iterator[Mirror]:
    m = Mirror()
    m.tarballs["opencode-linux-x64"] = build_tarball()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(m))
    server.daemon_threads = True
    m.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield m
    finally:
        server.shutdown()
        server.server_close()


def make_installer(mirror: Mirror, cache: Path, **kw: object) -> Installer:
    return Installer(InstallerConfig(registry_url=mirror.url, cache_dir=cache, **kw))  # type: ignore[arg-type]


def leftovers(cache: Path) -> list[str]:
    """Everything in the cache except the (empty, persistent) lock files and the bare directories."""
    found = []
    for p in cache.rglob("*"):
        rel = p.relative_to(cache)
        if rel.parts[0] == ".locks" or (
            p.is_dir() and rel.parts[0] in (".downloads", PIN) and len(rel.parts) == 1
        ):
            continue
        found.append(str(rel))
    return sorted(found)


def run_version(binary: InstalledBinary) -> str:
    return subprocess.run(
        verify_version_command(binary.path), capture_output=True, text=True, timeout=60, check=True
    ).stdout


# --------------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------------


def test_package_names_match_the_registry() -> None:
    # Names as listed by `npm view opencode-ai@1.18.32 optionalDependencies`.
    assert Target(arch="x64").package_name == "opencode-linux-x64"
    assert Target(arch="x64", baseline=True).package_name == "opencode-linux-x64-baseline"
    assert Target(arch="x64", libc="musl").package_name == "opencode-linux-x64-musl"
    assert Target(arch="x64", libc="musl", baseline=True).package_name == "opencode-linux-x64-baseline-musl"
    assert Target(arch="arm64").package_name == "opencode-linux-arm64"
    assert Target(arch="arm64", libc="musl").package_name == "opencode-linux-arm64-musl"
    with pytest.raises(ValidationError, match="baseline builds exist only for x64"):
        Target(arch="arm64", baseline=True)
    with pytest.raises(ValidationError):
        Target(arch="x64", gpu=True)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Target(arch="riscv64")  # type: ignore[arg-type]


def probe_output(machine: str, *, libc: str, avx2: str, ldd: bool = True, noise: bool = False) -> str:
    """Probe output as a glibc (Debian) or musl (Alpine) sandbox would print it."""
    lines = ["Welcome to the sandbox!"] if noise else []
    lines.append("opencode_tui_probe=1")
    lines += ["os=Linux", f"machine={machine}"]
    if libc == "glibc":
        lines += [
            "musl_loader=",
            "glibc_loader=/lib64/ld-linux-x86-64.so.2",
            "ldd_version=ldd (Debian GLIBC 2.36-9+deb12u14) 2.36" if ldd else "ldd_version=",
            "gnu_libc_version=glibc 2.36" if ldd else "gnu_libc_version=",
            "python3=/usr/bin/python3",
            "python3_version=3.11.2",
            "apt_get=/usr/bin/apt-get",
            "apk=",
        ]
    else:
        arch = "x86_64" if machine == "x86_64" else "aarch64"
        lines += [
            f"musl_loader=/lib/ld-musl-{arch}.so.1",
            "glibc_loader=",
            "ldd_version=musl libc (x86_64)" if ldd else "ldd_version=",
            "gnu_libc_version=",
            "python3=",
            "python3_version=",
            "apt_get=",
            "apk=/sbin/apk",
        ]
    lines += [f"avx2={avx2}", "rg=", "sh=/bin/sh", "bash=", "uid=1000", "opencode_tui_probe_end=1"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize("libc", ["glibc", "musl"])
@pytest.mark.parametrize("avx2", ["yes", "no"])
@pytest.mark.parametrize("ldd", [True, False])
def test_select_target_over_arch_libc_cpu(machine: str, libc: str, avx2: str, ldd: bool) -> None:
    facts = parse_probe(probe_output(machine, libc=libc, avx2=avx2, ldd=ldd, noise=True))
    target = select_target(facts)
    arch = "x64" if machine == "x86_64" else "arm64"
    assert target == Target(arch=arch, libc=libc, baseline=arch == "x64" and avx2 == "no")  # type: ignore[arg-type]
    assert facts.uid == 1000
    assert facts.has_shell and facts.rg is None and facts.bash is None
    if libc == "glibc":
        assert facts.python3 == "/usr/bin/python3" and facts.python3_version_info == (3, 11, 2)
        assert facts.apt_get and not facts.apk
    else:
        assert facts.python3 is None and facts.python3_version_info is None and facts.apk


def test_libc_evidence_order() -> None:
    base = {"machine": "x86_64", "avx2": True}
    # Debian with the musl package: both loaders, but ldd names glibc.
    debian_musl = SandboxFacts(
        **base,
        musl_loader="/lib/ld-musl-x86_64.so.1",
        glibc_loader="/lib64/ld-linux-x86-64.so.2",
        ldd_version="ldd (Debian GLIBC 2.36-9+deb12u14) 2.36",
    )
    assert select_target(debian_musl).package_name == "opencode-linux-x64"
    # Alpine with gcompat: a glibc-named loader, but ldd names musl.
    alpine_gcompat = SandboxFacts(
        **base,
        musl_loader="/lib/ld-musl-x86_64.so.1",
        glibc_loader="/lib/ld-linux-x86-64.so.2",
        ldd_version="musl libc (x86_64)",
    )
    assert select_target(alpine_gcompat).package_name == "opencode-linux-x64-musl"
    # No ldd: getconf GNU_LIBC_VERSION only exists on glibc.
    assert SandboxFacts(**base, musl_loader="/x", gnu_libc_version="glibc 2.36").libc == "glibc"
    assert SandboxFacts(**base, glibc_loader="/lib64/ld-linux-x86-64.so.2").libc == "glibc"
    # avx2 unknown (no readable /proc/cpuinfo): baseline runs everywhere.
    assert select_target(SandboxFacts(machine="x86_64", avx2=None)).baseline is True


@pytest.mark.parametrize("machine", ["armv7l", "riscv64", "s390x", "i686"])
def test_unknown_arch_is_a_clear_error(machine: str) -> None:
    with pytest.raises(UnsupportedTargetError, match=f"'{machine}'.*x86_64.*aarch64"):
        select_target(parse_probe(probe_output(machine, libc="glibc", avx2="yes")))


def test_probe_output_must_be_complete() -> None:
    full = probe_output("x86_64", libc="glibc", avx2="yes")
    with pytest.raises(ProbeError, match="no start marker"):
        parse_probe("sh: 1: syntax error\n")
    with pytest.raises(ProbeError, match="truncated"):
        parse_probe(full.split("avx2=")[0])
    with pytest.raises(ProbeError, match="machine"):
        parse_probe(full.replace("machine=x86_64", "machine="))


def test_probe_script_runs_on_this_host() -> None:
    out = subprocess.run(
        ["/bin/sh", "-c", probe_script()], capture_output=True, text=True, timeout=30, check=True
    )
    facts = parse_probe(out.stdout)
    assert facts.machine == platform.machine()
    assert facts.os == "Linux"
    assert facts.uid == os.getuid()
    assert facts.sh is not None
    assert (facts.bash is not None) == (shutil.which("bash") is not None)
    assert (facts.rg is not None) == (shutil.which("rg") is not None)
    assert (facts.apt_get is not None) == (shutil.which("apt-get") is not None)
    if shutil.which("python3"):
        assert facts.python3 is not None and facts.python3_version_info is not None
        assert facts.python3_version_info >= (3, 0)
    if platform.machine() == "x86_64":
        with open("/proc/cpuinfo") as f:
            assert facts.avx2 == (" avx2" in f.read())
    if platform.libc_ver()[0] == "glibc":
        assert facts.libc == "glibc"  # even if a musl loader is installed next to glibc
    select_target(facts)


# --------------------------------------------------------------------------------------------------
# Small helpers and config
# --------------------------------------------------------------------------------------------------


def test_version_helpers() -> None:
    assert verify_version_command(Path("/c/opencode")) == ["/c/opencode", "--version"]
    assert check_version_output("1.18.32\n", "1.18.32")
    assert check_version_output("opencode v1.18.32", "1.18.32")
    assert not check_version_output("1.18.33\n", "1.18.32")
    assert not check_version_output("1.18.320\n", "1.18.32")
    assert not check_version_output("", "1.18.32")


def test_installer_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = InstallerConfig(registry_url="https://mirror.example/npm/")
    assert cfg.version == "1.18.32" and cfg.timeout_s == 600
    assert cfg.registry_url == "https://mirror.example/npm"
    for bad in (
        {"timeout_s": float("inf")},
        {"timeout_s": 0},
        {"version": "../x"},
        {"registry_url": "ftp://x"},
    ):
        with pytest.raises(ValidationError):
            InstallerConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        InstallerConfig(mirror="x")  # type: ignore[call-arg]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "opencode-tui" / "opencode"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert default_cache_dir() == Path.home() / ".cache" / "opencode-tui" / "opencode"


# --------------------------------------------------------------------------------------------------
# Installs against the local mirror
# --------------------------------------------------------------------------------------------------


async def test_install_progress_and_cache_hit(mirror: Mirror, tmp_path: Path) -> None:
    mirror.drip_chunk, mirror.drip_delay = 32 * 1024, 0.02
    cache = tmp_path / "cache"
    installer = make_installer(mirror, cache)
    seen: list[tuple[int, int | None]] = []
    threads: set[int] = set()

    def progress(done: int, total: int | None) -> None:
        threads.add(threading.get_ident())
        seen.append((done, total))

    result = await installer.ensure(X64, on_progress=progress)
    size = len(mirror.tarballs["opencode-linux-x64"])
    assert result.downloaded and result.version == PIN and result.target == X64
    assert result.path == cache / PIN / "opencode-linux-x64" / "opencode"
    assert os.stat(result.path).st_mode & 0o777 == 0o755
    assert check_version_output(run_version(result), PIN)
    assert result.sha256 == hashlib.sha256(result.path.read_bytes()).hexdigest()
    meta = json.loads((result.path.parent / "meta.json").read_text())
    assert meta["sha256"] == result.sha256 and meta["version"] == PIN
    # Progress: delivered on the caller's loop thread, never decreasing, with the right total.
    await asyncio.sleep(0)
    assert threads == {threading.get_ident()}
    assert len(seen) >= 3
    assert all(total == size for _, total in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1][0] == size
    assert leftovers(cache) == [f"{PIN}/opencode-linux-x64", f"{PIN}/opencode-linux-x64/meta.json",
                                f"{PIN}/opencode-linux-x64/opencode"]  # fmt: skip

    again = await installer.ensure(X64)
    assert not again.downloaded and again.sha256 == result.sha256
    # A fresh Installer over the same cache also hits.
    assert not (await make_installer(mirror, cache).ensure(X64)).downloaded
    assert mirror.tarball_requests == 1 and mirror.metadata_requests == 1


async def test_download_does_not_block_the_event_loop(mirror: Mirror, tmp_path: Path) -> None:
    mirror.drip_chunk, mirror.drip_delay = 8 * 1024, 0.02  # ~1.3 s for the body
    installer = make_installer(mirror, tmp_path / "cache")
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await installer.ensure(X64)
    stop.set()
    await tick
    assert len(gaps) > 20
    assert max(gaps) < 0.5  # hashing and extracting are off the loop too


async def test_integrity_mismatch_fails_clearly_and_leaves_nothing(mirror: Mirror, tmp_path: Path) -> None:
    wrong = sri(b"something else")
    mirror.integrity_override["opencode-linux-x64"] = wrong
    cache = tmp_path / "cache"
    installer = make_installer(mirror, cache)
    with pytest.raises(InstallError) as info:
        await installer.ensure(X64)
    err = info.value
    good = sri(mirror.tarballs["opencode-linux-x64"])
    assert err.kind == "install_integrity_mismatch"
    assert wrong in str(err) and good in str(err)  # expected vs. got
    assert f"{mirror.url}/opencode-linux-x64/-/opencode-linux-x64-{PIN}.tgz" in str(err)
    assert err.url and err.package == "opencode-linux-x64" and err.version == PIN
    assert "Retry" in str(err)
    assert leftovers(cache) == []
    assert installer.cached(X64) is None

    # The failure is not cached: once the mirror is fixed, the next call installs.
    del mirror.integrity_override["opencode-linux-x64"]
    assert (await installer.ensure(X64)).downloaded


async def test_concurrent_callers_share_one_download(mirror: Mirror, tmp_path: Path) -> None:
    mirror.drip_chunk, mirror.drip_delay = 32 * 1024, 0.01
    cache = tmp_path / "cache"
    first, second = make_installer(mirror, cache), make_installer(mirror, cache)
    progress: list[list[int]] = [[] for _ in range(6)]
    results = await asyncio.gather(
        *[
            (first if i % 2 else second).ensure(X64, on_progress=lambda d, t, i=i: progress[i].append(d))
            for i in range(6)
        ]
    )
    assert mirror.tarball_requests == 1 and mirror.metadata_requests == 1
    assert {r.path for r in results} == {cache / PIN / "opencode-linux-x64" / "opencode"}
    assert all(r.downloaded for r in results)
    size = len(mirror.tarballs["opencode-linux-x64"])
    assert all(p and p[-1] == size for p in progress)  # every waiter saw the shared progress


async def test_cancelled_waiters_do_not_cancel_the_install(mirror: Mirror, tmp_path: Path) -> None:
    mirror.drip_chunk, mirror.drip_delay = 16 * 1024, 0.02  # ~0.7 s for the whole body
    cache = tmp_path / "cache"
    installer = make_installer(mirror, cache)
    waiters = [asyncio.create_task(installer.ensure(X64)) for _ in range(3)]
    assert await asyncio.to_thread(mirror.tarball_started.wait, 10)
    await asyncio.sleep(0.1)
    assert installer.is_installing(X64)
    for w in waiters:
        w.cancel()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)

    # The install carries on without any waiter and lands in the cache.
    for _ in range(200):
        if not installer.is_installing(X64):
            break
        await asyncio.sleep(0.05)
    assert installer.cached(X64) is not None
    result = await installer.ensure(X64)
    assert not result.downloaded
    assert check_version_output(run_version(result), PIN)
    size = len(mirror.tarballs["opencode-linux-x64"])
    assert mirror.tarball_requests == 1 and mirror.body_bytes_sent == size


async def test_caller_after_cancellation_joins_the_running_install(mirror: Mirror, tmp_path: Path) -> None:
    mirror.drip_chunk, mirror.drip_delay = 16 * 1024, 0.02
    installer = make_installer(mirror, tmp_path / "cache")
    waiter = asyncio.create_task(installer.ensure(X64))
    assert await asyncio.to_thread(mirror.tarball_started.wait, 10)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    result = await installer.ensure(X64)  # joins the same in-flight install
    assert result.downloaded
    assert mirror.tarball_requests == 1 and mirror.body_bytes_sent == len(
        mirror.tarballs["opencode-linux-x64"]
    )


async def test_failed_install_is_retried_by_the_next_caller(mirror: Mirror, tmp_path: Path) -> None:
    mirror.tarball_statuses = [500]
    cache = tmp_path / "cache"
    installer = make_installer(mirror, cache)
    with pytest.raises(InstallError) as info:
        await installer.ensure(X64)
    assert info.value.kind == "install_failed" and info.value.http_status == 500
    assert "HTTP 500" in str(info.value) and "Retry" in str(info.value)
    assert installer.cached(X64) is None and not installer.is_installing(X64)
    result = await installer.ensure(X64)
    assert result.downloaded and mirror.tarball_requests == 2


async def test_interrupted_download_resumes_with_range_on_next_call(mirror: Mirror, tmp_path: Path) -> None:
    data = mirror.tarballs["opencode-linux-x64"]
    cut = 200_000
    mirror.cut_after = [cut]
    cache = tmp_path / "cache"
    installer = make_installer(mirror, cache, download_attempts=1)
    with pytest.raises(InstallError) as info:
        await installer.ensure(X64)
    # A connection cut mid-body is a network condition: retryable, and the retry resumes.
    assert info.value.kind == "install_registry_unreachable"
    partial = cache / ".downloads" / f"opencode-linux-x64-{PIN}.tgz.partial"
    assert partial.stat().st_size == cut  # kept for the resume

    seen: list[int] = []
    result = await installer.ensure(X64, on_progress=lambda d, t: seen.append(d))
    assert result.downloaded and check_version_output(run_version(result), PIN)
    assert mirror.range_headers == [None, f"bytes={cut}-"]
    assert mirror.body_bytes_sent == len(data)  # nothing downloaded twice
    assert seen[0] == cut and seen[-1] == len(data)
    assert not partial.exists() and not partial.with_name(partial.name + ".json").exists()


async def test_broken_stream_resumes_within_one_install(mirror: Mirror, tmp_path: Path) -> None:
    data = mirror.tarballs["opencode-linux-x64"]
    mirror.cut_after = [100_000, 150_000]
    installer = make_installer(mirror, tmp_path / "cache")  # 3 attempts by default
    result = await installer.ensure(X64)
    assert result.downloaded
    assert mirror.range_headers == [None, "bytes=100000-", "bytes=250000-"]
    assert mirror.body_bytes_sent == len(data)


@pytest.mark.parametrize("range_mode", ["ignore", "bad"])
async def test_resume_refused_restarts_cleanly(mirror: Mirror, tmp_path: Path, range_mode: str) -> None:
    data = mirror.tarballs["opencode-linux-x64"]
    mirror.cut_after = [200_000]
    mirror.range_mode = range_mode
    installer = make_installer(mirror, tmp_path / "cache", download_attempts=1)
    with pytest.raises(InstallError):
        await installer.ensure(X64)
    result = await installer.ensure(X64)
    assert result.downloaded and check_version_output(run_version(result), PIN)
    assert mirror.range_headers[1] == "bytes=200000-"
    if range_mode == "ignore":  # the 200 answer is used from scratch
        assert mirror.tarball_requests == 2 and mirror.body_bytes_sent == 200_000 + len(data)
    else:  # a mismatching Content-Range is discarded and the file fetched again without Range
        assert mirror.range_headers[2:] == [None]


async def test_complete_partial_is_verified_without_refetching(mirror: Mirror, tmp_path: Path) -> None:
    # A crash after the download but before the commit leaves a complete .partial; the server answers 416.
    cache = tmp_path / "cache"
    installer = make_installer(mirror, cache)
    data = mirror.tarballs["opencode-linux-x64"]
    partial = cache / ".downloads" / f"opencode-linux-x64-{PIN}.tgz.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data)
    tarball = f"{mirror.url}/opencode-linux-x64/-/opencode-linux-x64-{PIN}.tgz"
    partial.with_name(partial.name + ".json").write_text(
        json.dumps({"tarball": tarball, "integrity": sri(data)})
    )
    result = await installer.ensure(X64)
    assert result.downloaded and mirror.body_bytes_sent == 0
    assert mirror.range_headers == [f"bytes={len(data)}-"]


async def test_install_timeout(mirror: Mirror, tmp_path: Path) -> None:
    mirror.drip_chunk, mirror.drip_delay = 8 * 1024, 0.1  # ~6.5 s for the body
    cache = tmp_path / "cache"
    installer = make_installer(mirror, cache, timeout_s=0.6)
    started = time.monotonic()
    with pytest.raises(InstallError) as info:
        await installer.ensure(X64)
    assert time.monotonic() - started < 3.0
    assert info.value.kind == "install_timeout"
    assert "0.6 s" in str(info.value) and "timeout" in str(info.value)
    assert installer.cached(X64) is None
    # The partial download stays for the next attempt, which resumes it.
    for _ in range(100):
        if not installer.is_installing(X64):
            break
        await asyncio.sleep(0.05)
    mirror.drip_chunk = mirror.drip_delay = 0
    partial = cache / ".downloads" / f"opencode-linux-x64-{PIN}.tgz.partial"
    kept = partial.stat().st_size
    assert kept > 0
    assert (await make_installer(mirror, cache).ensure(X64)).downloaded
    assert mirror.range_headers[-1] == f"bytes={kept}-"


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ([_link("package/evil", "/etc/passwd")], "link"),
        ([_link("package/hard", "package/bin/opencode", tarfile.LNKTYPE)], "link"),
        ([tarfile.TarInfo("../escape")], "outside package/"),
        ([tarfile.TarInfo("/abs")], "outside package/"),
        ([tarfile.TarInfo("package/bin/opencode")], "appears twice"),
    ],
)
async def test_weird_tarballs_are_refused(mirror: Mirror, tmp_path: Path, extra: list, why: str) -> None:
    mirror.tarballs["opencode-linux-x64"] = build_tarball(blob_size=10, extra=extra)
    cache = tmp_path / "cache"
    with pytest.raises(InstallError, match=why) as info:
        await make_installer(mirror, cache).ensure(X64)
    assert info.value.kind == "install_failed"
    assert leftovers(cache) == []


async def test_tarball_without_binary_is_refused(mirror: Mirror, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("package/package.json")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"{}"))
    mirror.tarballs["opencode-linux-x64"] = buf.getvalue()
    cache = tmp_path / "cache"
    with pytest.raises(InstallError, match="no package/bin/opencode"):
        await make_installer(mirror, cache).ensure(X64)
    assert leftovers(cache) == []


async def test_missing_version_names_what_the_registry_has(mirror: Mirror, tmp_path: Path) -> None:
    mirror.versions_hint["opencode-linux-arm64"] = ["1.18.15", "1.18.18", "1.18.14"]
    with pytest.raises(InstallError) as info:
        await make_installer(mirror, tmp_path / "cache").ensure(Target(arch="arm64"))
    err = info.value
    assert err.kind == "install_failed" and err.http_status == 404
    assert f"opencode-linux-arm64@{PIN}" in str(err)
    assert "1.18.14, 1.18.15, 1.18.18" in str(err)


async def test_unreachable_registry(tmp_path: Path) -> None:
    installer = Installer(InstallerConfig(registry_url="http://127.0.0.1:9", cache_dir=tmp_path / "c"))
    with pytest.raises(InstallError) as info:
        await installer.ensure(X64)
    assert info.value.kind == "install_registry_unreachable"
    assert "http://127.0.0.1:9" in str(info.value) and "registry_url" in str(info.value)
    assert "ConnectError" in str(info.value)


async def test_an_install_failure_keeps_its_cause_and_http_status(mirror: Mirror, tmp_path: Path) -> None:
    """What the episode records from an InstallError (issue 25): the registry's status as the
    failure's ``http_status`` (the policy reads it), and the cause chain behind a refused connection."""
    from opencode_tui_core.runtime.prepare import install_failure

    mirror.tarball_statuses = [500]
    with pytest.raises(InstallError) as info:
        await make_installer(mirror, tmp_path / "cache").ensure(X64)
    failure = install_failure(info.value).failure
    assert (failure.kind, failure.http_status, failure.stage.value) == ("install_failed", 500, "install")
    assert failure.details.data["http_status"] == 500 and failure.details.data["url"].startswith(mirror.url)
    assert (
        failure.cause is not None and failure.cause.type == "opencode_tui_core.runtime.installer.InstallError"
    )

    refused = Installer(InstallerConfig(registry_url="http://127.0.0.1:9", cache_dir=tmp_path / "c"))
    with pytest.raises(InstallError) as info:
        await refused.ensure(X64)
    failure = install_failure(info.value).failure
    assert failure.kind == "install_registry_unreachable" and failure.http_status is None
    assert [c.type for c in failure.cause.chain()][:2] == [
        "opencode_tui_core.runtime.installer.InstallError",
        "httpx.ConnectError",
    ]


async def test_stalled_registry_fails_within_the_budget_and_is_retryable(tmp_path: Path) -> None:
    """A registry that accepts the connection and never answers (a real loopback listener that never
    reads): the install ends within its budget with an error naming the registry, never a hang."""
    import socket

    from opencode_tui_core.failures import DEFAULT_POLICY, Action, FailureEvent, decide

    stall = socket.socket()
    stall.bind(("127.0.0.1", 0))
    stall.listen(8)  # the kernel completes handshakes into the backlog; nobody ever reads
    url = f"http://127.0.0.1:{stall.getsockname()[1]}"
    try:
        installer = Installer(InstallerConfig(registry_url=url, cache_dir=tmp_path / "c", timeout_s=2))
        started = time.monotonic()
        with pytest.raises(InstallError) as info:
            await installer.ensure(X64)
        assert time.monotonic() - started < 4.0
    finally:
        stall.close()
    assert info.value.kind in ("install_registry_unreachable", "install_timeout"), info.value.kind
    assert url in str(info.value) or "2 s" in str(info.value)
    failure = FailureEvent(
        kind=info.value.kind, stage="install", operation="install", message=str(info.value)
    )
    assert decide(failure, attempt=1, policy=DEFAULT_POLICY).action is Action.RETRY
    assert decide(failure, attempt=3, policy=DEFAULT_POLICY).action is Action.MARK_EVALUATION_ERROR


async def test_corrupted_cache_is_detected_refetched_and_never_executed(
    mirror: Mirror, tmp_path: Path
) -> None:
    """Wrong bytes in the cached binary (same size, so only the digest can tell): the cache refuses
    it and the next install fetches it again. (That an episode never runs it is a row of
    benchmarks/faults.py: the corrupt binary there would report another version.)"""
    cache = tmp_path / "cache"
    first = await make_installer(mirror, cache).ensure(X64)
    good = first.path.read_bytes()
    evil = good.replace(PIN.encode(), b"6.66.66"[: len(PIN)].ljust(len(PIN), b"6"))
    assert evil != good and len(evil) == len(good)
    first.path.write_bytes(evil)

    fresh = make_installer(mirror, cache)
    assert fresh.cached(X64) is None
    assert fresh.corrupt is not None and "does not match the sha256" in fresh.corrupt
    again = await fresh.ensure(X64)
    assert again.downloaded and mirror.tarball_requests == 2
    assert again.path.read_bytes() == good and again.sha256 == hashlib.sha256(good).hexdigest()
    assert check_version_output(run_version(again), PIN)
    # Verified once, then trusted while unchanged: a third installer hits the cache.
    assert make_installer(mirror, cache).cached(X64) is not None


async def test_prewarm_checks_every_entry_once_and_never_vouches_for_a_corrupt_one(
    mirror: Mirror, tmp_path: Path
) -> None:
    """``prewarm`` (run by the episode while its sandbox is made) hashes each complete entry of the
    pin, so the install phase's ``cached`` answers from memory; a corrupt entry is not remembered and
    ``cached`` still refuses it."""
    from opencode_tui_core.runtime import installer as installer_module

    cache = tmp_path / "cache"
    got = await make_installer(mirror, cache).ensure(X64)
    installer_module._VERIFIED.clear()  # a fresh process: nothing checked yet
    make_installer(mirror, cache).prewarm()
    assert [k[0] for k in installer_module._VERIFIED] == [str(got.path)]
    assert make_installer(mirror, cache).cached(X64) is not None

    installer_module._VERIFIED.clear()
    got.path.write_bytes(got.path.read_bytes()[:-1] + b"\0")
    fresh = make_installer(mirror, cache)
    fresh.prewarm()
    assert not installer_module._VERIFIED
    assert fresh.cached(X64) is None and fresh.corrupt is not None
    make_installer(mirror, tmp_path / "empty").prewarm()  # no cache at all: nothing to do, no error


async def test_unwritable_cache_dir_says_so(mirror: Mirror, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(InstallError) as info:
        await make_installer(mirror, blocker / "cache").ensure(X64)
    assert info.value.kind == "install_failed"
    assert "cache directory" in str(info.value) and str(blocker) in str(info.value)


# --------------------------------------------------------------------------------------------------
# The real registry (one cold install per session)
# --------------------------------------------------------------------------------------------------


@dataclass
class RealInstall:
    binary: InstalledBinary
    seconds: float
    tarball_bytes: int | None


@pytest.fixture(scope="session")
def real_install(tmp_path_factory: pytest.TempPathFactory) -> RealInstall:
    out = subprocess.run(["/bin/sh", "-c", probe_script()], capture_output=True, text=True, timeout=30)
    target = select_target(parse_probe(out.stdout))
    installer = Installer(InstallerConfig(cache_dir=tmp_path_factory.mktemp("opencode-cache")))
    totals: list[int | None] = []
    started = time.monotonic()
    binary = asyncio.run(installer.ensure(target, on_progress=lambda d, t: totals.append(t)))
    return RealInstall(binary, time.monotonic() - started, totals[-1] if totals else None)


@pytest.mark.slow
def test_real_registry_install_runs_the_pinned_version(real_install: RealInstall, tmp_path: Path) -> None:
    binary = real_install.binary
    assert binary.downloaded and binary.version == PIN
    assert binary.integrity.startswith("sha512-")
    print(
        f"\ncold install of {binary.package}@{binary.version}: {real_install.seconds:.1f} s, "
        f"tarball {real_install.tarball_bytes} bytes, binary {binary.size} bytes"
    )
    # A private HOME/XDG so the binary cannot touch the user's OpenCode state.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}
    env |= {f"XDG_{d}_HOME": str(tmp_path / d.lower()) for d in ("CONFIG", "DATA", "STATE", "CACHE")}
    out = subprocess.run(
        verify_version_command(binary.path), capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert check_version_output(out.stdout, PIN), out.stdout

    # Second call: a cache hit, no download.
    again = asyncio.run(Installer(InstallerConfig(cache_dir=binary.path.parents[2])).ensure(binary.target))
    assert not again.downloaded and again.sha256 == binary.sha256
