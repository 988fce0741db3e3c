"""The sandbox protocol shared by every provider (docker, local bubblewrap, opensandbox).

A provider creates *owned* sandboxes (we destroy them on release) or connects to *borrowed* ones
(release removes our files and disconnects; the sandbox itself is never stopped by us).
"""

from __future__ import annotations

import abc
import asyncio
import getpass
import math
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# NetworkPolicy, parse_user_spec and Recovery live below the sandbox layer (the config and the events
# use them); providers import them from here, the sandbox layer's one vocabulary.
from opencode_tui_core.config import NetworkPolicy, parse_user_spec  # noqa: F401
from opencode_tui_core.events import SandboxFault
from opencode_tui_core.failures import Evidence, FailureEvent, Recovery
from opencode_tui_core.invocation import Liveness, invocation_id, invocation_liveness  # noqa: F401 (the label's home)

# The exceptions live in opencode_tui_core.sandbox.errors; re-exported here for callers that import them from base.
from opencode_tui_core.sandbox.errors import (  # noqa: F401
    ExpectedRefusal,
    SandboxClosedError,
    SandboxError,
    SandboxFileNotFoundError,
    UnsafeArchiveError,
)

LABEL_RUN = "opencode-tui.run"
LABEL_OWNER = "opencode-tui.owner"
# Which process created the sandbox (see ``invocation_id``): lets ``sweep`` tell a live job's
# sandboxes from leftovers when several jobs share one owner (user@host).
LABEL_INVOCATION = "opencode-tui.invocation"
# The batch an episode's sandbox belongs to (``run --batch``): ``sweep --batch ID`` removes a batch's
# leftovers, and the Ray executor sweeps a lost worker's node by batch and run.
LABEL_BATCH = "opencode-tui.batch"
# A warm sandbox prepared ahead of its episode (core/episode/pool.py; value: the batch id). Its run
# label is the pool's (``pool-…``), not the episode's that later uses it: ``sweep`` finds it by owner
# and creating process like any leftover, ``sweep --batch ID`` by batch.
LABEL_POOL = "opencode-tui.pool"
# Where the model proxy's Unix socket appears inside a model-only sandbox.
SANDBOX_MODEL_SOCKET = "/run/opencode-tui/model.sock"


def default_owner() -> str:
    """A stable owner label for this user on this machine: ``<user>@<hostname>``.

    ``OPENCODE_TUI_OWNER`` overrides it (e.g. a CI job id).
    """
    override = os.environ.get("OPENCODE_TUI_OWNER")
    if override:
        return override
    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


class SingleFlight:
    """An async operation that runs once at a time, whoever calls it and whoever is cancelled.

    For ``Sandbox.release``: a second caller (a hurried close racing the episode's own release) joins
    the release in flight instead of starting another one or returning before it ends, and a caller
    cancelled midway does not cut it short (the operation runs shielded in its own task). After a
    success every call returns at once; after a failure the next call tries again (a close that
    waited for its engine releases once more).
    """

    def __init__(self, operation: Callable[[], Awaitable[None]]) -> None:
        self._operation = operation
        self._task: asyncio.Future[None] | None = None

    @property
    def succeeded(self) -> bool:
        task = self._task
        return task is not None and task.done() and not task.cancelled() and task.exception() is None

    async def __call__(self) -> None:
        task = self._task
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._task = asyncio.ensure_future(self._operation())
            # Every caller may have been cancelled: the failure is still retrieved (no "never
            # retrieved" warning); the next call sees it and tries again.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.shield(task)


