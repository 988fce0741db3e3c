"""The environment checks ``opencode-tui doctor`` prints: Python, each provider's own ``preflight()``,
and the pinned OpenCode (its package for this host, the cache, the npm registry)."""

from __future__ import annotations

import asyncio
import platform

from opencode_tui_core import provider_registry as registry
from opencode_tui_core.config import AgentConfig
from opencode_tui_core.provider_registry import Check


async def environment_checks(config: AgentConfig) -> list[Check]:
    """Every check, in the order doctor prints them (a plug-in that fails to load or raises is its own
    failed check)."""
    checks = [Check(name="python", status="ok", detail=platform.python_version())]
    for name in registry.names():
        try:
            checks.extend(await registry.get(name).preflight(config))
        except registry.PluginLoadError as exc:
            checks.append(Check(name=name, status="fail", detail=str(exc)))
        except Exception as exc:  # a plug-in's bug is its own failed check, not doctor's crash
            checks.append(Check(name=name, status="fail", detail=f"preflight raised {exc!r}"))
    checks.extend(await _check_opencode(config))
    return checks


async def _check_opencode(config: AgentConfig) -> list[Check]:
    from opencode_tui_core.runtime.installer import Installer, InstallerConfig
    from opencode_tui_core.runtime.targets import parse_probe, probe_script, select_target

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
            name="opencode pin",
            status="ok",
            detail=f"{config.runtime.opencode_version} ({target.package_name} for this host)",
        )
    ]
    if cached:
        out.append(
            Check(
                name="opencode cache",
                status="ok",
                detail=f"{cached.path} ({cached.size / 1e6:.0f} MB, sha256 {cached.sha256[:12]})",
            )
        )
    else:
        out.append(
            Check(
                name="opencode cache",
                status="warn",
                detail=f"not cached yet under {installer.config.cache_dir}; "
                "the first run downloads it from the npm registry",
            )
        )
    import httpx

    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            r = await client.head(f"{config.runtime.registry_url}/{target.package_name}")
        out.append(
            Check(
                name="npm registry",
                status="ok" if r.status_code < 500 else "warn",
                detail=f"HTTP {r.status_code}",
            )
        )
    except httpx.HTTPError as exc:
        out.append(
            Check(name="npm registry", status="warn" if cached else "fail", detail=f"unreachable: {exc}")
        )
    return out
