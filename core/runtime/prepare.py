"""Sandbox-side runtime preparation: probe, pick the target, install (controller side), place the
binary inside the sandbox, check its version, and make sure the prerequisites are there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.events import Event, InstallProgress, Warning_
from opencode_tui_core.failures import CommandDetails, FailureEvent, FailureStage, GenericDetails
from opencode_tui_core.runtime.installer import Installer, InstallError, check_version_output
from opencode_tui_core.runtime.targets import (
    ProbeError,
    SandboxFacts,
    Target,
    UnsupportedTargetError,
    parse_probe,
    probe_script,
)
from opencode_tui_core.sandbox.base import ExecResult, Sandbox, SandboxError, describe_exit
from opencode_tui_core.sandbox.errors import failure_of

# What a shell reports when the program it was asked to run is missing or not executable: the only
# exits that say "preinstall something". Any other failure of a probe is the sandbox's or the
# provider's, and keeps its own kind.
_NOT_FOUND_EXITS = (126, 127)

# Where providers that can bind-mount expose the controller's OpenCode cache (read-only).
RUNTIME_CACHE_MOUNT = "/opt/opencode-tui/cache"
MIN_PYTHON = (3, 8)
# In a cache entry: the sandbox fingerprints on which this exact binary file already answered
# ``--version`` with the pin (see ``_verified_key``).
VERIFIED_NAME = "verified-targets.json"


class RuntimeNotReady(Exception):
    """Preparation failed; ``failure`` says why (kind, stage install, what to preinstall)."""

    def __init__(self, failure: FailureEvent) -> None:
        super().__init__(failure.message)
        self.failure = failure


class PreparedRuntime(BaseModel):
    """What the harness needs to launch OpenCode in this sandbox."""

    model_config = ConfigDict(extra="forbid")

    binary: str
    version: str
    target: Target
    python: str
    rg: str | None
    facts: SandboxFacts
    mounted: bool
    # OpenCode's first-run state (opencode_tui_core.runtime.first_run): host files staged into its data directory.
    first_run_files: list[str] = []


def _fail(kind: str, message: str, **data: Any) -> RuntimeNotReady:
    return RuntimeNotReady(
        FailureEvent(
            kind=kind,
            stage=FailureStage.INSTALL,
            operation="prepare runtime",
            message=message,
            details=GenericDetails(data=data) if data else None,
        )
    )


def install_failure(exc: InstallError) -> RuntimeNotReady:
    """The installer's error as a failure that keeps its cause chain (the transport error behind a
    registry that stopped answering) and the registry's HTTP status (which the policy reads)."""
    data = {"package": exc.package, "version": exc.version, "url": exc.url, "http_status": exc.http_status}
    return RuntimeNotReady(
        FailureEvent.from_exception(
            exc,
            kind=exc.kind,
            stage=FailureStage.INSTALL,
            operation="prepare runtime",
            message=str(exc),
            http_status=exc.http_status if exc.http_status and 100 <= exc.http_status <= 599 else None,
            details=GenericDetails(data={k: v for k, v in data.items() if v is not None}),
        )
    )


def _kept(exc: BaseException, operation: str) -> RuntimeNotReady:
    """A provider failure during preparation (sandbox lost, OOM, I/O timeout) keeps its own kind,
    cause and evidence; the episode stamps the stage. Only an untyped error gets a generic kind."""
    return RuntimeNotReady(
        failure_of(exc, kind="command_failed", stage=FailureStage.INSTALL, operation=operation)
    )


def _unobserved(r: ExecResult, operation: str, timeout: float) -> RuntimeNotReady:
    """An exec whose exit nobody saw: the outcome stays unknown, never "a program is missing"."""
    why = f"its hard cap of {timeout:g}s expired" if r.deadline_expired else "its exit was not observed"
    return RuntimeNotReady(
        FailureEvent(
            kind="command_hard_cap_expired" if r.deadline_expired else "command_status_lost",
            stage=FailureStage.INSTALL,
            operation=operation,
            message=f"{operation}: {why}" + (f" ({r.error})" if r.error else ""),
            details=CommandDetails(execution_id=r.execution_id, exit_code=None),
        )
    )


