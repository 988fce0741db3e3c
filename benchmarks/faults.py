"""The fault suite (issue 19): inject each fault into real episodes and print one honest table.

Every row runs the real CLI (``opencode-tui run TASK --batch``) on a real provider with the real
OpenCode binary and the scripted model, injects one real fault, and reads what the run says about
it: the batch line (outcome, failure kind, exit code, cleanup proof), stderr (no traceback), the
sandboxes left with the row's own owner label, and the run directory's files (a file seen while the
run went on that is gone or shorter afterwards is a lost artifact).

Faults:

- ``engine-lost``: docker: a private Docker daemon of the suite (its own socket, data-root and
  exec-root under a temporary directory; never the shared one) is stopped a few seconds into the
  agent and started again 3 s later; local: the sandbox's keeper (its pid 1) is SIGKILLed from outside.
- ``engine-gone`` (docker, full run): the private daemon stays down until the run has ended: cleanup
  cannot be confirmed (exit 4) and ``sweep`` removes the container once the daemon is back.
- ``runs-dir-full``: ``--runs-dir`` is a 600 KB tmpfs (needs root to mount).
- ``cache-corrupt``: the cached OpenCode binary has wrong bytes (same size); a loopback npm mirror
  serves the genuine package for the re-fetch.
- ``registry-down``: a cold install (empty cache) against a closed loopback port;
  ``registry-stall`` (full run): against a listener that accepts and never answers.
- ``model-refused``: a real loopback endpoint (``--model-url``) goes away after two good calls (its
  listener closed: connections refused).
- ``model-*``: the scripted endpoint answers 500 on every turn, stalls past the stall timeout, sends
  a malformed stream, or cuts the connection mid-stream after one good call; ``model-429`` recovers.
- ``controller-kill``: the CLI is SIGKILLed mid-agent; the next run in the same runs directory must
  report the orphan as ``run_interrupted`` and ``sweep --run`` must find its sandbox.

Usage: ``python3 benchmarks/faults.py [--quick] [--json] [--only NAME...]``. ``--quick`` (CI) runs the
engine, runs-dir and registry faults on both providers, and the cache, controller and two model
faults on local. Exit status 0 when every row holds its expectation.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
SAMPLES = ROOT / "sample_tasks"
IMAGE = "opencode-tui/base:bookworm"
LABEL_OWNER = "opencode-tui.owner"
CLI = [sys.executable, "-m", "opencode_tui.cli"]
ROW_TIMEOUT_S = 240.0  # a row that takes longer is reported as a hang
PHASE_TIMEOUT_S = 120.0


# ---- the private Docker daemon ------------------------------------------------------------------


class PrivateDockerd:
    """A second dockerd for faults that stop the engine: its own socket, data-root and exec-root under
    ``base`` (so it starts its own containerd), no bridge, no iptables. Only this daemon is ever
    stopped, by the PID it was started with."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.sock = base / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 60.0) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        log = (self.base / f"dockerd-{self.starts}.log").open("wb")
        self.starts += 1
        self.proc = subprocess.Popen(
            [
                "dockerd",
                "--bridge=none",
                "--iptables=false",
                "--ip-masq=false",
                "-H",
                self.host,
                "--data-root",
                str(self.base / "data"),
                "--exec-root",
                str(self.base / "exec"),
                "--pidfile",
                str(self.base / "dockerd.pid"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the private dockerd exited early (see {self.base})")
            if self.docker("info", timeout=10).returncode == 0:
                return
            time.sleep(0.3)
        raise RuntimeError(f"the private dockerd did not answer within {timeout:g}s")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM, as a service manager would: dockerd stops its containers on the way down."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def docker(self, *args: str, timeout: float = 60.0, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "-H", self.host, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kw,
        )

    def load_image(self, image: str = IMAGE) -> None:
        if self.docker("image", "inspect", image).returncode == 0:
            return
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
        load = subprocess.run(
            ["docker", "-H", self.host, "load"],
            stdin=save.stdout,
            capture_output=True,
            timeout=300,
            check=False,
        )
        save.wait(60)
        if load.returncode != 0:
            raise RuntimeError(f"loading {image} into the private dockerd failed: {load.stderr!r}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.proc is not None and self.proc.poll() is None:
                ids = self.docker("ps", "-aq", timeout=30).stdout.split()
                if ids:
                    self.docker("rm", "-f", *ids, timeout=60)
        self.stop()
        # Overlay mounts of a daemon that died hard would make the data-root undeletable: best effort.
        shutil.rmtree(self.base, ignore_errors=True)


# ---- a loopback npm mirror serving the genuine OpenCode package ------------------------------------


class Mirror:
    """Serves ``/<package>/<version>`` metadata and one tarball built from a genuine cached binary."""

    def __init__(self, package: str, version: str, tarball: bytes) -> None:
        self.package, self.version, self.tarball = package, version, tarball
        digest = base64.b64encode(hashlib.sha512(tarball).digest()).decode()
        self.integrity = f"sha512-{digest}"
        self.requests: list[str] = []
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                mirror.requests.append(self.path)
                if self.path == f"/{package}/{version}":
                    body = json.dumps(
                        {
                            "name": package,
                            "version": version,
                            "dist": {"tarball": f"{mirror.url}/{package}.tgz", "integrity": mirror.integrity},
                        }
                    ).encode()
                    ctype = "application/json"
                elif self.path == f"/{package}.tgz":
                    body, ctype = mirror.tarball, "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def real_cache() -> Path:
    from opencode_tui_core.runtime.installer import default_cache_dir

    return default_cache_dir()


def genuine_entry() -> tuple[Path, dict[str, Any]]:
    """The real cache's entry for the pinned x64 package (populated by an earlier run)."""
    from opencode_tui_core.runtime.installer import DEFAULT_OPENCODE_VERSION

    entry = real_cache() / DEFAULT_OPENCODE_VERSION / "opencode-linux-x64"
    meta = json.loads((entry / "meta.json").read_text())
    return entry, meta


def package_tarball(binary: Path) -> bytes:
    """An npm-style tarball holding ``package/bin/opencode`` (gzip level 1: built in seconds)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        tf.add(str(binary), arcname="package/bin/opencode")
    return gzip.compress(raw.getvalue(), compresslevel=1)


# ---- one row ----------------------------------------------------------------------------------------


@dataclass
class Expect:
    outcome: str
    kinds: tuple[str | None, ...]  # the failure kinds that are right (a race may pick either)
    exit_code: int
    proof: str | None  # cleanup proof; None: not checked


@dataclass
class Row:
    fault: str
    provider: str
    outcome: str = "-"
    kind: str | None = None
    policy: str = "-"  # what the default policy does with this failure on a batch's first attempt
    exit_code: int | None = None
    cleanup: str = "-"
    leaked: int = 0
    lost: int = 0
    seconds: float = 0.0
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Ctx:
    """What a row's injector may use."""

    fault: str
    provider: str
    tmp: Path
    runs: Path
    env: dict[str, str]
    owner: str
    suite: Suite
    proc: subprocess.Popen[str] | None = None
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # merged into the row's config file
    endpoint: Any = None  # a model endpoint of the row's own (model-refused)


def _events(runs: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(runs.glob("*/events.jsonl")):
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    yield json.loads(line)


def _seen(ctx: Ctx) -> str:
    """What the row's run had recorded so far: its phases and failures (for a row's problem line)."""
    events = list(_events(ctx.runs))
    phases = [e.get("phase") for e in events if e.get("type") == "phase"]
    # A failure's own words too: a row that fails in CI must be explainable from its log alone.
    failures = [
        f"{e['failure'].get('kind')}@{e['failure'].get('stage')}: {str(e['failure'].get('message'))[:300]!r}"
        for e in events
        if e.get("type") == "failure"
    ]
    warm = [e for e in events if e.get("type") == "warm_sandbox"]
    code = ctx.proc.poll() if ctx.proc is not None else None
    return (
        f"phases {' > '.join(map(str, phases)) or 'none'}; failures {', '.join(failures) or 'none'}"
        + (f"; a prepared sandbox (server ahead: {warm[0].get('server_ahead')})" if warm else "")
        + ("" if code is None else f"; the CLI exited {code}")
    )


def wait_for_phase(ctx: Ctx, phase: str, timeout: float = PHASE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.get("type") == "phase" and e.get("phase") == phase for e in _events(ctx.runs)):
            return
        if ctx.proc is not None and ctx.proc.poll() is not None:
            raise RuntimeError(f"the run ended before reaching {phase} ({_seen(ctx)})")
        time.sleep(0.1)
    raise RuntimeError(f"phase {phase} never reached within {timeout:g}s ({_seen(ctx)})")


# Files that shrink by design: temporaries renamed into place, SQLite's WAL and shared memory (a
# checkpoint truncates them into the database file).
_REWRITTEN = (".tmp", "-wal", "-shm", "-journal")


class _Sampler:
    """Snapshots every file of the runs directory while the run goes on: the largest size seen per file."""

    def __init__(self, runs: Path) -> None:
        self.runs = runs
        self.seen: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.2)

    def sample(self) -> None:
        with contextlib.suppress(OSError):
            for p in self.runs.rglob("*"):
                with contextlib.suppress(OSError):
                    if p.is_file() and not p.name.endswith(_REWRITTEN):
                        self.seen[p] = max(self.seen.get(p, 0), p.stat().st_size)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def lost(self) -> list[str]:
        out = []
        for p, size in self.seen.items():
            try:
                now = p.stat().st_size
            except OSError:
                now = -1
            if now < size:
                out.append(f"{p.relative_to(self.runs)} ({size} -> {max(now, 0)} bytes)")
        return out


def _first_attempt_action(kind: str | None, stage: str | None, http_status: int | None = None) -> str:
    if kind is None or stage is None:
        return "-"
    from opencode_tui_core.failures import DEFAULT_POLICY, FailureEvent, decide

    failure = FailureEvent(
        kind=kind, stage=stage, operation="fault suite", message=kind, http_status=http_status
    )
    return decide(failure, attempt=1, policy=DEFAULT_POLICY).action.value


def docker_leftovers(owner: str, host: str | None = None) -> list[str]:
    base = ["docker", *(["-H", host] if host else [])]
    r = subprocess.run(
        [*base, "ps", "-aq", "--filter", f"label={LABEL_OWNER}={owner}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return r.stdout.split()


def local_leftovers(state: Path) -> list[str]:
    base = state / "opencode-tui" / "local"
    return (
        sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
        if base.exists()
        else []
    )


@dataclass
class Fault:
    name: str
    providers: tuple[str, ...]
    task: str | Callable[[Ctx], Path]
    expect: Expect | None  # None: ``after`` judges the row
    inject: Callable[[Ctx], None] | None = None  # runs while the CLI runs (in this thread)
    prepare: Callable[[Ctx], None] | None = None  # before the CLI starts: config, env, runs dir
    after: Callable[[Ctx, Row, dict[str, Any]], None] | None = None  # extra checks on the result
    config: dict[str, Any] = field(default_factory=dict)
    quick: tuple[str, ...] = ()  # providers run by --quick


class Suite:
    def __init__(self, base: Path) -> None:
        self.base = base
        self._dockerd: PrivateDockerd | None = None
        self._dockerd_lock = threading.Lock()
        self._mirror: Mirror | None = None
        self._mirror_lock = threading.Lock()
        self.cleanups: list[Callable[[], None]] = []

    def dockerd(self) -> PrivateDockerd:
        with self._dockerd_lock:
            if self._dockerd is None:
                d = PrivateDockerd(Path(tempfile.mkdtemp(prefix="faults-dockerd-", dir="/tmp")))
                self._dockerd = d
                d.start()
                d.load_image()
            return self._dockerd

    def mirror(self) -> Mirror:
        with self._mirror_lock:
            if self._mirror is None:
                entry, meta = genuine_entry()
                self._mirror = Mirror(meta["package"], meta["version"], package_tarball(entry / "opencode"))
            return self._mirror

    def close(self) -> None:
        for fn in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                fn()
        if self._mirror is not None:
            self._mirror.close()
        if self._dockerd is not None:
            self._dockerd.close()

    def run_row(self, fault: Fault, provider: str) -> Row:
        row = Row(fault=fault.name, provider=provider)
        tmp = Path(tempfile.mkdtemp(prefix=f"{fault.name}-{provider}-", dir=self.base))
        owner = f"faults-{os.getpid()}-{fault.name}-{provider}"
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep),
            "OPENCODE_TUI_OWNER": owner,
            "XDG_STATE_HOME": str(tmp / "state"),
        }
        ctx = Ctx(fault.name, provider, tmp, tmp / "runs", env, owner, self)
        started = time.monotonic()
        try:
            self._run(fault, ctx, row)
        except Exception as exc:  # a harness problem is a failed row, never a crashed suite
            row.problems.append(f"suite: {type(exc).__name__}: {exc} ({_seen(ctx)})")
        finally:
            try:
                if ctx.proc is not None and ctx.proc.poll() is None:
                    ctx.proc.kill()
                    ctx.proc.wait(30)
                self._count_and_remove_leftovers(ctx, row)
            except Exception as exc:
                row.problems.append(f"suite: cleaning up after the row: {type(exc).__name__}: {exc}")
        row.seconds = round(time.monotonic() - started, 1)
        row.notes.extend(ctx.notes)
        row.ok = not row.problems
        return row

    def _run(self, fault: Fault, ctx: Ctx, row: Row) -> None:
        # One attempt per row (--attempts 1, so a retryable fault ends as an evaluation error); the
        # policy@1 column says what the default policy does with it on a batch's first attempt.
        config: dict[str, Any] = {"sandbox": {"provider": ctx.provider}}
        ctx.runs.mkdir(parents=True, exist_ok=True)
        if fault.prepare is not None:
            fault.prepare(ctx)
        for extra in (fault.config, ctx.config):
            for key, value in extra.items():
                config.setdefault(key, {}).update(value)
        (ctx.tmp / "config.yaml").write_text(yaml.safe_dump(config))
        task = fault.task(ctx) if callable(fault.task) else SAMPLES / fault.task
        argv = [*CLI, "run", str(task), "--batch", "--attempts", "1", "--provider", ctx.provider]
        argv += ["--runs-dir", str(ctx.runs), "--config", str(ctx.tmp / "config.yaml")]
        with _Sampler(ctx.runs) as sampler:
            ctx.proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ctx.env, cwd=ctx.tmp
            )
            out_err: dict[str, str] = {}
            reader = threading.Thread(
                target=lambda: out_err.update(zip(("out", "err"), ctx.proc.communicate(), strict=True))
            )
            reader.start()
            if fault.inject is not None:
                fault.inject(ctx)
            reader.join(ROW_TIMEOUT_S)
            if reader.is_alive():
                row.problems.append(f"hang: the run did not end within {ROW_TIMEOUT_S:g}s")
                ctx.proc.kill()
                reader.join(30)
            sampler.sample()
        lost = sampler.lost()
        row.lost = len(lost)
        if lost:
            row.problems.append("lost artifacts: " + ", ".join(lost[:3]))
        stdout, stderr = out_err.get("out", ""), out_err.get("err", "")
        if _traceback_header(stderr) is not None:
            row.problems.append("a traceback on stderr: " + _traceback_summary(stderr))
        lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
        result = lines[-1] if lines else {}
        if ctx.proc.returncode is not None and ctx.proc.returncode >= 0:
            row.exit_code = ctx.proc.returncode
        row.outcome = result.get("action", "-")
        row.kind = result.get("failure_kind")
        proof = result.get("cleanup_proof")
        deciding = next(
            (
                e["failure"]
                for e in _events(ctx.runs)
                if e.get("type") == "failure" and e["failure"].get("kind") == row.kind
            ),
            {},
        )
        row.policy = _first_attempt_action(row.kind, result.get("failure_stage"), deciding.get("http_status"))
        row.cleanup = proof or ("unconfirmed" if result.get("cleanup_confirmed") is False else "-")
        expect = fault.expect
        if expect is not None:
            got = (row.outcome, row.kind, row.exit_code)
            if (row.outcome, row.exit_code) != (
                expect.outcome,
                expect.exit_code,
            ) or row.kind not in expect.kinds:
                want = (expect.outcome, "|".join(map(str, expect.kinds)), expect.exit_code)
                said = result.get("summary") or stderr.strip()[-300:]
                why = deciding.get("message")
                row.problems.append(
                    f"expected {want}, got {got}: {said}"
                    + (f" ({why[:400]})" if why else "")
                    + f"; {_seen(ctx)}"
                )
            if expect.proof is not None and proof != expect.proof:
                row.problems.append(f"expected cleanup proof {expect.proof}, got {proof}")
        if result.get("reward") is not None and row.kind is not None and expect.outcome != "scored":
            row.problems.append(f"a reward ({result['reward']}) from a fault")
        if fault.after is not None:
            fault.after(ctx, row, result)

    def _count_and_remove_leftovers(self, ctx: Ctx, row: Row) -> None:
        if ctx.provider == "docker":
            host = ctx.env.get("DOCKER_HOST")
            left = docker_leftovers(ctx.owner, host)
            if left:
                subprocess.run(
                    ["docker", *(["-H", host] if host else []), "rm", "-f", *left],
                    capture_output=True,
                    timeout=60,
                    check=False,
                )
        else:
            left = local_leftovers(Path(ctx.env["XDG_STATE_HOME"]))
            if left:
                subprocess.run(
                    [*CLI, "sweep", "--provider", "local", "--kept", *left],
                    capture_output=True,
                    timeout=120,
                    env=ctx.env,
                    check=False,
                )
        row.leaked = len(left)
        if left:
            row.problems.append(f"leaked sandboxes: {left}")


# ---- the faults -------------------------------------------------------------------------------------


def _engine_prepare(ctx: Ctx) -> None:
    if ctx.provider == "docker":
        ctx.env["DOCKER_HOST"] = ctx.suite.dockerd().host


def _engine_inject(ctx: Ctx) -> None:
    wait_for_phase(ctx, "agent")
    time.sleep(4.0)  # OpenCode is working by now
    if ctx.provider == "docker":
        d = ctx.suite.dockerd()
        down = time.monotonic()
        d.stop()
        time.sleep(3.0)
        d.start()
        ctx.notes.append(f"dockerd stopped for {time.monotonic() - down:.1f}s")
        return
    ids = {e["sandbox_id"] for e in _events(ctx.runs) if e.get("type") == "sandbox" and e.get("sandbox_id")}
    if len(ids) != 1:
        raise RuntimeError(f"expected the run's one sandbox, saw {sorted(ids)} ({_seen(ctx)})")
    [sandbox_id] = ids
    label = Path(ctx.env["XDG_STATE_HOME"]) / "opencode-tui" / "local" / sandbox_id / "sandbox.json"
    keeper = json.loads(label.read_text())["keeper"]
    os.kill(int(keeper["pid"]), signal.SIGKILL)
    ctx.notes.append(f"keeper pid {keeper['pid']} SIGKILLed")


def _engine_gone_inject(ctx: Ctx) -> None:
    """The private dockerd stopped mid-agent and started again only after the run has ended."""
    wait_for_phase(ctx, "agent")
    time.sleep(4.0)
    d = ctx.suite.dockerd()
    d.stop()
    deadline = time.monotonic() + ROW_TIMEOUT_S
    while ctx.proc is not None and ctx.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    d.start()


def _engine_gone_after(ctx: Ctx, row: Row, result: dict[str, Any]) -> None:
    """Nothing could be confirmed or removed: the container is left for ``sweep``, which finds it
    once the engine is back."""
    left = docker_leftovers(ctx.owner, ctx.env["DOCKER_HOST"])
    sweep = subprocess.run(
        [*CLI, "sweep", "--provider", "docker"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ctx.env,
        check=False,
    )
    row.cleanup = f"{row.cleanup}; sweep ({len(left)} found)"
    if sweep.returncode != 0:
        row.problems.append(f"sweep failed: {sweep.stderr.strip()[-200:]}")


def _tmpfs(ctx: Ctx, size: str) -> Path:
    if os.geteuid() != 0:
        raise RuntimeError("mounting a tmpfs needs root")
    target = ctx.tmp / "disk"
    target.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)], check=True, timeout=30
    )
    ctx.suite.cleanups.append(lambda: subprocess.run(["umount", "-l", str(target)], check=False, timeout=30))
    return target


