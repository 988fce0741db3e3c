"""Shared helpers of the engine benchmarks (sandbox.py, runtime.py, episode.py).

- ``setup()``: puts the repo on ``sys.path`` and gives every sandbox of this process an owner label of
  its own (``OPENCODE_TUI_OWNER=bench-<pid>@<host>``), so the leftover check only ever looks at our
  containers, never at those of tests running on the same machine.
- ``TimedProvider`` / ``TimedSandbox``: delegating wrappers that record when each sandbox operation
  started (epoch seconds, comparable with event timestamps) and how long it took. They add one
  coroutine frame per call and change nothing else.
- statistics, a plain-text table, ``--json`` output and the Docker/local leftover checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")

LABEL_RUN = "opencode-tui.run"
LABEL_OWNER = "opencode-tui.owner"
IMAGE = "opencode-tui/base:bookworm"


def setup() -> str:
    """Import path plus a per-process owner label; returns the owner."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    owner = f"bench-{os.getpid()}@{socket.gethostname()}"
    os.environ["OPENCODE_TUI_OWNER"] = owner
    return owner


# ---- statistics ---------------------------------------------------------------------------------


def med(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summary(xs: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and n of a sample (seconds)."""
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "samples": list(xs),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def fmt_s(x: float | None, unit: str = "ms") -> str:
    if x is None:
        return "-"
    if unit == "ms":
        if x < 0.01:
            return f"{x * 1000:.3f} ms"
        return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"
    return f"{x:.2f} s"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def fmt_spread(xs: Sequence[float], unit: str = "ms") -> str:
    if not xs:
        return "-"
    if unit == "ms":
        digits = 3 if max(xs) < 0.01 else 0
        return f"{min(xs) * 1000:.{digits}f}-{max(xs) * 1000:.{digits}f}"
    return f"{min(xs):.2f}-{max(xs):.2f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> str:
    rows = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    line = "  ".join("-" * w for w in widths)
    out = []
    if title:
        out.append(title)
    out.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    out.append(line)
    for r in rows:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(out)


class Report:
    """Collects tables (text) and a JSON document; prints them the way ``--json`` asks."""

    def __init__(self, name: str, json_target: str | None, meta: Mapping[str, Any] | None = None):
        self.name = name
        self.json_target = json_target
        self.data: dict[str, Any] = {"benchmark": name, "meta": dict(meta or {})}
        # With ``--json`` alone the JSON document goes to stdout, so the tables go to stderr.
        self.text_out = sys.stderr if json_target == "-" else sys.stdout

    def say(self, text: str = "") -> None:
        print(text, file=self.text_out, flush=True)

    def progress(self, text: str) -> None:
        print(f"  .. {text}", file=sys.stderr, flush=True)

    def finish(self) -> None:
        doc = json.dumps(self.data, indent=2, default=_json_default)
        if self.json_target == "-":
            print(doc, flush=True)
        elif self.json_target:
            Path(self.json_target).write_text(doc + "\n")
            self.say(f"JSON written to {self.json_target}")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    return str(obj)


def add_common_args(p: Any) -> None:
    p.add_argument("--quick", action="store_true", help="a short run (fewer repetitions)")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="write the results as JSON to PATH; alone: JSON on stdout (the tables go to stderr)",
    )


# ---- timing wrappers around the sandbox protocol ------------------------------------------------


@dataclass
class Op:
    kind: str  # exec | upload | upload_tar | download | status | inspect | release | create | pty
    label: str
    start: float  # epoch seconds (time.time()), comparable with event timestamps
    duration: float  # seconds (perf_counter)
    ok: bool = True

    @property
    def end(self) -> float:
        return self.start + self.duration


def exec_label(argv: Sequence[str]) -> str:
    """A short, stable name for the engine's well-known execs."""
    text = " ".join(argv)
    if "supervisor.py" in text and "ln -s launch" in text:
        return "launch (supervisor + harness)"
    if "stop.request" in text and "confirmed()" in text:
        return "stop + receipt"
    if "opencode_tui_probe" in text:
        return "probe"
    if text.endswith("--version"):
        return "opencode --version"
    if "chmod 700" in text:
        return "session mkdir"
    if text.startswith("/bin/sh -c test -x"):
        return "test -x (mounted binary)"
    if text.startswith("/bin/sh -c mkdir -p"):
        return "mkdir (harness dirs)"
    return text[:60]


@dataclass
class OpLog:
    ops: list[Op] = field(default_factory=list)

    async def timed(self, kind: str, label: str, aw: Awaitable[T]) -> T:
        start = time.time()
        t0 = time.perf_counter()
        ok = False
        try:
            value = await aw
            ok = True
            return value
        finally:
            self.ops.append(Op(kind, label, start, time.perf_counter() - t0, ok))


def make_timed_sandbox(inner: Any, log: OpLog) -> Any:
    from opencode_tui_core.sandbox.base import Sandbox

    class TimedSandbox(Sandbox):
        """Delegates every call to ``inner`` and records it in ``log``."""

        def __init__(self) -> None:
            self._inner = inner
            self.provider = inner.provider
            self.sandbox_id = inner.sandbox_id
            self.owned = inner.owned
            self.log = log

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        async def status(self) -> Any:
            return await log.timed("status", "status", inner.status())

        async def exec(self, argv: Sequence[str], **kw: Any) -> Any:
            return await log.timed("exec", exec_label(argv), inner.exec(argv, **kw))

        async def pty(self, argv: Sequence[str], **kw: Any) -> Any:
            return await log.timed("pty", " ".join(argv)[:40], inner.pty(argv, **kw))

        async def upload_tar(self, dest_dir: str, archive: bytes) -> None:
            return await log.timed("upload_tar", dest_dir, inner.upload_tar(dest_dir, archive))

        async def download_tar(self, path: str) -> bytes:
            return await log.timed("download", path, inner.download_tar(path))

        async def upload_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
            return await log.timed("upload", path, inner.upload_file(path, data, mode))

        async def download_file(self, path: str) -> bytes:
            return await log.timed("download", path, inner.download_file(path))

        async def inspect(self) -> Any:
            return await log.timed("inspect", "inspect", inner.inspect())

        def host_ids(self, user: Any) -> Any:
            return inner.host_ids(user)

        async def release(self) -> None:
            return await log.timed("release", "release", inner.release())

    return TimedSandbox()


def make_timed_provider(inner: Any) -> Any:
    """A provider whose sandboxes are TimedSandboxes; ``.logs`` holds one OpLog per created sandbox."""
    from opencode_tui_core.sandbox.base import SandboxProvider

    class TimedProvider(SandboxProvider):
        def __init__(self) -> None:
            self.name = inner.name
            self.inner = inner
            self.logs: list[OpLog] = []

        async def create(self, spec: Any) -> Any:
            log = OpLog()
            self.logs.append(log)
            sb = await log.timed("create", "create", inner.create(spec))
            return make_timed_sandbox(sb, log)

        async def connect(self, sandbox_id: str) -> Any:
            log = OpLog()
            self.logs.append(log)
            sb = await log.timed("create", "connect", inner.connect(sandbox_id))
            return make_timed_sandbox(sb, log)

        async def sweep(self, *, dry_run: bool = False, owner: str | None = None) -> list[str]:
            return await inner.sweep(dry_run=dry_run, owner=owner)

    return TimedProvider()


# ---- docker helpers -----------------------------------------------------------------------------


def docker_ids(*filters: str) -> list[str]:
    args = ["docker", "ps", "-aq"]
    for f in filters:
        args += ["--filter", f]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    return r.stdout.split()


def leftovers(owner: str) -> dict[str, Any]:
    """Our leftover containers (by our owner label) and, for information, all engine-labelled ones."""
    ours = docker_ids(f"label={LABEL_OWNER}={owner}")
    return {
        "ours": ours,
        "all_opencode_tui_run": len(docker_ids(f"label={LABEL_RUN}")),
    }


def remove_containers(ids: Iterable[str]) -> None:
    ids = list(ids)
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=120)


def raw_labels(owner: str, tag: str) -> list[str]:
    """``--label`` arguments for raw baseline containers (so the leftover check sees them too)."""
    return ["--label", f"{LABEL_RUN}=bench-raw-{tag}", "--label", f"{LABEL_OWNER}={owner}"]


# ---- the no-harness floor: plain OpenCode in a plain container on the same scripted model ---------


def cached_binary_dir(version: str = "1.18.32") -> Path:
    """The installer cache entry of the pinned x64 build (installed first if missing)."""
    import asyncio

    from opencode_tui_core.runtime.installer import Installer, InstallerConfig
    from opencode_tui_core.runtime.targets import Target

    inst = Installer(InstallerConfig(version=version))
    target = Target(arch="x64")
    hit = inst.cached(target) or asyncio.run(inst.ensure(target))
    return Path(hit.path).parent


def opencode_log_start(data_dir: Path) -> float | None:
    """Epoch of OpenCode's first log line (``creating instance``) under ``<data>/opencode/log``."""
    from datetime import datetime

    for log_file in sorted(data_dir.glob("opencode/log/*.log")):
        for line in log_file.read_text(errors="replace").splitlines():
            if line.startswith("timestamp="):
                stamp = line.split()[0].removeprefix("timestamp=")
                return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return None


class RawOpenCode:
    """``opencode run`` with no engine around it: the installer's cached binary bind-mounted read-only,
    host networking, a ScriptedModel of the task on 127.0.0.1, the same OpenCode environment switches
    (no autoupdate, no share, no model/LSP fetches) and a provider-only config (no plugin)."""

    MOUNT = "/opt/opencode"

    def __init__(self, task: Any, binary_dir: Path, owner: str, image: str | None = None) -> None:
        self.task = task
        self.binary_dir = binary_dir
        self.owner = owner
        self.image = image or task.image

    async def _model(self) -> Any:
        from opencode_tui_core.model.scripted import ScriptedModel

        return await ScriptedModel(
            self.task.trajectory_path, placeholders={"workdir": self.task.workdir}, model_id="scripted"
        ).start()

    def _files(self, model_url: str) -> Path:
        import tempfile

        from opencode_tui_core.config import ModelSettings
        from opencode_tui_core.runtime.opencode import build_config

        tmp = Path(tempfile.mkdtemp(prefix="octui-bench-raw-"))
        (tmp / "cfg").mkdir()
        (tmp / "xdg").mkdir()
        cfg = build_config(ModelSettings(), model_url, None, None)
        (tmp / "cfg" / "opencode.json").write_text(json.dumps(cfg))
        return tmp

    def _env_args(self) -> list[str]:
        from opencode_tui_core.runtime.opencode import OPENCODE_ENV

        env = {
            "HOME": "/root",
            **{f"XDG_{k.upper()}_HOME": f"/xdg/{k}" for k in ("config", "data", "cache", "state")},
            **OPENCODE_ENV,
            "OPENCODE_CONFIG": "/cfg/opencode.json",
            "LANG": "C.UTF-8",
            "NO_COLOR": "1",
        }
        out: list[str] = []
        for k, v in env.items():
            out += ["-e", f"{k}={v}"]
        return out

    def _mount_args(self, tmp: Path) -> list[str]:
        return [
            "-v",
            f"{self.binary_dir}:{self.MOUNT}:ro",
            "-v",
            f"{tmp / 'cfg'}:/cfg:ro",
            "-v",
            f"{tmp / 'xdg'}:/xdg",
        ]

    @property
    def binary(self) -> str:
        return f"{self.MOUNT}/opencode"

    async def exec_run(self, tag: str) -> dict[str, Any]:
        """Untimed: model + ``docker run -d`` (host network). Timed: ``docker exec -i <c> opencode run``
        until it exits. Returns epochs of the exec start, OpenCode's first log line, the first model
        call, the exit; plus the exit status and the model calls served."""
        import asyncio
        import shutil

        from opencode_tui_core.tasks import render_prompt

        model = await self._model()
        tmp = self._files(model.url)
        cid = None
        try:
            run = ["docker", "run", "-d", "--init", "--network", "host", "-w", self.task.workdir]
            run += raw_labels(self.owner, tag) + self._mount_args(tmp)
            run += ["--entrypoint", "/bin/sh", self.image, "-c", "while :; do sleep 3600; done"]
            started = await asyncio.to_thread(
                subprocess.run, run, check=True, capture_output=True, text=True, timeout=120
            )
            cid = started.stdout.strip()
            args = ["docker", "exec", "-i", "-w", self.task.workdir, *self._env_args(), cid]
            args += [self.binary, "run", "--format", "json"]
            t_start = time.time()
            proc = await asyncio.create_subprocess_exec(
                *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            _out, err = await proc.communicate(render_prompt(self.task).encode())
            t_end = time.time()
            verify = await asyncio.to_thread(
                subprocess.run,
                ["docker", "exec", "-w", self.task.workdir, cid, "/bin/sh", "-c", self.task.verify.command],
                capture_output=True,
                timeout=120,
            )
            return {
                "t_start": t_start,
                "t_end": t_end,
                "t_log": opencode_log_start(tmp / "xdg" / "data"),
                "t_first_call": model.calls[0].at if model.calls else None,
                "t_last_call": model.calls[-1].at if model.calls else None,
                "calls": len(model.calls),
                "rc": proc.returncode,
                "verified": verify.returncode == 0,
                "stderr": err.decode(errors="replace")[-500:],
            }
        finally:
            if cid:
                await asyncio.to_thread(remove_containers, [cid])
            await model.close()
            shutil.rmtree(tmp, ignore_errors=True)

    async def floor_run(self, tag: str) -> dict[str, Any]:
        """Timed as a whole: ``docker run --rm -i`` of the image running ``opencode run`` and then the
        task's verify command (model started before the clock, closed after)."""
        import asyncio
        import shutil

        from opencode_tui_core.tasks import render_prompt

        model = await self._model()
        tmp = self._files(model.url)
        try:
            # ``times`` (a shell builtin) reports the CPU time of OpenCode and the verifier.
            script = (
                f"{self.binary} run --format json && {{ {self.task.verify.command} ; }}; "
                "rc=$?; times >&2; exit $rc"
            )
            args = ["docker", "run", "--rm", "-i", "--network", "host", "-w", self.task.workdir]
            args += raw_labels(self.owner, tag) + self._mount_args(tmp) + self._env_args()
            args += ["--entrypoint", "/bin/sh", self.image, "-c", script]
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            _out, err = await proc.communicate(render_prompt(self.task).encode())
            wall = time.perf_counter() - t0
            cpu = None
            with contextlib.suppress(ValueError, IndexError):
                cpu = sum(_shell_time(t) for t in err.decode().strip().splitlines()[-1].split())
            return {
                "wall": wall,
                "cpu": cpu,
                "rc": proc.returncode,
                "calls": len(model.calls),
                "stderr": err.decode(errors="replace")[-500:],
            }
        finally:
            await model.close()
            shutil.rmtree(tmp, ignore_errors=True)

    async def bwrap_floor_run(self, tag: str) -> dict[str, Any]:
        """The local provider's floor: the same command as ``floor_run`` under one plain ``bwrap`` (fresh
        user, PID, IPC and UTS namespaces, the host network so the model on 127.0.0.1 is reachable, the
        same read-only system binds as the local provider, ``/etc`` read-only, a host dir as the
        workdir, the cached binary read-only). No keeper, no supervisor, no cleanup checks."""
        import asyncio
        import shutil

        from opencode_tui_core.sandbox.local.bwrap import _system_fs_args, resolve_bwrap
        from opencode_tui_core.tasks import render_prompt

        model = await self._model()
        tmp = self._files(model.url)
        (tmp / "work").mkdir()
        (tmp / "home").mkdir()
        try:
            script = (
                f"{self.binary} run --format json && {{ {self.task.verify.command} ; }}; "
                "rc=$?; times >&2; exit $rc"
            )
            env: list[str] = []
            for a in zip(self._env_args()[::2], self._env_args()[1::2], strict=True):
                k, _, v = a[1].partition("=")
                env += ["--setenv", k, v]
            args = [resolve_bwrap().path, "--unshare-user", "--unshare-pid", "--unshare-ipc"]
            args += ["--unshare-uts", "--die-with-parent", "--cap-drop", "ALL", *_system_fs_args()]
            args += ["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
            args += ["--bind", str(tmp / "work"), self.task.workdir, "--bind", str(tmp / "home"), "/root"]
            args += ["--ro-bind", str(self.binary_dir), self.MOUNT, "--ro-bind", str(tmp / "cfg"), "/cfg"]
            args += ["--bind", str(tmp / "xdg"), "/xdg", "--chdir", self.task.workdir, *env]
            args += ["--", "/bin/sh", "-c", script]
            t_start = time.time()
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            _out, err = await asyncio.wait_for(proc.communicate(render_prompt(self.task).encode()), 300)
            wall = time.perf_counter() - t0
            cpu = None
            with contextlib.suppress(ValueError, IndexError):
                cpu = sum(_shell_time(t) for t in err.decode().strip().splitlines()[-1].split())
            return {
                "wall": wall,
                "cpu": cpu,
                "t_start": t_start,
                "t_first_call": model.calls[0].at if model.calls else None,
                "rc": proc.returncode,
                "calls": len(model.calls),
                "stderr": err.decode(errors="replace")[-500:],
            }
        finally:
            await model.close()
            shutil.rmtree(tmp, ignore_errors=True)


def _shell_time(text: str) -> float:
    """``1m2.500s`` (the output format of the ``times`` builtin) → seconds."""
    minutes, _, seconds = text.rstrip("s").partition("m")
    return int(minutes) * 60 + float(seconds)


# ---- CPU accounting ------------------------------------------------------------------------------

DOCKER_CPUACCT = Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")  # cgroup v1, cgroupfs driver


def machine_busy_s() -> float:
    """CPU-seconds every core of the machine has been busy since boot (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_s() -> tuple[float, float]:
    """(this process, its reaped descendants) user+system CPU-seconds. Neither a local sandbox's
    processes (bwrap's init in the sandbox's PID namespace reaps them, and bwrap does not wait for
    that init) nor Docker's containers (containerd's) are among the descendants."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def docker_cpu_s() -> float | None:
    """CPU-seconds of every container of this Docker engine since it started: the ``docker`` cgroup's
    cumulative usage (cgroup v1 charges a removed container's time to its parent too), or None where
    that cgroup is not there. Any owner's containers count (other tests on the machine)."""
    try:
        return int(DOCKER_CPUACCT.read_text()) / 1e9
    except (OSError, ValueError):
        return None


@dataclass
class CpuSpan:
    """CPU used between two ``CpuMeter`` readings (seconds)."""

    wall: float
    machine: float  # every core, everything on the machine (``/proc/stat``)
    controller: float  # this process (RUSAGE_SELF): the engine, the proxy, the scripted model
    # Reaped descendants (docker CLI calls, a verifier). Not a local sandbox: bwrap's init in the
    # sandbox's PID namespace reaps its processes and bwrap does not wait for that init.
    children: float
    docker: float | None  # the Docker engine's containers (any owner); None: not measured

    @property
    def own(self) -> float | None:
        """With Docker: this process, its reaped descendants and the engine's containers, the run's
        own CPU less the machine's noise (dockerd/containerd's own work is not in it). None without."""
        return None if self.docker is None else self.controller + self.children + self.docker

    def per(self, n: int) -> dict[str, float | None]:
        n = max(1, n)
        own = self.own
        return {
            "wall": self.wall / n,
            "machine": self.machine / n,
            "controller": self.controller / n,
            "children": self.children / n,
            "docker": None if self.docker is None else self.docker / n,
            "own": None if own is None else own / n,
        }


class CpuMeter:
    """``m = CpuMeter(docker=True); ...; span = m.span()``: the CPU of everything between (CpuSpan);
    ``docker``: also the Docker engine's containers (for runs on the docker provider)."""

    def __init__(self, *, docker: bool = False) -> None:
        self.t0 = time.perf_counter()
        self.busy0 = machine_busy_s()
        self.self0, self.kids0 = process_cpu_s()
        self.docker0 = docker_cpu_s() if docker else None

    def span(self) -> CpuSpan:
        me, kids = process_cpu_s()
        docker = docker_cpu_s() if self.docker0 is not None else None
        return CpuSpan(
            wall=time.perf_counter() - self.t0,
            machine=machine_busy_s() - self.busy0,
            controller=me - self.self0,
            children=kids - self.kids0,
            docker=None if docker is None or self.docker0 is None else docker - self.docker0,
        )


def peak_rss_mb() -> float:
    """This process's peak resident set so far (it is the controller: episodes run in it)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident set now (``/proc/self/status`` VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


async def reap_leftovers(owner: str) -> dict[str, Any]:
    """Containers this benchmark left behind (found by its owner label), removed; the counts returned."""
    left = await asyncio.to_thread(leftovers, owner)
    remove_containers(left["ours"])
    return left


def close_report(rep: Any, left: dict[str, Any], owner: str, started: float, status: int) -> int:
    """The common ending: report leftovers and run time, write the report; leftovers fail the run."""
    rep.data["leftovers"] = left
    rep.say(
        f"docker leftovers with our owner label ({owner}): {len(left['ours'])} "
        f"(all {LABEL_RUN} containers on this engine, any owner: {left['all_opencode_tui_run']})"
    )
    rep.say(f"total run time {time.monotonic() - started:.0f} s")
    rep.finish()
    return 1 if left["ours"] else status
