"""A toy sandbox provider, registered only through its entry point (see ../pyproject.toml).

Each sandbox is a host directory holding private ``/app`` and ``/tmp``; a command is a host
subprocess in a bubblewrap mount namespace that shows the host's own filesystem with those two
directories bound over it (so ``/app`` means the sandbox's workdir, as the contract expects). It
isolates nothing else: no network policy, no limits, no other users, no terminal. It says so in its
``Capabilities``, and the contract tests that need more are skipped by capability.

It uses only the public provider API (opencode_tui_core.sandbox.base, .errors, .registry, .tarsafe).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
import tarfile
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict

from opencode_tui_core.provider_registry import Capabilities, Check, ProviderPlugin
from opencode_tui_core.sandbox.base import (
    LABEL_OWNER,
    LABEL_RUN,
    ExecResult,
    OutputCallback,
    OutputChunk,
    PtyHandle,
    Sandbox,
    SandboxProvider,
    SandboxRecord,
    SandboxSpec,
    SandboxState,
    SandboxStatus,
    SingleFlight,
    check_exec_args,
    default_owner,
    new_execution_id,
)
from opencode_tui_core.sandbox.errors import SandboxClosedError, SandboxError, SandboxFileNotFoundError
from opencode_tui_core.sandbox.tarsafe import safe_extract

NAME = "toy"
PRIVATE = ("/app", "/tmp")  # the sandbox paths that are the sandbox's own directories
LABELS_FILE = "labels.json"


class ToySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_dir: str | None = None  # default: $XDG_STATE_HOME/opencode-tui/toy


def _now() -> datetime:
    return datetime.now(UTC)


class ToySandbox(Sandbox):
    provider = NAME

    def __init__(self, root: Path, bwrap: str, env: Mapping[str, str], *, owned: bool) -> None:
        self.sandbox_id = root.name
        self.root = root
        self.owned = owned
        self._bwrap = bwrap
        self._env = dict(env)
        self._closed = False
        self._release_once = SingleFlight(self._release)

    def _open(self) -> None:
        if self._closed:
            raise SandboxClosedError(f"toy sandbox {self.sandbox_id} was released")

    def _host(self, path: str) -> Path:
        p = PurePosixPath(path)
        for top in PRIVATE:
            if p == PurePosixPath(top) or PurePosixPath(top) in p.parents:
                if ".." in p.parts:
                    break
                return self.root / top.lstrip("/") / p.relative_to(top)
        raise SandboxError(f"the toy provider only holds files under {' and '.join(PRIVATE)}, not {path}")

    def _argv(self, argv: Sequence[str], cwd: str) -> list[str]:
        binds: list[str] = []
        for entry in sorted(os.listdir("/")):
            if f"/{entry}" not in PRIVATE and os.path.isdir(f"/{entry}") and not os.path.islink(f"/{entry}"):
                binds += ["--dev-bind", f"/{entry}", f"/{entry}"]
            elif os.path.islink(f"/{entry}"):
                binds += ["--symlink", os.readlink(f"/{entry}"), f"/{entry}"]
        for top in PRIVATE:
            binds += ["--bind", str(self.root / top.lstrip("/")), top]
        return [self._bwrap, "--tmpfs", "/", *binds, "--die-with-parent", "--chdir", cwd, "--", *argv]

    async def status(self) -> SandboxStatus:
        state = SandboxState.RELEASED if self._closed else SandboxState.RUNNING
        return SandboxStatus(
            sandbox_id=self.sandbox_id,
            provider=NAME,
            owned=self.owned,
            state=state,
            memory_limit_enforced=False,
        )

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
        check_exec_args(argv, timeout)
        self._open()
        if user is not None:
            raise SandboxError("the toy provider runs commands as its own user only")
        eid = execution_id or new_execution_id()
        started = _now()
        proc = await asyncio.create_subprocess_exec(
            *self._argv(argv, cwd or "/app"),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**self._env, **(env or {})},
            start_new_session=True,  # its process group is what a deadline kills
        )
        out = {"stdout": bytearray(), "stderr": bytearray()}

        async def pump(stream: asyncio.StreamReader, name: Any) -> None:
            while data := await stream.read(65536):
                out[name] += data
                if on_output is not None:
                    res = on_output(OutputChunk(execution_id=eid, stream=name, data=data))
                    if asyncio.iscoroutine(res):
                        await res

        async def feed() -> None:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin or b"")
                await proc.stdin.drain()
            proc.stdin.close()

        assert proc.stdout is not None and proc.stderr is not None
        tasks = [pump(proc.stdout, "stdout"), pump(proc.stderr, "stderr")]
        if stdin is not None:
            tasks.append(feed())
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*tasks)
                code = await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return ExecResult(
                execution_id=eid,
                exit_code=None,
                observed=False,
                deadline_expired=True,
                stdout=bytes(out["stdout"]),
                stderr=bytes(out["stderr"]),
                started_at=started,
                ended_at=_now(),
            )
        sig = -code if code < 0 else None
        if os.environ.get("TOY_PROVIDER_BREAK_EXIT_CODES"):  # a deliberate defect: the suite must fail
            code = 0
        return ExecResult(
            execution_id=eid,
            exit_code=None if sig else code,
            signal=sig,
            observed=True,
            stdout=bytes(out["stdout"]),
            stderr=bytes(out["stderr"]),
            started_at=started,
            ended_at=_now(),
        )

    async def pty(
        self, argv: Sequence[str], *, cols: int = 80, rows: int = 24, cwd: str | None = None
    ) -> PtyHandle:
        self._open()
        raise SandboxError("the toy provider has no terminals (it does not declare the pty capability)")

    async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
        self._open()
        await asyncio.to_thread(safe_extract, archive, self._host(dest_dir))

    async def download_tar(self, path: str) -> bytes:
        self._open()
        host = self._host(path)
        if not host.exists() and not host.is_symlink():
            raise SandboxFileNotFoundError(f"{path} does not exist in toy sandbox {self.sandbox_id}")

        def pack() -> bytes:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
                tf.add(host, arcname=PurePosixPath(path).name)
            return buf.getvalue()

        return await asyncio.to_thread(pack)

    async def inspect(self) -> list[Any]:
        self._open()
        return []  # no structured evidence: the toy declares no OOM evidence source

    async def release(self) -> None:
        # The shared single-flight helper: a second caller (a hurried close) joins the removal in
        # flight, and a cancelled first caller does not cut it short (the contract suite checks it).
        await self._release_once()

    async def _release(self) -> None:
        self._closed = True
        if self.owned:
            await asyncio.to_thread(shutil.rmtree, self.root, True)


class ToyProvider(SandboxProvider):
    name = NAME

    def __init__(self, settings: ToySettings) -> None:
        state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        self.base = Path(settings.base_dir or os.path.join(state, "opencode-tui", NAME))

    def _bwrap(self) -> str:
        found = shutil.which("bwrap")
        if found is None:
            raise SandboxError("the toy provider needs bwrap on PATH")
        return found

    async def create(self, spec: SandboxSpec) -> ToySandbox:
        if spec.user is not None:
            raise SandboxError("the toy provider runs commands as its own user only")
        root = self.base / f"toy-{uuid.uuid4().hex[:12]}"
        for top in PRIVATE:
            (root / top.lstrip("/")).mkdir(parents=True, mode=0o700)
        (root / "tmp").chmod(0o1777)
        labels = {
            **spec.labels,
            LABEL_RUN: spec.run_id,
            LABEL_OWNER: spec.labels.get(LABEL_OWNER) or default_owner(),
        }
        (root / LABELS_FILE).write_text(json.dumps(labels))
        (root / spec.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", **spec.env}
        return ToySandbox(root, self._bwrap(), env, owned=True)

    async def connect(self, sandbox_id: str) -> ToySandbox:
        root = self.base / sandbox_id
        if not (root / LABELS_FILE).is_file():
            raise SandboxError(f"no toy sandbox {sandbox_id}")
        return ToySandbox(root, self._bwrap(), {"PATH": "/usr/local/bin:/usr/bin:/bin"}, owned=False)

    async def listed(self, *, owner: str | None = None) -> list[SandboxRecord]:
        out = []
        for labels_file in sorted(self.base.glob(f"toy-*/{LABELS_FILE}")):
            labels = json.loads(labels_file.read_text())
            if owner is None or labels.get(LABEL_OWNER) == owner:
                out.append(SandboxRecord(provider=NAME, sandbox_id=labels_file.parent.name, labels=labels))
        return out

    async def remove(self, sandbox_id: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self.base / sandbox_id, True)

    async def sweep(self, *, dry_run: bool = False, owner: str | None = None) -> list[str]:
        found = [r.sandbox_id for r in await self.listed(owner=owner)]
        if not dry_run:
            for sandbox_id in found:
                await self.remove(sandbox_id)
        return found


class ToyPlugin(ProviderPlugin):
    name = NAME
    summary = "toy: host subprocesses over private /app and /tmp (tests only)"
    settings_model = ToySettings
    capabilities = Capabilities(listing=True, sweep_by_default=True)

    def provider(self, settings: BaseModel) -> ToyProvider:
        s = self.settings(settings)
        assert isinstance(s, ToySettings)
        return ToyProvider(s)

    async def preflight(self, config: Any) -> list[Check]:
        found = shutil.which("bwrap")
        if found is None:
            return [Check(name="toy bwrap", status="warn", detail="bwrap is not on PATH")]
        return [Check(name="toy bwrap", status="ok", detail=found)]


PLUGIN = ToyPlugin()