def _runs_full_prepare(ctx: Ctx) -> None:
    ctx.runs = _tmpfs(ctx, "600k")


def _runs_full_after(ctx: Ctx, row: Row, result: dict[str, Any]) -> None:
    run_dir = Path(result.get("run_dir") or "/nonexistent")
    if not (run_dir / "events.jsonl").exists() or (run_dir / "events.jsonl").stat().st_size == 0:
        row.problems.append("events.jsonl written before the disk filled is gone")
    if not result.get("artifacts_error"):
        row.problems.append("the batch line does not say what the run directory refused")


def _cache_prepare(ctx: Ctx) -> None:
    """A copy of the genuine cache whose binary has wrong bytes of the same size."""
    entry, meta = genuine_entry()
    cache = ctx.tmp / "cache"
    dest = cache / meta["version"] / entry.name
    dest.mkdir(parents=True)
    shutil.copy2(entry / "meta.json", dest / "meta.json")
    good_size = (entry / "opencode").stat().st_size
    # If anything ran it, the version check would fail naming this text.
    head = b"#!/bin/sh\necho corrupt-opencode-6.6.6\nexit 0\n"
    with (dest / "opencode").open("wb") as f:
        f.write(head)
        f.truncate(good_size)
    os.chmod(dest / "opencode", 0o755)
    rg = real_cache() / "ripgrep"
    if rg.exists():
        shutil.copytree(rg, cache / "ripgrep")
    mirror = ctx.suite.mirror()
    ctx.config["runtime"] = {"cache_dir": str(cache), "registry_url": mirror.url}