def _throttled(emit: Callable[[Event], Any], package: str) -> Callable[[int, int | None], None]:
    last = [0.0, -1]

    def on_progress(done: int, total: int | None) -> None:
        now = time.monotonic()
        pct = int(done * 100 / total) if total else -1
        if done == total or now - last[0] >= 0.2 or (pct != last[1] and pct % 10 == 0):
            last[0], last[1] = now, pct
            emit(InstallProgress(package=package, bytes_done=done, bytes_total=total))

    return on_progress


PROBE_TIMEOUT_S = 60.0


# After the probe's end marker: the mounted cache's executable binaries, one per line (saves the
# separate ``test -x`` exec when the cache entry was already there).
_EXECUTABLE = "opencode_tui_executable="


async def probe(sandbox: Sandbox) -> SandboxFacts:
    return (await _probe(sandbox, None))[0]


async def _probe(sandbox: Sandbox, list_dir: str | None) -> tuple[SandboxFacts, set[str]]:
    """The probe; with ``list_dir``, also which ``<list_dir>/*/opencode`` the sandbox can execute."""
    operation = "probe the sandbox"
    script = probe_script()
    if list_dir is not None:
        script += (
            f"for f in {shlex.quote(list_dir)}/*/opencode; do "
            f'[ -f "$f" ] && [ -x "$f" ] && printf "{_EXECUTABLE}%s\\n" "$f"; done; true\n'
        )
    try:
        r = await sandbox.exec(["/bin/sh", "-c", script], timeout=PROBE_TIMEOUT_S)
    except SandboxError as exc:
        raise _kept(exc, operation) from exc
    if not r.observed:
        raise _unobserved(r, operation, PROBE_TIMEOUT_S)
    stderr = r.stderr.decode(errors="replace")[:500]
    if r.exit_code in _NOT_FOUND_EXITS and r.signal is None:
        raise _fail(
            "install_prerequisite_missing",
            f"cannot run /bin/sh in the sandbox ({describe_exit(r.exit_code, r.signal)}): {stderr}; "
            "preinstall a POSIX shell (sh) in the image",
        )
    if not r.ok:
        # Killed, OOM, a crash: what happened to the sandbox, not a missing program.
        raise RuntimeNotReady(
            FailureEvent(
                kind="command_failed",
                stage=FailureStage.INSTALL,
                operation=operation,
                message=f"the sandbox probe failed ({describe_exit(r.exit_code, r.signal)}): {stderr}",
                details=CommandDetails(execution_id=r.execution_id, exit_code=r.exit_code),
            )
        )
    text = r.stdout.decode("utf-8", "replace")
    try:
        facts = parse_probe(text)
    except ProbeError as exc:
        raise _fail("install_failed", f"could not read the sandbox probe: {exc}") from exc
    found = {line[len(_EXECUTABLE) :] for line in text.splitlines() if line.startswith(_EXECUTABLE)}
    return facts, found


async def _ensure_python(sandbox: Sandbox, facts: SandboxFacts, emit: Callable[[Event], Any]) -> str:
    version = facts.python3_version_info
    if facts.python3 and version and version[:2] >= MIN_PYTHON:
        return facts.python3
    found = f"python3 {facts.python3_version}" if facts.python3 else "no python3"
    # Only a root image with a package manager may try; it will usually fail offline (model-only).
    if facts.uid == 0 and (facts.apt_get or facts.apk):
        cmd = "apt-get install -y -q python3" if facts.apt_get else "apk add --no-cache python3"
        emit(Warning_(code="python3_install_attempt", message=f"{found} in the sandbox; trying `{cmd}`"))
        r = await sandbox.exec(["/bin/sh", "-c", cmd], timeout=120)
        if r.ok:
            again = await probe(sandbox)
            v = again.python3_version_info
            if again.python3 and v and v[:2] >= MIN_PYTHON:
                return again.python3
    raise _fail(
        "install_prerequisite_missing",
        f"the sandbox has {found}; the process supervisor needs python3 >= 3.8. "
        "Preinstall python3 in the sandbox image (e.g. `apt-get install python3` in its build).",
        python3=facts.python3,
        python3_version=facts.python3_version,
        uid=facts.uid,
    )


