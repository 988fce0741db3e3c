"""What the Docker engine and the host say about one container: its state, its engine events, its
memory cgroup's OOM counter (the evidence ``inspect`` returns), and the live fault watch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import docker
import docker.errors

from opencode_tui_core.events import FaultKind, SandboxFault
from opencode_tui_core.failures import (
    Evidence,
)
from opencode_tui_core.sandbox.cgroup import read_memory
from opencode_tui_core.sandbox.docker.cgroup import (
    CGROUP_ROOT,
    CGROUP_V1_ROOT,
    _cgroup_present,
    find_memory_cgroup,
    find_pids_cgroup,
)
from opencode_tui_core.sandbox.docker.common import (
    CALL_DEADLINE_S,
    EVENTS_DEADLINE_S,
    EVENTS_KEPT,
    EVENTS_POLL_S,
    INSPECT_DEADLINE_S,
    _blocking,
    _ts,
)
from opencode_tui_core.sandbox.docker.engine_socket import json_objects
from opencode_tui_core.sandbox.docker.oom_rules import SOURCE_EVENTS, SOURCE_STATE
from opencode_tui_core.sandbox.faults import FaultWatcher
from opencode_tui_core.sandbox.oom import SOURCE_CGROUP
from opencode_tui_core.sandbox.pids import pids_evidence, read_pids_cgroup


class ContainerEvidence:
    """``inspect``, ``watch_faults`` and the OOM baseline of ``DockerSandbox``."""

    if TYPE_CHECKING:  # the state and the other parts live on the sandbox class this is mixed into
        _oom_baseline: int | None
        _oom_killed_at_connect: bool | None

        def __getattr__(self, name: str) -> Any: ...

    async def _record_baseline(self, *, attrs: dict[str, Any] | None = None) -> None:
        """Remember the cgroup OOM counter (and, borrowed, OOMKilled) as found at create/connect."""
        if attrs is None:
            attrs = await self._inspect_attrs(CALL_DEADLINE_S)
        state = attrs.get("State") or {}
        found = await _blocking(find_memory_cgroup, self.sandbox_id, state.get("Pid"), within=5.0)
        self._cgroup = found
        # The process limit's refused-fork counter as found now (0 for a container we created).
        pids_cg = await _blocking(find_pids_cgroup, self.sandbox_id, state.get("Pid"), within=5.0)
        self._pids_cgroup = pids_cg
        if pids_cg is not None:
            self._pids_baseline = (await _blocking(read_pids_cgroup, pids_cg, within=5.0)).get("max_events")
        if self.owned:
            # We created it: its cgroup is fresh, so every OOM kill it ever counts is ours.
            self._oom_baseline = 0
            return
        self._oom_killed_at_connect = bool(state.get("OOMKilled"))
        if found is not None:
            with contextlib.suppress(OSError, TimeoutError):
                data = await _blocking(read_memory, *found, within=5.0)
                if isinstance(data.get("oom_kill"), int):
                    self._oom_baseline = data["oom_kill"]

    async def inspect(self) -> list[Evidence]:
        self._ensure_open("inspect")
        _attrs, evidence = await self._gather()
        return evidence

    async def _gather(self) -> tuple[dict[str, Any] | None, list[Evidence]]:
        """Engine state, this container's events and its cgroup, all inside INSPECT_DEADLINE_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + INSPECT_DEADLINE_S
        cid = self.sandbox_id
        evidence: list[Evidence] = []
        attrs: dict[str, Any] | None = None
        try:
            attrs = await self._inspect_attrs(deadline - loop.time())
        except docker.errors.NotFound:
            evidence.append(Evidence(source=SOURCE_STATE, scope=cid, data={"exists": False}))
        except Exception as exc:
            evidence.append(
                Evidence(source=SOURCE_STATE, scope=cid, data={"error": f"{type(exc).__name__}: {exc}"})
            )
        if attrs is not None:
            state = attrs.get("State") or {}
            data = {
                "exists": True,
                "Status": state.get("Status"),
                "Running": state.get("Running"),
                "ExitCode": state.get("ExitCode"),
                "OOMKilled": state.get("OOMKilled"),
                "Error": state.get("Error") or None,
                "StartedAt": state.get("StartedAt"),
                "FinishedAt": state.get("FinishedAt"),
                "MemoryLimit": (attrs.get("HostConfig") or {}).get("Memory") or None,
            }
            if self._oom_killed_at_connect is not None:
                data["OOMKilledAtConnect"] = self._oom_killed_at_connect
            evidence.append(Evidence(source=SOURCE_STATE, scope=cid, data=data))
        evidence.extend(await self._events_evidence(min(EVENTS_DEADLINE_S, max(deadline - loop.time(), 0.5))))
        evidence.append(await self._cgroup_evidence(attrs, max(deadline - loop.time(), 0.5)))
        if self._pids_cgroup is not None:
            with contextlib.suppress(OSError, TimeoutError):
                cg, base = self._pids_cgroup, self._pids_baseline
                evidence.append(
                    await _blocking(pids_evidence, cg, base, cid, within=max(deadline - loop.time(), 0.5))
                )
        return attrs, evidence

    async def _container_events(
        self, since: float, until: float, filters: dict[str, Any], within: float
    ) -> list[dict[str, Any]]:
        """The engine's events between ``since`` and ``until`` (epoch seconds) that match ``filters``;
        raises as the engine does."""
        if self._engine is not None:
            lists = {k: v if isinstance(v, list) else [v] for k, v in filters.items()}
            query = urlencode({"since": _ts(since), "until": _ts(until), "filters": json.dumps(lists)})
            body = await asyncio.wait_for(
                self._engine.request("GET", f"/events?{query}", timeout=within), max(within, 0.001)
            )
            return json_objects(body)
        holder: dict[str, Any] = {}

        def query_sdk() -> list[dict[str, Any]]:
            stream = self._api.events(since=_ts(since), until=_ts(until), filters=filters, decode=True)
            holder["stream"] = stream
            try:
                return list(stream)
            finally:
                with contextlib.suppress(Exception):
                    stream.close()

        try:
            return await _blocking(query_sdk, within=within)
        except BaseException:
            if "stream" in holder:
                with contextlib.suppress(Exception):
                    holder["stream"].close()
            raise

    async def _events_evidence(self, budget_s: float) -> list[Evidence]:
        cid = self.sandbox_id
        since, until = self._since, time.time()
        window = {"since": _ts(since), "until": _ts(until)}
        try:
            filters = {"container": cid, "type": "container", "event": ["oom", "die", "kill"]}
            events = await self._container_events(since, until, filters, budget_s)
        except Exception as exc:
            return [
                Evidence(
                    source=SOURCE_EVENTS, scope=cid, data={**window, "error": f"{type(exc).__name__}: {exc}"}
                )
            ]
        ours = [ev for ev in events if ((ev.get("Actor") or {}).get("ID") or ev.get("id")) == cid]
        # Capped (a restart loop makes thousands): every oom report first, then the latest others.
        ooms = [ev for ev in ours if (ev.get("Action") or ev.get("status")) == "oom"][-EVENTS_KEPT:]
        others = [ev for ev in ours if (ev.get("Action") or ev.get("status")) != "oom"]
        kept = ooms + others[len(others) - max(EVENTS_KEPT - len(ooms), 0) :] if ours else []
        kept.sort(key=lambda ev: ev.get("timeNano") or 0)
        summary = {**window, "matched": len(events)}
        if len(kept) < len(ours):
            summary["omitted"] = len(ours) - len(kept)
        out = [Evidence(source=SOURCE_EVENTS, scope=cid, data=summary)]
        for ev in kept:
            actor = ev.get("Actor") or {}
            container_id = actor.get("ID") or ev.get("id")
            nano = ev.get("timeNano")
            observed = (
                datetime.fromtimestamp(nano / 1e9, UTC)
                if isinstance(nano, int)
                else datetime.fromtimestamp(ev.get("time", until), UTC)
            )
            attributes = actor.get("Attributes") or {}
            out.append(
                Evidence(
                    source=SOURCE_EVENTS,
                    scope=cid,
                    observed_at=observed,
                    data={
                        "action": ev.get("Action") or ev.get("status"),
                        "container_id": container_id,
                        "time_nano": nano,
                        **{k: attributes[k] for k in ("exitCode", "signal") if k in attributes},
                    },
                )
            )
        return out

    async def _cgroup_evidence(self, attrs: dict[str, Any] | None, budget_s: float) -> Evidence:
        cid = self.sandbox_id
        try:
            found = self._cgroup
            if found is None or not _cgroup_present(found):
                pid = ((attrs or {}).get("State") or {}).get("Pid")
                found = await _blocking(find_memory_cgroup, cid, pid, within=budget_s)
                if found is not None:
                    self._cgroup = found
            if found is None:
                return Evidence(
                    source=SOURCE_CGROUP,
                    scope=cid,
                    data={
                        "available": False,
                        "reason": "memory cgroup not found (container stopped, or not visible)",
                    },
                )
            data = await _blocking(read_memory, *found, within=budget_s)
        except (OSError, TimeoutError) as exc:
            return Evidence(
                source=SOURCE_CGROUP,
                scope=cid,
                data={"available": False, "reason": f"{type(exc).__name__}: {exc}"},
            )
        return Evidence(
            source=SOURCE_CGROUP,
            scope=cid,
            data={"available": True, **data, "oom_kill_baseline": self._oom_baseline},
        )

    async def watch_faults(self, stop: asyncio.Event) -> AsyncIterator[SandboxFault]:
        """The container's memory cgroup and the kernel's record of a kill (``FaultWatcher``) when the
        host sees them (a local engine); else Docker's own ``oom`` events, polled every second."""
        if self._closed:
            return
        if self._cgroup is not None:
            path, version = self._cgroup
            root = CGROUP_V1_ROOT if version == 1 else CGROUP_ROOT
            memcg = "/" + str(path.relative_to(root)) if path.is_relative_to(root) else None
            watcher = FaultWatcher(scope=self.sandbox_id, memory=self._cgroup, memcg=memcg)
            watcher.oom_baseline = self._oom_baseline
            async for fault in watcher.watch(stop):
                yield fault
            return
        since = time.time()
        while True:
            stopping = stop.is_set()
            until = time.time()
            for ev in await self._oom_events(since, until):
                yield ev
            since = until
            if stopping:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), EVENTS_POLL_S)

    async def _oom_events(self, since: float, until: float) -> list[SandboxFault]:
        cid = self.sandbox_id
        try:
            events = await self._container_events(
                since, until, {"container": cid, "event": "oom"}, EVENTS_DEADLINE_S
            )
        except Exception:
            return []  # the close-time inspect reads the same events again, and says what failed
        out = []
        for ev in events:
            if ((ev.get("Actor") or {}).get("ID") or ev.get("id")) != cid:
                continue
            nano = ev.get("timeNano")
            at = datetime.fromtimestamp(nano / 1e9, UTC) if isinstance(nano, int) else datetime.now(UTC)
            out.append(
                SandboxFault(
                    ts=at,
                    kind=FaultKind.OOM_KILL,
                    source=SOURCE_EVENTS,
                    message="the kernel OOM-killed a process of the container (Docker's oom event; "
                    "it does not say which)",
                    evidence=[
                        Evidence(
                            source=SOURCE_EVENTS,
                            scope=cid,
                            observed_at=at,
                            data={"action": "oom", "container_id": cid, "time_nano": nano},
                        )
                    ],
                )
            )
        return out