def _cache_after(ctx: Ctx, row: Row, result: dict[str, Any]) -> None:
    events = list(_events(ctx.runs))
    said = [e for e in events if e.get("type") == "warning" and e.get("code") == "opencode_cache_corrupt"]
    fetched = [e for e in events if e.get("type") == "install_progress" and e.get("cached") is False]
    if not said:
        row.problems.append("the corrupt cache was not reported (no opencode_cache_corrupt warning)")
    if not fetched:
        row.problems.append("the binary was not fetched again")
    if any("corrupt-opencode" in json.dumps(e) for e in events):
        row.problems.append("the corrupt binary was executed")
    row.cleanup = f"{row.cleanup}; re-fetched" if fetched else row.cleanup


_TRACEBACK = "Traceback (most recent call last):"


def _traceback_header(stderr: str) -> int | None:
    """The line where a Python traceback of the CLI starts, if any. Only a line that begins with the
    header counts: the word inside a quoted message (a command's output, a failure's excerpt) is no
    crash of ours, and taking it for one both failed a row that held and then broke the summary."""
    return next((i for i, line in enumerate(stderr.splitlines()) if line.startswith(_TRACEBACK)), None)


def _traceback_summary(stderr: str) -> str:
    """The line logged before the first traceback and the exception it ends with: enough to know what
    broke from CI's log alone (the row's directory is gone by then)."""
    lines = stderr.splitlines()
    at = _traceback_header(stderr)
    if at is None:
        return "no traceback"
    before = lines[at - 1].strip() if at > 0 else ""
    raised = next((line for line in lines[at + 1 :] if line and not line.startswith(" ")), "?")
    return f"{before[:200]} → {raised[:300]}" if before else raised[:300]


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there any more: connections are refused
    return port


