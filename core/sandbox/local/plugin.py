"""The local (bubblewrap) provider as a plug-in (entry point ``local``): settings, capabilities, checks."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from pydantic import BaseModel

from opencode_tui_core.provider_registry import Capabilities, Check, ProviderPlugin
from opencode_tui_core.sandbox.local.settings import LocalSettings
from opencode_tui_core.sandbox.oom import SOURCE_CGROUP

if TYPE_CHECKING:
    from opencode_tui_core.config import AgentConfig
    from opencode_tui_core.sandbox.local.provider import LocalProvider


class LocalPlugin(ProviderPlugin):
    name = "local"
    summary = "bubblewrap on this host: no daemon, the host's own system (the default)"
    settings_model = LocalSettings
    capabilities = Capabilities(
        model_socket=True,
        memory_limit=True,  # through a cgroup v1 memory controller, as root; status() says otherwise
        pids_limit=True,  # a pids cgroup, where the host has one; status() says otherwise
        disk_limit=True,  # a loop-mounted sized filesystem (root, mkfs.ext4); status() says otherwise
        pty=True,
        oom_evidence=frozenset({SOURCE_CGROUP}),
        borrowed=True,
        users=True,
        host_mounts=True,
        listing=True,
        sweep_by_default=True,
        warm=True,
    )

    def provider(self, settings: BaseModel) -> LocalProvider:
        from opencode_tui_core.sandbox.local.provider import LocalProvider

        s = self.settings(settings)
        assert isinstance(s, LocalSettings)
        return LocalProvider(
            base_dir=s.base_dir,
            bwrap=s.bwrap,
            cgroup_root=None if s.cgroups else False,
            etc_allow=s.etc_allow,
        )

    async def preflight(self, config: AgentConfig) -> list[Check]:
        """bwrap found and usable, then one real sandbox created, used and released."""
        from opencode_tui_core.config import DEFAULT_PIDS_LIMIT
        from opencode_tui_core.sandbox.base import SandboxSpec
        from opencode_tui_core.sandbox.local.bwrap import resolve_bwrap

        settings = config.sandbox.settings_for(self.name)
        assert isinstance(settings, LocalSettings)
        out: list[Check] = []
        try:
            b = resolve_bwrap(settings.bwrap)
            out.append(Check(name="bwrap", status="ok", detail=f"{b.path} ({b.source}, {b.version})"))
        except Exception as exc:
            return [Check(name="bwrap", status="fail", detail=str(exc))]
        provider = self.provider(settings)
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
            out.append(
                Check(
                    name="local sandbox",
                    status="ok" if r.ok else "fail",
                    detail=f"create+exec+release in {ms:.0f} ms",
                )
            )
            enforced = status.memory_limit_enforced
            out.append(
                Check(
                    name="local memory limit",
                    status="ok" if enforced else "warn",
                    detail="enforced through a cgroup"
                    if enforced
                    else "; ".join(status.notes) or "not enforced",
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
                out.append(
                    Check(
                        name=f"local {what} limit", status="ok" if ok else "warn", detail=how if ok else why
                    )
                )
        except Exception as exc:
            out.append(Check(name="local sandbox", status="fail", detail=str(exc)))
        return out


PLUGIN = LocalPlugin()