class Mount(BaseModel):
    """A host path made visible inside the sandbox (read-only unless said otherwise)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    target: str
    read_only: bool = True

    @field_validator("target")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not PurePosixPath(value).is_absolute() or ".." in PurePosixPath(value).parts:
            raise ValueError(f"mount target {value!r} must be an absolute path without '..'")
        return value


def describe_exit(exit_code: int | None, signal: int | None = None, *, subject: str = "the command") -> str:
    """An exit status in words; an exit that was never observed is said so, never shown as ``None``."""
    if exit_code is None and signal is None:
        return f"{subject}'s exit was not observed"
    if exit_code is None:
        return f"{subject} was killed by signal {signal}"
    return f"{subject} exited with {exit_code}" + (f" (signal {signal})" if signal else "")


class SandboxUser(BaseModel):
    """The identity sandbox processes run as (the harness, OpenCode, the shell, the verifier).

    ``source`` says who chose it: ``image`` (the image's or provider's default user), ``config``
    (``sandbox.user``) or ``task`` (``user:`` in task.yaml).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    uid: int = Field(ge=0)
    gid: int = Field(ge=0)
    source: Literal["image", "config", "task"] = "image"

    @property
    def label(self) -> str:
        return f"{self.name or '?'} (uid {self.uid}, gid {self.gid})"

    @property
    def ids(self) -> tuple[int, int]:
        return self.uid, self.gid


# Prints uid, gid and user name, one per line (POSIX ``id``; the name may be missing in /etc/passwd).
IDENTIFY_SCRIPT = 'id -u && id -g && (id -un 2>/dev/null || echo "")'


class SandboxSpec(BaseModel):
    """What to create. Providers ignore fields they cannot honour only where ``status()`` says so."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    image: str | None = None
    workdir: str = "/app"
    memory_bytes: int | None = Field(default=None, gt=0)
    cpus: float | None = Field(default=None, gt=0)
    # The most processes (threads included) the sandbox may have at once; None: no limit.
    pids_limit: int | None = Field(default=None, gt=0)
    # The sandbox's writable space (workdir, HOME, /tmp) in bytes, where the provider can enforce it.
    disk_bytes: int | None = Field(default=None, gt=0)
    network: NetworkPolicy = NetworkPolicy.MODEL_ONLY
    # Host path of the model proxy's Unix socket, bound at SANDBOX_MODEL_SOCKET (model-only network).
    model_socket: str | None = None
    mounts: list[Mount] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    # Who the sandbox's processes run as: a name, uid or uid:gid; None keeps the image's (or the
    # provider's) own user. See ``Sandbox.identify``.
    user: str | None = None
    ready_timeout_s: float = Field(default=60.0, gt=0)


class SandboxState(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    EXITED = "exited"  # the sandbox's main process ended (e.g. OOM-killed)
    FAILED = "failed"
    GONE = "gone"  # it no longer exists
    RELEASED = "released"
    UNKNOWN = "unknown"


class SandboxStatus(BaseModel):
    """Lifecycle state plus what the provider can and cannot enforce."""

    model_config = ConfigDict(extra="forbid")

    sandbox_id: str
    provider: str
    owned: bool
    state: SandboxState
    memory_limit_enforced: bool | None = None
    # None: no limit was asked for; False: asked for but not enforced (``notes`` says why).
    pids_limit_enforced: bool | None = None
    disk_limit_enforced: bool | None = None
    notes: list[str] = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)


class SandboxProbe(BaseModel):
    """What a sandbox's engine says about it now (``Sandbox.probe``), for a close that lost it.

    ``engine_reachable``: the engine (Docker daemon, OpenSandbox server; for local, the host itself)
    answered. ``dead``: every process of the sandbox is proven gone (an exited or removed container,
    a PID namespace whose pid 1 died and holds no process); None when it cannot be told.
    """

    model_config = ConfigDict(extra="forbid")

    engine_reachable: bool
    # The probe itself saw the engine go away: a restart already over (Docker's emptied event log),
    # the local keeper killed from outside. None: it cannot tell.
    engine_lost: bool | None = None
    dead: bool | None = None
    state: SandboxState = SandboxState.UNKNOWN
    detail: str = ""
    evidence: list[Evidence] = Field(default_factory=list)


class OutputChunk(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    execution_id: str
    stream: Literal["stdout", "stderr"]
    data: bytes


OutputCallback = Callable[[OutputChunk], Awaitable[None] | None]


class ExecResult(BaseModel):
    """The result of one execution.

    ``exit_code`` is ``None`` whenever the exit was not observed (deadline passed, stream lost):
    nothing here rewrites an unknown exit into a timeout or a number like 124.
    """

    model_config = ConfigDict(extra="forbid")

    execution_id: str
    exit_code: int | None
    signal: int | None = None
    observed: bool
    deadline_expired: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    started_at: datetime
    ended_at: datetime
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.observed and self.exit_code == 0

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


def check_exec_args(argv: Sequence[str], timeout: float) -> None:
    """The arguments every provider's ``exec`` refuses before starting anything."""
    if not argv:
        raise ValueError("argv must not be empty")
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number > 0, got {timeout!r}")