def _registry_down_prepare(ctx: Ctx) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    ctx.config["runtime"] = {"cache_dir": str(ctx.tmp / "cold-cache"), "registry_url": url}


def _registry_stall_prepare(ctx: Ctx) -> None:
    stall = socket.socket()
    stall.bind(("127.0.0.1", 0))
    stall.listen(16)  # handshakes complete into the backlog; nobody ever reads or answers
    ctx.suite.cleanups.append(stall.close)
    url = f"http://127.0.0.1:{stall.getsockname()[1]}"
    ctx.config["runtime"] = {"cache_dir": str(ctx.tmp / "cold-cache"), "registry_url": url}
    ctx.config["budgets"] = {"install_s": 8}


def _registry_after(ctx: Ctx, row: Row, result: dict[str, Any]) -> None:
    failures = [e for e in _events(ctx.runs) if e.get("type") == "failure"]
    if not failures or "127.0.0.1" not in failures[0]["failure"]["message"]:
        row.problems.append("the install failure does not name the registry")


def _model_task(fault: dict[str, Any], *, good_steps: int = 0) -> Callable[[Ctx], Path]:
    """hello-file whose scripted model fails as ``fault`` says on every turn after ``good_steps``."""

    def make(ctx: Ctx) -> Path:
        task = ctx.tmp / "task"
        shutil.copytree(SAMPLES / "hello-file", task)
        steps = yaml.safe_load((task / "trajectory.yaml").read_text())["steps"]
        steps[good_steps]["fault"] = {**fault, "times": 1000}
        (task / "trajectory.yaml").write_text(yaml.safe_dump({"title": "Write hello.txt", "steps": steps}))
        return task

    return make


