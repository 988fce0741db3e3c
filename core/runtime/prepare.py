"""Sandbox-side runtime preparation: probe, pick the target, install (controller side), place the
binary inside the sandbox, check its version, and make sure the prerequisites are there.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from core.events import Event, InstallProgress, Warning_
from core.failures import CommandDetails, FailureEvent, FailureStage, GenericDetails
from core.runtime.installer import Installer, InstallError, check_version_output
from core.runtime.targets import (
    ProbeError,
    SandboxFacts,
    Target,
    UnsupportedTargetError,
    parse_probe,
    probe_script,
)
from core.sandbox.base import ExecResult, Sandbox, SandboxError, describe_exit

# What a shell reports when the program it was asked to run is missing or not executable: the only
# exits that say "preinstall something". Any other failure of a probe is the sandbox's or the
# provider's, and keeps its own kind.
_NOT_FOUND_EXITS = (126, 127)

# Where providers that can bind-mount expose the controller's OpenCode cache (read-only).
RUNTIME_CACHE_MOUNT = "/opt/opencode-tui/cache"
MIN_PYTHON = (3, 8)


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


def _kept(exc: BaseException, operation: str) -> RuntimeNotReady:
    """A provider failure during preparation (sandbox lost, OOM, I/O timeout) keeps its own kind,
    cause and evidence; the episode stamps the stage. Only an untyped error gets a generic kind."""
    failure = getattr(exc, "failure", None)
    if not isinstance(failure, FailureEvent):
        failure = FailureEvent.from_exception(
            exc, kind="command_failed", stage=FailureStage.INSTALL, operation=operation
        )
    return RuntimeNotReady(failure)


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


async def probe(sandbox: Sandbox) -> SandboxFacts:
    operation = "probe the sandbox"
    try:
        r = await sandbox.exec(["/bin/sh", "-c", probe_script()], timeout=PROBE_TIMEOUT_S)
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
    try:
        return parse_probe(r.stdout.decode("utf-8", "replace"))
    except ProbeError as exc:
        raise _fail("install_failed", f"could not read the sandbox probe: {exc}") from exc


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
) -> PreparedRuntime:
    """Probe → python3 check → install on the controller → binary in the sandbox → version check → rg."""
    facts = await probe(sandbox)
    if not facts.has_shell:
        raise _fail("install_prerequisite_missing", "the sandbox has no POSIX shell; preinstall sh (or bash)")
    python = await _ensure_python(sandbox, facts, emit)
    try:
        from core.runtime.targets import select_target

        target = select_target(facts)
    except UnsupportedTargetError as exc:
        raise _fail("install_failed", str(exc)) from exc
    cached = await asyncio.to_thread(installer.cached, target)  # hashes the binary once per process
    if getattr(installer, "corrupt", None):
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
            raise _fail(
                exc.kind, str(exc), package=exc.package, url=exc.url, http_status=exc.http_status
            ) from exc

    # Prefer the read-only bind of the cache; upload where the provider could not mount it.
    await asyncio.to_thread(installer.share_for_mount, target)
    rel = Path(installed.path).relative_to(installer.config.cache_dir)
    mounted_path = f"{RUNTIME_CACHE_MOUNT}/{rel.as_posix()}"
    check = await sandbox.exec(["/bin/sh", "-c", f"test -x {shlex.quote(mounted_path)}"], timeout=30)
    if check.ok:
        binary, mounted = mounted_path, True
    else:
        binary, mounted = f"{layout.bin_dir}/opencode", False
        try:
            await sandbox.exec(["/bin/sh", "-c", f"mkdir -p {shlex.quote(layout.bin_dir)}"], timeout=30)
            data = await asyncio.to_thread(Path(installed.path).read_bytes)
            await sandbox.upload_file(binary, data, 0o755)
        except SandboxError as exc:
            raise _kept(exc, "upload the OpenCode binary into the sandbox") from exc

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

    rg = facts.rg
    if rg is None:
        rg = await _provision_ripgrep(sandbox, layout, target, emit, installer.config.cache_dir)
    return PreparedRuntime(
        binary=binary, version=version, target=target, python=python, rg=rg, facts=facts, mounted=mounted
    )


async def _provision_ripgrep(
    sandbox: Sandbox, layout: Any, target: Target, emit: Callable[[Event], Any], cache_dir: Path
) -> str | None:
    """Best effort: a static rg from the controller's cache; otherwise a visible warning."""
    try:
        from core.runtime.ripgrep import fetch_static_ripgrep

        local = await fetch_static_ripgrep(target, cache_dir)
        dest = f"{layout.bin_dir}/rg"
        await sandbox.exec(["/bin/sh", "-c", f"mkdir -p {shlex.quote(layout.bin_dir)}"], timeout=30)
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