def new_execution_id() -> str:
    return "ex-" + uuid.uuid4().hex[:16]


def exec_start(argv: Sequence[str], timeout: float, execution_id: str | None) -> tuple[str, float]:
    """The start every provider's ``exec`` shares: the arguments checked (``check_exec_args``), the
    execution id (the caller's or a new one) and the hard cap's deadline on the running loop's clock."""
    check_exec_args(argv, timeout)
    return execution_id or new_execution_id(), asyncio.get_running_loop().time() + timeout


class QueuedOutput:
    """Terminal output handed from a reader (thread or task) to ``PtyHandle.read`` through a queue.

    ``put(b"")`` marks the end. Reads coalesce what is already queued, up to ``max_bytes``.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._pending = b""
        self._eof = False

    def put(self, data: bytes) -> None:
        self._queue.put_nowait(data)

    async def read(self, max_bytes: int) -> bytes:
        if not self._pending:
            if self._eof:
                return b""
            data = await self._queue.get()
            if not data:
                self._eof = True
                return b""
            self._pending = data
            while len(self._pending) < max_bytes and not self._queue.empty():
                more = self._queue.get_nowait()
                if not more:
                    self._queue.put_nowait(b"")  # keep the end marker for the next read
                    break
                self._pending += more
        out, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return out


class PtyHandle(abc.ABC):
    """An interactive terminal inside the sandbox."""

    @abc.abstractmethod
    async def read(self, max_bytes: int = 65536) -> bytes:
        """Next output; ``b""`` once the terminal has closed."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def resize(self, cols: int, rows: int) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


RecoveredCallback = Callable[[FailureEvent, Recovery], None]