class _Endpoint:
    """The scripted model as a real loopback OpenAI-compatible endpoint (``--model-url``), served from
    a thread of its own, that the suite can take away."""

    def __init__(self, trajectory: Path) -> None:
        import asyncio

        from opencode_tui_core.model.scripted import ScriptedModel

        self.loop = asyncio.new_event_loop()
        self.model = ScriptedModel(trajectory, placeholders={"workdir": "/app"})
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.model.start(), self.loop).result(30)
        self.url = self.model.url
        self.closed = False

    def close(self) -> None:
        import asyncio

        if not self.closed:
            self.closed = True
            asyncio.run_coroutine_threadsafe(self.model.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _refused_prepare(ctx: Ctx) -> None:
    endpoint = _Endpoint(SAMPLES / "hello-file" / "trajectory.yaml")
    ctx.suite.cleanups.append(endpoint.close)
    ctx.config["model"] = {"url": endpoint.url, "name": "scripted"}
    ctx.endpoint = endpoint


def _refused_inject(ctx: Ctx) -> None:
    """After two good calls (the title and the first agent turn) the endpoint goes away: its listener
    is closed, so every later connection is refused."""
    endpoint = ctx.endpoint
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while len(endpoint.model.calls) < 2 and time.monotonic() < deadline:
        if ctx.proc is not None and ctx.proc.poll() is not None:
            return
        time.sleep(0.05)
    import asyncio

    asyncio.run_coroutine_threadsafe(endpoint.model.close(), endpoint.loop).result(30)
    endpoint.closed = True
    ctx.notes.append(f"endpoint closed after {len(endpoint.model.calls)} calls")


def _kill_inject(ctx: Ctx) -> None:
    wait_for_phase(ctx, "agent")
    time.sleep(3.0)
    assert ctx.proc is not None
    ctx.proc.kill()  # SIGKILL: no close, no record


def _kill_after(ctx: Ctx, row: Row, result: dict[str, Any]) -> None:
    """The next run in the same runs directory reports the orphan; sweep --run finds its sandbox."""
    dirs = [p for p in ctx.runs.iterdir() if p.is_dir()]
    if len(dirs) != 1:
        raise RuntimeError(f"expected the killed run's one directory, saw {[p.name for p in dirs]}")
    [orphan] = dirs
    left_before = (
        docker_leftovers(ctx.owner)
        if ctx.provider == "docker"
        else local_leftovers(Path(ctx.env["XDG_STATE_HOME"]))
    )
    nxt = subprocess.run(
        [
            *CLI,
            "run",
            str(SAMPLES / "hello-file"),
            "--batch",
            "--provider",
            ctx.provider,
            "--runs-dir",
            str(ctx.runs),
        ],
        capture_output=True,
        text=True,
        timeout=ROW_TIMEOUT_S,
        env=ctx.env,
        cwd=ctx.tmp,
        check=False,
    )
    info = json.loads((orphan / "run.json").read_text())
    outcome = info.get("outcome") or {}
    row.outcome, row.kind = outcome.get("action", "-"), outcome.get("failure_kind")
    row.exit_code = nxt.returncode
    said = [line for line in nxt.stderr.splitlines() if orphan.name in line]
    if len(said) != 1 or "interrupted" not in said[0]:
        row.problems.append(f"the next run did not report the orphan: {nxt.stderr.strip()[-300:]}")
    if not left_before:
        row.notes.append("no sandbox was left by the kill")
    sweep = subprocess.run(
        [*CLI, "sweep", "--provider", ctx.provider, "--run", orphan.name],
        capture_output=True,
        text=True,
        timeout=120,
        env=ctx.env,
        check=False,
    )
    row.cleanup = (
        f"sweep ({len(left_before)} found)"
        if sweep.returncode == 0
        else f"sweep failed: {sweep.stderr[-200:]}"
    )
    if sweep.returncode != 0:
        row.problems.append(row.cleanup)
    want = ("keep_unknown", "run_interrupted", 0)
    if (row.outcome, row.kind, row.exit_code) != want:
        row.problems.append(f"expected {want}, got {(row.outcome, row.kind, row.exit_code)}")


def _same(outcome: str, kind: str | None, code: int, proof: str | None, *also: str) -> Expect:
    return Expect(outcome, (kind, *also), code, proof)


BOTH = ("docker", "local")

FAULTS: list[Fault] = [
    Fault(
        "engine-lost",
        BOTH,
        "timeout",
        _same("mark_evaluation_error", "sandbox_engine_lost", 3, "found_dead"),
        inject=_engine_inject,
        prepare=_engine_prepare,
        quick=BOTH,
    ),
    # The engine does not come back within the close budget: nothing can be confirmed (exit 4).
    Fault(
        "engine-gone",
        ("docker",),
        "timeout",
        _same("mark_evaluation_error", "sandbox_engine_lost", 4, None),
        inject=_engine_gone_inject,
        prepare=_engine_prepare,
        after=_engine_gone_after,
        config={"budgets": {"close_s": 12}},
    ),
    Fault(
        "runs-dir-full",
        BOTH,
        "fix-bug",
        _same("mark_evaluation_error", "artifacts_write_failed", 3, "receipt"),
        prepare=_runs_full_prepare,
        after=_runs_full_after,
        quick=BOTH,
    ),
    Fault(
        "cache-corrupt",
        BOTH,
        "hello-file",
        _same("scored", None, 0, "receipt"),
        prepare=_cache_prepare,
        after=_cache_after,
        quick=("local",),
    ),
    Fault(
        "registry-down",
        BOTH,
        "hello-file",
        _same("mark_evaluation_error", "install_registry_unreachable", 3, "nothing_launched"),
        prepare=_registry_down_prepare,
        after=_registry_after,
        quick=BOTH,
    ),
    Fault(
        "registry-stall",
        BOTH,
        "hello-file",
        _same(
            "mark_evaluation_error", "install_timeout", 3, "nothing_launched", "install_registry_unreachable"
        ),
        prepare=_registry_stall_prepare,
    ),
    Fault("model-429", BOTH, "model-flaky-429", _same("scored", None, 0, "receipt")),
    Fault(
        "model-500",
        BOTH,
        "model-flaky-500",
        _same("mark_evaluation_error", "model_server_error", 3, "receipt"),
        quick=("local",),
    ),
    Fault(
        "model-stall",
        BOTH,
        _model_task({"stall": 30}),
        _same("mark_evaluation_error", "model_stalled", 3, "receipt"),
        config={"model": {"stall_timeout_s": 3}},
    ),
    Fault(
        "model-malformed",
        BOTH,
        _model_task({"malformed": True}),
        _same("mark_evaluation_error", "model_malformed_response", 3, "receipt"),
        quick=("local",),
    ),
    # The connection is cut mid-stream after one good call: the proxy records a stream that ended early
    # (``model_stalled``; a refused connection would be ``model_unreachable``).
    Fault(
        "model-stream-cut",
        BOTH,
        _model_task({"drop": True}, good_steps=1),
        _same("mark_evaluation_error", "model_stalled", 3, "receipt"),
    ),
    Fault(
        "model-refused",
        BOTH,
        "hello-file",
        _same("mark_evaluation_error", "model_unreachable", 3, "receipt"),
        prepare=_refused_prepare,
        inject=_refused_inject,
    ),
    Fault(
        "controller-kill",
        BOTH,
        "timeout",
        None,  # judged by _kill_after (the next run's report)
        inject=_kill_inject,
        after=_kill_after,
        quick=("local",),
    ),
]


# ---- the table --------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    head = (
        "fault",
        "provider",
        "outcome",
        "failure kind",
        "policy@1",
        "exit",
        "cleanup / proof",
        "leaked",
        "lost",
        "s",
        "ok",
    )
    body = [
        (
            r.fault,
            r.provider,
            r.outcome,
            r.kind or "-",
            r.policy,
            "-" if r.exit_code is None else str(r.exit_code),
            r.cleanup,
            str(r.leaked),
            str(r.lost),
            f"{r.seconds:.0f}",
            "yes" if r.ok else "NO",
        )
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*b) for b in body]
    ok = sum(r.ok for r in rows)
    lines.append(
        f"totals: {len(rows)} rows, {ok} held, {len(rows) - ok} did not; "
        f"leaked sandboxes {sum(r.leaked for r in rows)}, lost artifacts {sum(r.lost for r in rows)}, "
        f"tracebacks {sum(any('traceback' in p for p in r.problems) for r in rows)}"
    )
    for r in rows:
        for p in r.problems:
            lines.append(f"  {r.fault}/{r.provider}: {p}")
    return "\n".join(lines)


