"""The batch's warm pool (issue 31): sandboxes prepared ahead of the episodes that will use them.

While episodes run, the pool prepares the next ones, one at a time (a second one while an attempt
waits for its sandbox): the sandbox created (the same owned spec the seed phase builds, with its
model socket already bound and listening) and OpenCode installed in it (``prepare_runtime``: binary,
version check, first-run state). It then waits for one episode's task files and prompt. Each
prepared sandbox serves exactly one episode and is never reused. One whose configuration (image,
workdir, user, limits, network, OpenCode runtime) matches no task still to run, or that waited past
``batch.warm_max_age_s``, is released unused and counted as discarded. ``close`` (every way a batch
ends, signals included) releases every unused one and confirms it: the release returned and the
engine reports the sandbox dead or gone.

Each carries the label ``opencode-tui.pool`` (the batch id) and a run label of its own (``pool-…``),
its owner's and its creating process's, so ``opencode-tui sweep`` removes one left by a SIGKILL.
Where it can (the serve harness behind the model relay), OpenCode's server is started ahead too and
waits for its task's prompt (core/episode/ahead.py): the episode's first model request then follows
its start by a fraction of a second instead of OpenCode's boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.config import AgentConfig
from opencode_tui_core.episode.ahead import opens_session_ahead
from opencode_tui_core.events import Event, WarmSandbox
from opencode_tui_core.failures.evidence import utcnow
from opencode_tui_core.runtime import access
from opencode_tui_core.sandbox.base import LABEL_BATCH, LABEL_POOL, Sandbox, SandboxProvider
from opencode_tui_core.tasks import Task

if TYPE_CHECKING:
    from opencode_tui_core.episode.ahead import ServerAhead
    from opencode_tui_core.episode.seed import Seeded
    from opencode_tui_core.runtime.installer import Installer
    from opencode_tui_core.runtime.prepare import PreparedRuntime

# How long a release of an unused sandbox, and the engine's confirmation, may take.
RELEASE_S = 60.0
PROBE_S = 10.0
# After a prepared sandbox is handed out, the next preparation waits this long if another is ready:
# booting OpenCode takes a core for a second or more, and on a small machine it slowed the start it
# was meant to make faster (attempt start -> first model request 0.3 s -> 0.5-0.8 s, --jobs 1, 2 cores).
START_GRACE_S = 1.0
# Preparations under way at once, at most (see WarmPool._may_start).
PARALLEL_MAX = 2


class WarmCounts(BaseModel):
    """What the pool did in one batch (the summary line, ``--batch``'s stderr)."""

    model_config = ConfigDict(extra="forbid")

    depth: int = 0
    prepared: int = 0  # preparations that finished (sandbox created, OpenCode installed)
    used: int = 0  # given to an attempt (each to one only)
    discarded: int = 0  # released unused: no task left for its configuration, too old, or the batch ended
    failed: int = 0  # preparations that failed (released; the attempt prepares its own sandbox)
    released_confirmed: int = 0  # unused ones whose release the engine confirmed
    released_unconfirmed: int = 0  # unused ones whose release could not be confirmed (``sweep`` them)

    @property
    def active(self) -> bool:
        """Anything was prepared or tried (a batch with nothing to prepare ahead says nothing)."""
        return bool(self.prepared or self.failed or self.discarded)

    def words(self) -> str:
        unconfirmed = (
            f", {self.released_unconfirmed} release unconfirmed" if self.released_unconfirmed else ""
        )
        failed = f", {self.failed} failed" if self.failed else ""
        return (
            f"warm sandboxes: {self.prepared} prepared, {self.used} used, {self.discarded} discarded"
            f"{failed}{unconfirmed}"
        )


def pool_key(task: Task, config: AgentConfig) -> str | None:
    """What a prepared sandbox must match to serve ``task``; None: the task is never given one (a
    borrowed sandbox, an image the episode builds from a Dockerfile)."""
    sb = config.sandbox
    if sb.mode != "owned" or task.build is not None:
        return None
    requested, _ = access.requested_user(sb.user, task.user)
    data = {
        "image": sb.image or task.image,
        "workdir": task.workdir,
        "user": requested,
        "memory": task.limits.memory_bytes,
        "cpus": task.limits.cpus,
        "pids": task.limits.pids_limit(config.limits),
        "disk": task.limits.disk_bytes(config.limits),
        "sandbox": sb.model_dump(mode="json"),
        "limits": config.limits.model_dump(mode="json"),
        "runtime": config.runtime.model_dump(mode="json"),
        "budgets": config.budgets.model_dump(mode="json"),
        # What a server started ahead was configured and launched with (core/episode/ahead.py).
        "model": config.model.model_dump(mode="json"),
        "run_s": task.limits.run_s,
        "instructions": bool(task.instructions),
        "session_ahead": opens_session_ahead(task),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:24]


@dataclass
class Lease:
    """A prepared sandbox handed to one attempt: it owns the sandbox from now on (releases it as its
    own), serves its model proxy on ``listen`` and replays the preparation's events."""

    sandbox: Sandbox
    runtime: PreparedRuntime
    events: list[Event]
    listen: tuple[socket.socket, str] | None
    event: WarmSandbox
    server: ServerAhead | None = None  # OpenCode's server, started ahead and waiting for the task
    seeded: Seeded | None = None  # who the sandbox user is, decided when the server was started
    seed_events: list[Event] = field(default_factory=list)  # what deciding it said

    def finished(self) -> None:
        """After the release: the socket and its directory (the endpoint removes them too)."""
        _close_listening(self.listen)


@dataclass
class _Entry:
    key: str
    run_id: str
    started: float = field(default_factory=time.monotonic)
    task: asyncio.Task[None] | None = None
    sandbox: Sandbox | None = None
    runtime: PreparedRuntime | None = None
    listen: tuple[socket.socket, str] | None = None
    server: ServerAhead | None = None
    seeded: Seeded | None = None
    seed_events: list[Event] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    prepared_at: datetime | None = None
    ready_at: float | None = None  # monotonic
    claimed: bool = False

    @property
    def ready(self) -> bool:
        return self.ready_at is not None


def _listening_socket() -> tuple[socket.socket, str]:
    """A Unix socket bound and listening in a private directory: bind-mounted into the sandbox now,
    served by the episode's model proxy later (same file, same inode)."""
    tmp = tempfile.mkdtemp(prefix="octui-")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"{tmp}/model.sock")
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sock, tmp