async def prepare_runtime(
    sandbox: Sandbox,
    installer: Installer,
    layout: Any,
    *,
    emit: Callable[[Event], Any],
    version: str,
    budget_s: float | None = None,
) -> PreparedRuntime:
    """Probe → python3 check → install on the controller → binary in the sandbox → version check →
    OpenCode's first-run state → rg. ``budget_s``: the install phase's budget (bounds the best-effort
    steps)."""
    started = time.monotonic()
    version_dir = f"{RUNTIME_CACHE_MOUNT}/{installer.config.version}"
    facts, executable = await _probe(sandbox, version_dir)
    if not facts.has_shell:
        raise _fail("install_prerequisite_missing", "the sandbox has no POSIX shell; preinstall sh (or bash)")
    python = await _ensure_python(sandbox, facts, emit)
    try:
        from opencode_tui_core.runtime.targets import select_target

        target = select_target(facts)
    except UnsupportedTargetError as exc:
        raise _fail("install_failed", str(exc)) from exc
    cached = await asyncio.to_thread(installer.cached, target)  # hashes the binary once per process
    if installer.corrupt:
        # [corrupt cache] (issue 19) never executed: said here, replaced by the install below
        emit(Warning_(code="opencode_cache_corrupt", message=installer.corrupt))
    if cached is not None:
        emit(
            InstallProgress(
                package=target.package_name, bytes_done=cached.size, bytes_total=cached.size, cached=True
            )
        )
        installed = cached
    else:
        try:
            installed = await installer.ensure(target, on_progress=_throttled(emit, target.package_name))
        except InstallError as exc:
            raise install_failure(exc) from exc

    # Prefer the read-only bind of the cache; upload where the provider could not mount it.
    await asyncio.to_thread(installer.share_for_mount, target)
    rel = Path(installed.path).relative_to(installer.config.cache_dir)
    mounted_path = f"{RUNTIME_CACHE_MOUNT}/{rel.as_posix()}"
    # Seen executable by the probe (a cache hit), or checked now (the entry is new).
    if (
        mounted_path in executable
        or (await sandbox.exec(["/bin/sh", "-c", f"test -x {shlex.quote(mounted_path)}"], timeout=30)).ok
    ):
        binary, mounted = mounted_path, True
    else:
        binary, mounted = f"{layout.bin_dir}/opencode", False
        try:
            await sandbox.exec(["/bin/sh", "-c", f"mkdir -p {shlex.quote(layout.bin_dir)}"], timeout=30)
            data = await asyncio.to_thread(Path(installed.path).read_bytes)
            await sandbox.upload_file(binary, data, 0o755)
        except SandboxError as exc:
            raise _kept(exc, "upload the OpenCode binary into the sandbox") from exc

    key = _verified_key(installed.path, installed.sha256, target, facts) if mounted else None
    if key is None or not await asyncio.to_thread(_is_verified, installed.path, key):
        r = await sandbox.exec([binary, "--version"], timeout=60, env={"HOME": "/tmp"})
        if not r.observed:
            raise _unobserved(r, "check the OpenCode version", 60)
        out = r.stdout.decode("utf-8", "replace").strip()
        if not r.ok or not check_version_output(out, version):
            raise _fail(
                "install_failed",
                f"OpenCode in the sandbox reports {out or 'nothing'} ({describe_exit(r.exit_code, r.signal)}), expected {version}: "
                f"{r.stderr.decode(errors='replace')[:300]}",
                binary=binary,
            )
        if key is not None:
            await asyncio.to_thread(_record_verified, installed.path, key)

    from opencode_tui_core.runtime import first_run
    from opencode_tui_core.runtime.opencode import OPENCODE_ENV

    state = await first_run.ensure(
        sandbox,
        python=python,
        binary=binary,
        installed=installed,
        env=OPENCODE_ENV,
        emit=emit,
        budget_s=None if budget_s is None else budget_s - (time.monotonic() - started),
    )
    rg = facts.rg
    if rg is None:
        rg = await _provision_ripgrep(sandbox, layout, target, emit, installer.config.cache_dir)
    return PreparedRuntime(
        binary=binary,
        version=version,
        target=target,
        python=python,
        rg=rg,
        facts=facts,
        mounted=mounted,
        first_run_files=state,
    )