def failed_lines(rows: list[Row]) -> list[str]:
    """One line per row that did not hold: the row, and what it saw (its problems)."""
    return [
        f"faults: FAILED {r.fault}/{r.provider}: {'; '.join(r.problems) or 'no problem recorded'}"
        for r in rows
        if not r.ok
    ]


def selected(quick: bool, only: list[str] | None) -> list[tuple[Fault, str]]:
    out = []
    for fault in FAULTS:
        if only and fault.name not in only:
            continue
        for provider in fault.quick if quick and not only else fault.providers:
            out.append((fault, provider))
    return out


def run(quick: bool = False, only: list[str] | None = None, jobs: int = 3) -> list[Row]:
    base = Path(tempfile.mkdtemp(prefix="opencode-tui-faults-"))
    suite = Suite(base)
    pairs = selected(quick, only)
    try:
        # The private dockerd is one engine: its rows run one at a time, the others alongside.
        private = [p for p in pairs if p[0].name.startswith("engine-") and p[1] == "docker"]
        rest = [p for p in pairs if p not in private]
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(lambda ps=private: [suite.run_row(f, p) for f, p in ps])]
            futures += [pool.submit(lambda f=f, p=p: [suite.run_row(f, p)]) for f, p in rest]
            done: dict[tuple[str, str], Row] = {}
            for fut in futures:
                try:
                    done.update({(r.fault, r.provider): r for r in fut.result()})
                except Exception as exc:  # never lose the table (and which rows held) to one row
                    print(f"faults: a row crashed the suite: {type(exc).__name__}: {exc}", file=sys.stderr)
        crashed = "suite: the row crashed before reporting (see stderr)"
        return [done.get((f.name, p)) or Row(f.name, p, problems=[crashed]) for f, p in pairs]
    finally:
        suite.close()
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the CI subset (a few minutes)")
    ap.add_argument("--json", action="store_true", help="rows as JSON instead of the table")
    ap.add_argument("--only", nargs="+", metavar="FAULT", help="these faults only (all their providers)")
    ap.add_argument("--jobs", type=int, default=3, help="rows at once (default 3)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    rows = run(quick=args.quick, only=args.only, jobs=args.jobs)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        print(table(rows))
        print(f"({time.monotonic() - started:.0f}s)")
    failed = failed_lines(rows)
    for line in failed:  # last on the output, whatever cuts it short: which row, and what it saw
        print(line, file=sys.stderr)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