def _close_listening(listen: tuple[socket.socket, str] | None) -> None:
    if listen is not None:
        with contextlib.suppress(OSError):
            listen[0].close()
        shutil.rmtree(listen[1], ignore_errors=True)


class WarmPool:
    """Prepares sandboxes for the tasks still to run, ``depth`` ahead, one at a time (two while an
    attempt waits for one)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        depth: int,
        batch_id: str | None,
        provider: SandboxProvider | None = None,
        installer: Installer | None = None,
    ) -> None:
        self.config = config
        self.depth = depth
        self.batch_id = batch_id
        # Names this pool's sandboxes (run ids, the pool label): unique per process too, so two TUIs
        # warming at once never share a container name, and `sweep` tells their sandboxes apart.
        self.pool_id = batch_id or f"tui-{secrets.token_hex(4)}"
        self._provider = provider
        self._installer = installer
        self.counts = WarmCounts(depth=depth)
        # The tasks not started yet, in order, with their keys.
        self._pending: list[tuple[int, str | None]] = []
        self._entries: list[_Entry] = []
        self._bad: set[str] = set()  # keys whose preparation failed: not tried again
        self._kick = asyncio.Event()
        self._grace_until = 0.0  # no preparation starts before (see START_GRACE_S)
        self._filler: asyncio.Task[None] | None = None
        self._watchers: set[asyncio.Task[None]] = set()  # one per preparation under way (``_watch``)
        self._stopped = False
        self._n = 0
        self._templates: dict[str, Task] = {}

    @property
    def provider(self) -> SandboxProvider:
        if self._provider is None:
            from opencode_tui_core.sandbox.providers import get_provider

            self._provider = get_provider(self.config.sandbox.provider, self.config)
        return self._provider

    @property
    def installer(self) -> Installer:
        if self._installer is None:
            from opencode_tui_core.episode.seed import default_installer

            self._installer = default_installer(self.config)
        return self._installer

    def plan(self, tasks: list[Task], *, starting: int = 0) -> None:
        """The tasks this batch will start, in order; filling starts now. The first ``starting`` of
        them start at once (``--jobs``): preparing theirs ahead would gain nothing, so the pool
        prepares for the ones after them."""
        ahead = tasks[starting:]
        self._pending = [(id(t), pool_key(t, self.config)) for t in ahead]
        for t, (_, k) in zip(ahead, self._pending, strict=True):
            if k is not None:  # a sandbox is made from the first task of its key (they agree on it)
                self._templates.setdefault(k, t)
        if self.depth > 0 and self._filler is None:
            self._filler = asyncio.ensure_future(self._fill())
        self._kick.set()

    def stop(self) -> None:
        """Prepare nothing more (the batch was cancelled); ``close`` releases what is there."""
        self._stopped = True
        self._kick.set()

    async def take(self, task: Task) -> Lease | None:
        """A prepared sandbox for ``task``, or None (the attempt prepares its own). For a task the
        pool planned for, one still being prepared is waited for: it is further along than a fresh
        start."""
        key = pool_key(task, self.config)
        mine = [i for i, p in enumerate(self._pending) if p[0] == id(task)]
        planned = bool(mine)
        if mine:  # one occurrence: a batch may hold the same task object more than once
            del self._pending[mine[0]]
        self._kick.set()
        if key is None or self._stopped:
            return None
        # A task the pool was not preparing for (one that started at once, a retry) takes a ready
        # one only: one still being prepared is a later task's.
        candidates = [e for e in self._entries if e.key == key and not e.claimed and (planned or e.ready)]
        if not candidates:
            return None
        entry = min(candidates, key=lambda e: (not e.ready, e.started))
        entry.claimed = True
        asked = time.monotonic()
        try:
            if entry.task is not None:
                await asyncio.shield(entry.task)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling() == 0:
                return None  # the preparation was cancelled (the pool is closing), not this attempt
            entry.claimed = False  # this attempt was cancelled while it waited: the entry stays the pool's
            raise
        except Exception:
            return None  # its preparation failed (the filler counts and releases it)
        if entry not in self._entries or entry.sandbox is None or entry.runtime is None:
            return None
        if self._too_old(entry):
            entry.claimed = False
            self._kick.set()
            return None  # the filler discards it
        self._entries.remove(entry)
        self.counts.used += 1
        self._grace_until = time.monotonic() + START_GRACE_S
        self._kick.set()
        assert entry.prepared_at is not None and entry.ready_at is not None
        now = time.monotonic()
        return Lease(
            sandbox=entry.sandbox,
            runtime=entry.runtime,
            events=entry.events,
            listen=entry.listen,
            server=entry.server,
            seeded=entry.seeded,
            seed_events=entry.seed_events,
            event=WarmSandbox(
                sandbox_id=entry.sandbox.sandbox_id,
                provider=entry.sandbox.provider,
                prepared_at=entry.prepared_at,
                prepare_s=round(entry.ready_at - entry.started, 3),
                waited_s=round(max(0.0, entry.ready_at - asked), 3),
                age_s=round(max(0.0, now - entry.ready_at), 3),
                pool_run=entry.run_id,
                server_ahead=entry.server is not None,
            ),
        )

    # ---- filling ---------------------------------------------------------------------------------

    def _too_old(self, entry: _Entry) -> bool:
        return (
            entry.ready_at is not None
            and time.monotonic() - entry.ready_at > self.config.batch.warm_max_age_s
        )

    def _unwanted(self) -> list[_Entry]:
        """Unclaimed entries no pending task can use (another configuration), or too old."""
        left = [k for _, k in self._pending if k is not None]
        out = []
        for e in self._entries:
            if e.claimed:
                continue
            if self._too_old(e) or e.key not in left:
                out.append(e)
            else:
                left.remove(e.key)
        return out

    def _next_key(self) -> str | None:
        """The first of the next ``depth`` pending tasks no entry covers yet."""
        free = [e.key for e in self._entries if not e.claimed]
        for _, key in self._pending[: self.depth]:
            if key is None:
                continue
            if key in free:
                free.remove(key)
            elif key not in self._bad and len([e for e in self._entries if not e.claimed]) < self.depth:
                return key
        return None

    @property
    def preparing(self) -> int:
        """Preparations under way now."""
        return len(self._in_flight())

    def _in_flight(self) -> list[_Entry]:
        return [e for e in self._entries if e.task is not None and not e.task.done()]

    def _may_start(self) -> bool:
        """One preparation at a time, or a second one while an attempt waits for a sandbox still
        being prepared: the pool is behind, and the waiting attempt's core is idle meanwhile (at
        ``--jobs 1`` on 2 cores, one at a time left a tenth of the machine idle between episodes)."""
        in_flight = self._in_flight()
        if not in_flight:
            return True
        return len(in_flight) < PARALLEL_MAX and any(e.claimed for e in in_flight)

    async def _fill(self) -> None:
        while not self._stopped:
            for e in self._unwanted():
                await self._discard(e)
            key = self._next_key() if self._may_start() else None
            if key is None:
                self._kick.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), min(30.0, self.config.batch.warm_max_age_s))
                continue
            wait = self._grace_until - time.monotonic()
            if wait > 0 and any(e.ready and not e.claimed for e in self._entries):
                # An attempt is starting on the one just handed out, and the next is ready already:
                # this one can wait. (Behind, it starts at once: a wait costs more than the sharing.)
                await asyncio.sleep(wait)
                continue  # (what is wanted may have changed meanwhile)
            self._n += 1
            entry = _Entry(key=key, run_id=f"pool-{self.pool_id}-{self._n}")
            self._entries.append(entry)
            entry.task = asyncio.ensure_future(self._prepare(entry))
            watcher = asyncio.ensure_future(self._watch(entry))
            self._watchers.add(watcher)
            watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, entry: _Entry) -> None:
        """Until the entry's preparation ends; a failed one is counted, its key not tried again, and
        its sandbox released here (a cancelled one is released by whoever cancelled it)."""
        assert entry.task is not None
        try:
            await asyncio.shield(entry.task)
        except asyncio.CancelledError:
            if not entry.task.cancelled():
                raise  # (this watcher itself: only at the loop's end, with the pool closed)
        except Exception:
            self._bad.add(entry.key)
            self.counts.failed += 1
            if entry in self._entries:
                self._entries.remove(entry)
            await self._release(entry, count=False)
        finally:
            self._kick.set()

    async def _prepare(self, entry: _Entry) -> None:
        from opencode_tui_core.episode.seed import owned_spec
        from opencode_tui_core.runtime.opencode import RuntimeLayout
        from opencode_tui_core.runtime.prepare import prepare_runtime

        config = self.config
        template = self._templates[entry.key]
        installer = self.installer
        Path(installer.config.cache_dir).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
        if config.sandbox.network == "model-only":
            entry.listen = _listening_socket()
        requested, _ = access.requested_user(config.sandbox.user, template.user)
        spec = owned_spec(
            config,
            template,
            entry.run_id,
            socket=f"{entry.listen[1]}/model.sock" if entry.listen else None,
            cache_dir=installer.config.cache_dir,
            requested_user=requested,
            labels={
                LABEL_POOL: self.pool_id,
                **({LABEL_BATCH: self.batch_id} if self.batch_id else {}),
            },
        )
        creating = asyncio.ensure_future(self.provider.create(spec))
        try:
            entry.sandbox = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # Created after all: ours to release (the caller's discard does it).
            with contextlib.suppress(Exception):
                entry.sandbox = await asyncio.wait_for(creating, RELEASE_S)
            raise
        budget = config.budgets.install_s
        entry.runtime = await asyncio.wait_for(
            prepare_runtime(
                entry.sandbox,
                installer,
                RuntimeLayout(f"/tmp/.opencode-tui-{entry.run_id}"),
                emit=entry.events.append,
                version=config.runtime.opencode_version,
                budget_s=budget,
            ),
            budget,
        )
        await self._start_server(entry, template, requested, budget)
        entry.prepared_at = utcnow()
        entry.ready_at = time.monotonic()
        self.counts.prepared += 1

    async def _start_server(
        self, entry: _Entry, template: Task, requested: str | None, budget: float
    ) -> None:
        """OpenCode's server, started ahead where the task's config allows it (core/episode/ahead.py)."""
        from opencode_tui_core.episode.ahead import can_start_ahead, start_ahead
        from opencode_tui_core.episode.seed import identify

        socket_path = f"{entry.listen[1]}/model.sock" if entry.listen else None
        if (
            entry.sandbox is None
            or entry.runtime is None
            or not can_start_ahead(template, self.config, socket_path)
        ):
            return
        assert socket_path is not None
        _, source = access.requested_user(self.config.sandbox.user, template.user)
        # Who the sandbox user is decides who owns the session directory: decided here, once, and
        # what deciding it said is replayed by the episode's seed phase (which does not ask again).
        entry.seeded = await identify(
            entry.sandbox, requested, source, borrowed=False, emit=entry.seed_events.append
        )
        user = entry.seeded.user
        entry.server = await start_ahead(
            entry.sandbox,
            entry.runtime,
            template,
            self.config,
            run_id=entry.run_id,
            user=user,
            socket_path=socket_path,
            ready_s=budget,
        )

    # ---- releasing -------------------------------------------------------------------------------

    async def _discard(self, entry: _Entry) -> None:
        if entry in self._entries:
            self._entries.remove(entry)
        if entry.task is not None and not entry.task.done():
            entry.task.cancel()
            with contextlib.suppress(BaseException):
                await entry.task
        await self._release(entry, count=True)

    async def _release(self, entry: _Entry, *, count: bool) -> None:
        """Destroy an unused sandbox and ask its engine whether it is gone (the confirmation)."""
        sandbox, entry.sandbox = entry.sandbox, None
        if count:
            self.counts.discarded += 1
        _close_listening(entry.listen)
        if sandbox is None:
            return
        confirmed = False
        try:
            if entry.server is not None:  # its supervisor stops it and says so, before the sandbox goes
                await entry.server.stop(RELEASE_S)
            await asyncio.wait_for(sandbox.release(), RELEASE_S)
            probe = await sandbox.probe(PROBE_S)
            confirmed = probe.dead is not False
        except Exception:
            confirmed = False
        if confirmed:
            self.counts.released_confirmed += 1
        else:
            self.counts.released_unconfirmed += 1

    async def close(self) -> WarmCounts:
        """Every way a batch ends: stop filling, release every unused sandbox (confirmed), once."""
        self._stopped = True
        self._kick.set()
        if self._filler is not None and not self._filler.done():
            self._filler.cancel()
            with contextlib.suppress(BaseException):
                await self._filler
        entries, self._entries = list(self._entries), []
        await asyncio.gather(*(self._discard(e) for e in entries), return_exceptions=True)
        # The releases of failed preparations (their watchers) end too before the pool says it is done.
        await asyncio.gather(*self._watchers, return_exceptions=True)
        return self.counts