def _verified_key(path: Path, sha256: str, target: Target, facts: SandboxFacts) -> str | None:
    """What makes ``--version`` in one sandbox stand for another: the same binary *file* (its digest
    from the integrity-checked install plus inode, size and mtime, so a rewritten or replaced file is
    new) bind-mounted read-only, and a sandbox whose loader, C library and CPU facts are identical. A
    memory limit too small to start OpenCode is not covered: the agent phase reports that itself."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = {
        "sha256": sha256,
        "file": [st.st_ino, st.st_size, st.st_mtime_ns],
        "target": target.package_name,
        "facts": facts.model_dump(
            include={
                "os",
                "machine",
                "musl_loader",
                "glibc_loader",
                "ldd_version",
                "gnu_libc_version",
                "avx2",
            }
        ),
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _read_verified(binary: Path) -> list[str]:
    try:
        data = json.loads((Path(binary).parent / VERIFIED_NAME).read_text())
    except (OSError, ValueError):
        return []
    return [k for k in data if isinstance(k, str)] if isinstance(data, list) else []


def _is_verified(binary: Path, key: str) -> bool:
    return key in _read_verified(binary)


def _record_verified(binary: Path, key: str) -> None:
    """Best effort, atomic (write + rename): two episodes recording at once lose at most one key,
    which only costs a later ``--version``."""
    keys = [*[k for k in _read_verified(binary) if k != key][-63:], key]
    path = Path(binary).parent / VERIFIED_NAME
    tmp = path.with_name(f".{VERIFIED_NAME}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(keys))
        os.replace(tmp, path)
    with contextlib.suppress(OSError):
        tmp.unlink()


async def _provision_ripgrep(
    sandbox: Sandbox, layout: Any, target: Target, emit: Callable[[Event], Any], cache_dir: Path
) -> str | None:
    """Best effort: a static rg from the controller's cache; otherwise a visible warning."""
    try:
        from opencode_tui_core.runtime.ripgrep import fetch_static_ripgrep

        local = await fetch_static_ripgrep(target, cache_dir)
        dest = f"{layout.bin_dir}/rg"
        q = shlex.quote
        # The cache is bind-mounted read-only: a link to its rg costs one exec; an upload (6 MB, and
        # the daemon's copy on docker) only where the mount is absent or unreadable to the user.
        if local.is_relative_to(cache_dir):
            mounted = f"{RUNTIME_CACHE_MOUNT}/{local.relative_to(cache_dir).as_posix()}"
            link = f"mkdir -p {q(layout.bin_dir)} && ln -sf {q(mounted)} {q(dest)} && {q(dest)} --version"
            if (await sandbox.exec(["/bin/sh", "-c", link], timeout=30)).ok:
                said = f"no rg in the image; provisioned {dest} (a link to the mounted cache's {mounted})"
                emit(Warning_(code="ripgrep_provisioned", message=said))
                return dest
        await sandbox.exec(["/bin/sh", "-c", f"rm -f {q(dest)}; mkdir -p {q(layout.bin_dir)}"], timeout=30)
        await sandbox.upload_file(dest, await asyncio.to_thread(local.read_bytes), 0o755)
        r = await sandbox.exec([dest, "--version"], timeout=30)
        if r.ok:
            emit(Warning_(code="ripgrep_provisioned", message=f"no rg in the image; provisioned {dest}"))
            return dest
        reason = f"the provisioned rg does not run ({describe_exit(r.exit_code, r.signal)})"
    except Exception as exc:  # best effort by design
        reason = str(exc) or type(exc).__name__
    emit(
        Warning_(
            code="ripgrep_missing",
            message=f"no ripgrep in the sandbox and provisioning failed ({reason}); OpenCode will try to "
            "fetch its own on demand (search tools may fail offline). Preinstall ripgrep in the image.",
        )
    )
    return None