class Sandbox(abc.ABC):
    """One sandbox, owned or borrowed."""

    provider: str
    sandbox_id: str
    owned: bool
    # Set by whoever runs the sandbox (the episode): called with each failure the provider recovered
    # from (or went on after) without raising, a terminal's dropped or broken socket included, so it
    # reaches the event stream. Informational: it never decides an outcome.
    on_recovered: RecoveredCallback | None = None

    @abc.abstractmethod
    async def status(self) -> SandboxStatus: ...

    @abc.abstractmethod
    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
        execution_id: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run ``argv``; stream output to ``on_output`` as it comes; never wait past ``timeout``.

        ``user`` (a name, uid or uid:gid; ``"root"`` for the verifier of Harbor-style tasks) runs this
        one command as someone else than the sandbox's user; a provider that cannot raises SandboxError.
        """

    @abc.abstractmethod
    async def pty(
        self, argv: Sequence[str], *, cols: int = 80, rows: int = 24, cwd: str | None = None
    ) -> PtyHandle: ...

    @abc.abstractmethod
    async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
        """Extract a tar archive into ``dest_dir`` (created if missing); unsafe members are refused."""

    @abc.abstractmethod
    async def download_tar(self, path: str) -> bytes:
        """A tar archive of ``path`` (file or directory), member names relative to its parent."""

    @abc.abstractmethod
    async def inspect(self) -> list[Evidence]:
        """Structured, current evidence about this sandbox (state, OOM reports), each with its source."""

    @abc.abstractmethod
    async def release(self) -> None:
        """Owned: destroy. Borrowed: disconnect only. Idempotent."""

    async def watch_faults(self, stop: asyncio.Event) -> AsyncIterator[SandboxFault]:
        """Kernel kills and a full disk as they happen, until ``stop`` is set (then one last look).

        Observation only: the close-time ``inspect`` decides the outcome. The default sees nothing;
        a provider that cannot watch says so in ``status().notes`` (``faults.NOT_WATCHED_NOTE``)."""
        return
        yield

    async def probe(self, timeout: float) -> SandboxProbe:
        """Ask the engine, within ``timeout``, whether it answers and whether the sandbox is dead.

        Allowed after ``release()`` (a close that lost its engine asks it again); never raises for an
        unreachable engine (that is the answer). The default knows nothing."""
        return SandboxProbe(engine_reachable=True, detail="this provider cannot probe its sandboxes")

    async def identify(self, user: str | None = None) -> SandboxUser:
        """Who commands run as (``user`` None: the sandbox's own user), asked inside the sandbox."""
        r = await self.exec(["/bin/sh", "-c", IDENTIFY_SCRIPT], timeout=30, user=user)
        lines = r.stdout.decode("utf-8", "replace").splitlines()
        if not r.ok or len(lines) < 2 or not lines[0].strip().isdigit() or not lines[1].strip().isdigit():
            detail = r.stderr.decode("utf-8", "replace").strip()[:300] or describe_exit(r.exit_code, r.signal)
            raise SandboxError(f"cannot tell which user the sandbox runs commands as (`id`): {detail}")
        name = lines[2].strip() if len(lines) > 2 else ""
        uid, gid = int(lines[0]), int(lines[1])
        # GNU id prints the number when the uid has no passwd entry: that is no name.
        return SandboxUser(name=name if name and name != str(uid) else None, uid=uid, gid=gid)

    def host_ids(self, user: SandboxUser) -> tuple[int, int] | None:
        """The host uid/gid that appears as ``user`` inside, for host files bound into the sandbox
        (the model proxy's socket); None when the provider shares no host file."""
        return None

    async def keep(self) -> None:
        """The run ends without releasing: the sandbox must outlive this process (for ``attach``).

        Nothing to do where the sandbox lives outside the engine (a container, a remote server);
        the local provider overrides it (its sandbox would otherwise die with the engine)."""
        return None

    # Convenience built on the primitives above.
    async def upload_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        from opencode_tui_core.sandbox.tarsafe import single_file_tar

        parent = str(PurePosixPath(path).parent)
        await self.upload_tar(parent, single_file_tar(PurePosixPath(path).name, data, mode))

    async def download_file(self, path: str) -> bytes:
        from opencode_tui_core.sandbox.tarsafe import read_single_file

        return read_single_file(await self.download_tar(path), PurePosixPath(path).name)


class SandboxRecord(BaseModel):
    """One sandbox of ours as a provider lists it (for ``sweep``): its id and labels."""

    model_config = ConfigDict(extra="forbid")

    provider: str
    sandbox_id: str
    labels: dict[str, str] = Field(default_factory=dict)


class SandboxProvider(abc.ABC):
    """Creates or connects sandboxes of one kind and sweeps leftovers."""

    name: str

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    @abc.abstractmethod
    async def connect(self, sandbox_id: str) -> Sandbox:
        """Attach to an existing sandbox, borrowed: ``release()`` will never destroy it."""

    @abc.abstractmethod
    async def sweep(self, *, dry_run: bool = False, owner: str | None = None) -> list[str]:
        """Remove (or just list) leftover owned sandboxes found by label; returns their ids."""

    async def listed(self, *, owner: str | None = None) -> list[SandboxRecord]:
        """Every sandbox carrying our owner label (``owner``'s only when given), with its labels."""
        raise NotImplementedError(f"the {self.name} provider cannot list its sandboxes")

    async def remove(self, sandbox_id: str) -> None:
        """Destroy one sandbox found by ``listed`` (gone already is fine)."""
        raise NotImplementedError(f"the {self.name} provider cannot remove a sandbox by id")
