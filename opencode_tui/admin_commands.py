"""``opencode-tui doctor``: environment checks (``sweep`` lives in keep_commands)."""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Literal

from core.config import DEFAULT_PIDS_LIMIT, AgentConfig
from core.exit_codes import ExitCode

Status = Literal["ok", "warn", "fail"]


@dataclass
class Check:
    name: str
    status: Status
    detail: str


async def _check_local() -> list[Check]:
    from core.sandbox.base import SandboxSpec
    from core.sandbox.local.provider import LocalProvider, resolve_bwrap

    out: list[Check] = []
    try:
        b = resolve_bwrap()
        out.append(Check("bwrap", "ok", f"{b.path} ({b.source}, {b.version})"))
    except Exception as exc:
        return [Check("bwrap", "fail", str(exc))]
    provider = LocalProvider()
    started = time.monotonic()
    try:
        sb = await provider.create(
            SandboxSpec(
                run_id=f"doctor-{uuid.uuid4().hex[:6]}",
                memory_bytes=64 << 20,
                pids_limit=DEFAULT_PIDS_LIMIT,
                disk_bytes=16 << 20,
            )
        )
        try:
            r = await sb.exec(["/bin/sh", "-c", "echo ok"], timeout=30)
            status = await sb.status()
        finally:
            await sb.release()
        ms = (time.monotonic() - started) * 1000
        out.append(Check("local sandbox", "ok" if r.ok else "fail", f"create+exec+release in {ms:.0f} ms"))
        enforced = status.memory_limit_enforced
        out.append(
            Check(
                "local memory limit",
                "ok" if enforced else "warn",
                "enforced through a cgroup" if enforced else "; ".join(status.notes) or "not enforced",
            )
        )
        for what, ok, how, word in (
            ("process", status.pids_limit_enforced, "enforced through a pids cgroup", "process limit"),
            (
                "disk",
                status.disk_limit_enforced,
                "enforced by a loop-mounted ext4 of that size",
                "disk limit",
            ),
        ):
            why = "; ".join(n for n in status.notes if word in n) or "not enforced"
            out.append(Check(f"local {what} limit", "ok" if ok else "warn", how if ok else why))
    except Exception as exc:
        out.append(Check("local sandbox", "fail", str(exc)))
    return out


def _check_docker(config: AgentConfig) -> list[Check]:
    from core.config import DEFAULT_IMAGE

    try:
        import docker

        client = docker.from_env(timeout=10)
        version = client.version().get("Version", "?")
    except Exception as exc:
        return [Check("docker engine", "warn", f"not reachable ({exc}); start it with scripts/start-dockerd")]
    out = [Check("docker engine", "ok", f"version {version}")]
    from core.sandbox.docker.provider import disk_limit_support

    try:
        info = client.info()
        can, why = disk_limit_support(info)
        out.append(
            Check("docker disk limit", "ok" if can else "warn", why if can else f"not enforced: {why}")
        )
        pids = info.get("PidsLimit")
        out.append(
            Check(
                "docker process limit",
                "ok" if pids else "warn",
                "pids_limit supported" if pids else "not enforced: the engine reports no pids cgroup support",
            )
        )
    except Exception as exc:
        out.append(Check("docker limits", "warn", f"docker info failed: {exc}"))
    image = config.sandbox.image or DEFAULT_IMAGE
    try:
        client.images.get(image)
        out.append(Check("docker image", "ok", image))
    except Exception:
        out.append(Check("docker image", "warn", f"{image} missing; build it with scripts/build-images"))
    return out


async def _check_opencode(config: AgentConfig) -> list[Check]:
    from core.runtime.installer import Installer, InstallerConfig
    from core.runtime.targets import parse_probe, probe_script, select_target

    proc = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", probe_script(), stdout=asyncio.subprocess.PIPE
    )
    stdout, _ = await proc.communicate()
    target = select_target(parse_probe(stdout.decode()))
    installer = Installer(
        InstallerConfig(version=config.runtime.opencode_version, registry_url=config.runtime.registry_url)
    )
    cached = installer.cached(target)
    out = [
        Check(
            "opencode pin", "ok", f"{config.runtime.opencode_version} ({target.package_name} for this host)"
        )
    ]
    if cached:
        out.append(
            Check(
                "opencode cache",
                "ok",
                f"{cached.path} ({cached.size / 1e6:.0f} MB, sha256 {cached.sha256[:12]})",
            )
        )
    else:
        out.append(
            Check(
                "opencode cache",
                "warn",
                f"not cached yet under {installer.config.cache_dir}; "
                "the first run downloads it from the npm registry",
            )
        )
    import httpx

    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            r = await client.head(f"{config.runtime.registry_url}/{target.package_name}")
        out.append(Check("npm registry", "ok" if r.status_code < 500 else "warn", f"HTTP {r.status_code}"))
    except httpx.HTTPError as exc:
        out.append(Check("npm registry", "warn" if cached else "fail", f"unreachable: {exc}"))
    return out


def cmd_doctor(args: argparse.Namespace) -> int:
    config = AgentConfig()
    checks = [Check("python", "ok", platform.python_version())]

    async def gather() -> None:
        checks.extend(await _check_local())
        checks.extend(await asyncio.to_thread(_check_docker, config))
        checks.extend(await _check_opencode(config))

    asyncio.run(gather())
    if args.json:
        for c in checks:
            print(json.dumps(asdict(c)))
    else:
        marks = {"ok": "✓", "warn": "!", "fail": "✗"}
        for c in checks:
            print(f"{marks[c.status]} {c.name:<20} {c.detail}")
    return ExitCode.INFRA if any(c.status == "fail" for c in checks) else ExitCode.OK
