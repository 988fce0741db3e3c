"""Runtime benchmark: cold vs warm OpenCode install, and the time from "run" to OpenCode's first model call.

    python benchmarks/runtime.py              # 3 cold installs, 3 engine episodes vs 3 raw runs
    python benchmarks/runtime.py --quick      # 1 of each
    python benchmarks/runtime.py --skip-install --json out.json

0. Process start → first model call: ``opencode-tui run hello-file --batch`` spawned as a new process
   per provider (``--providers``), from just before the spawn to the earliest ``started_at`` in the
   run's ``model_calls.jsonl`` (and to the process's exit). Warm: cached binary, images present.

1. Install (controller side). Cold: ``Installer.ensure`` with an empty temporary cache, downloading
   ``opencode-linux-x64`` at the pin from the npm registry (metadata, tarball, sha512 check, extraction
   of the binary with sha256 and fsync, atomic commit). Warm: the same call on the filled cache (a cache
   hit). Baseline for the cold path: a plain httpx download of the same metadata and tarball to a file;
   the post-download steps are then timed on that file (sha512 of the tarball; extraction of
   ``package/bin/opencode`` with sha256 + fsync, using the installer's own routine).

2. Run → first model call. Engine: an Episode of ``sample_tasks/hello-file`` with the docker provider
   and the embedded scripted model behind the recording proxy; measured from the ``agent``
   PhaseChanged event to the earliest ModelCall ``started_at``. The sandbox is wrapped in a timing
   proxy (benchmarks/_bench.py) to place the staging operations and the launch exec on the same clock,
   and OpenCode's own log (collected into the run directory) gives the moment its JS started.
   Baseline: a container of the same image on host networking with the binary bind-mounted read-only
   from the installer cache, a ScriptedModel of the same trajectory on 127.0.0.1, and a plain
   ``docker exec -i <c> opencode run --format json`` (timed from the exec to the first request the
   model receives). Engine and baseline repetitions alternate.

3. Before OpenCode starts (engine): the real launch path replayed with the OpenCode binary replaced by
   a script that prints ``date +%s.%N``: (a) the supervisor alone with that script as harness, (b) the
   real harness command (relay start, relay wait loop, exec) with the real staging. This splits the
   engine's "launch → OpenCode" time into supervisor bootstrap and relay start.

The install phase of the episodes (cache hit: the probe; ``opencode --version`` only the first time a
binary meets a sandbox fingerprint) is broken down from the same timing proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _bench as B

OWNER = B.setup()

from opencode_tui_core.artifacts import RunFiles  # noqa: E402
from opencode_tui_core.config import AgentConfig, ModelSettings, SandboxConfig  # noqa: E402
from opencode_tui_core.events import EventBus, ModelCall, Phase, PhaseChanged  # noqa: E402
from opencode_tui_core.failures import Outcome  # noqa: E402
from opencode_tui_core.runtime.installer import Installer, InstallerConfig  # noqa: E402
from opencode_tui_core.runtime.targets import Target  # noqa: E402
from opencode_tui_core.tasks import load_task  # noqa: E402

TASK_DIR = B.ROOT / "sample_tasks" / "hello-file"
VERSION = "1.18.32"
PACKAGE_TARGET = Target(arch="x64")  # opencode-linux-x64
STAMP = "/tmp/octui-bench-stamp"
STAMP_OUT = "/tmp/octui-bench-stamp.out"
# The stand-in for the OpenCode binary writes its start time to a file: under the serve harness its
# stdout goes to the serve runner (which prints only JSON lines of its own), so stdout cannot carry it.
STAMP_SCRIPT = f"#!/bin/sh\ndate +%s.%N >{STAMP_OUT}\n".encode()


# ---- 1. install ----------------------------------------------------------------------------------


def raw_download(registry: str, package: str, version: str, dest: Path) -> dict[str, Any]:
    import httpx

    t0 = time.perf_counter()
    with httpx.Client(follow_redirects=True, headers={"accept-encoding": "identity"}, timeout=60) as c:
        meta = c.get(f"{registry}/{package}/{version}", headers={"accept": "application/json"}).json()
        url = meta["dist"]["tarball"]
        size = 0
        with c.stream("GET", url) as r, open(dest, "wb") as f:
            r.raise_for_status()
            for chunk in r.iter_bytes():
                f.write(chunk)
                size += len(chunk)
    return {
        "wall": time.perf_counter() - t0,
        "bytes": size,
        "url": url,
        "integrity": meta["dist"]["integrity"],
    }


def post_download_steps(tarball: Path, integrity: str, url: str) -> dict[str, float]:
    """The installer's own verification and extraction routines, timed on a downloaded tarball."""
    tmp = Path(tempfile.mkdtemp(prefix="octui-bench-extract-"))
    try:
        inst = Installer(InstallerConfig(version=VERSION, cache_dir=tmp))
        t0 = time.perf_counter()
        Installer._digest_file(tarball, integrity)
        t1 = time.perf_counter()
        inst._extract_binary(tarball, tmp / "opencode", PACKAGE_TARGET, url)
        t2 = time.perf_counter()
        return {"sha512": t1 - t0, "extract": t2 - t1}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def bench_install(reps: int, warm_reps: int, rep: B.Report) -> dict[str, Any]:
    registry = InstallerConfig().registry_url
    cold: list[float] = []
    raw: list[float] = []
    sha: list[float] = []
    extract: list[float] = []
    sizes: dict[str, int] = {}
    warm: list[float] = []
    keep: Path | None = None
    try:
        for i in range(reps):
            rep.progress(f"install: cold {i + 1}/{reps}")
            cache = Path(tempfile.mkdtemp(prefix="octui-bench-cache-"))
            inst = Installer(InstallerConfig(version=VERSION, cache_dir=cache))
            t0 = time.perf_counter()
            got = await inst.ensure(PACKAGE_TARGET)
            cold.append(time.perf_counter() - t0)
            if not got.downloaded:
                raise RuntimeError("the cold install did not download")
            sizes["binary_bytes"] = got.size
            if keep is not None:
                shutil.rmtree(keep, ignore_errors=True)
            keep = cache
            rep.progress(f"install: raw download {i + 1}/{reps}")
            dl_dir = Path(tempfile.mkdtemp(prefix="octui-bench-dl-"))
            try:
                d = await asyncio.to_thread(
                    raw_download, registry, PACKAGE_TARGET.package_name, VERSION, dl_dir / "t.tgz"
                )
                raw.append(d["wall"])
                sizes["tarball_bytes"] = d["bytes"]
                steps = await asyncio.to_thread(
                    post_download_steps, dl_dir / "t.tgz", d["integrity"], d["url"]
                )
                sha.append(steps["sha512"])
                extract.append(steps["extract"])
            finally:
                shutil.rmtree(dl_dir, ignore_errors=True)
        # Warm: the same call on the cache the last cold install filled (a cache hit).
        cache = keep or B.cached_binary_dir(VERSION).parents[1]
        inst = Installer(InstallerConfig(version=VERSION, cache_dir=cache))
        for _ in range(warm_reps):
            t0 = time.perf_counter()
            got = await inst.ensure(PACKAGE_TARGET)
            warm.append(time.perf_counter() - t0)
            if got.downloaded:
                raise RuntimeError("the warm install downloaded")
    finally:
        if keep is not None:
            shutil.rmtree(keep, ignore_errors=True)
    return {"cold": cold, "warm": warm, "raw_download": raw, "sha512": sha, "extract": extract, **sizes}


# ---- 2. run → first model call -------------------------------------------------------------------


def _ts(dt: Any) -> float:
    return dt.timestamp()


async def engine_episode(task: Any, config: AgentConfig, runs_dir: Path) -> dict[str, Any]:
    from opencode_tui_core.episode import Episode
    from opencode_tui_core.sandbox.docker.provider import DockerProvider

    provider = B.make_timed_provider(DockerProvider())
    bus = EventBus()
    events: list[Any] = []
    bus.subscribe(events.append)
    ep = Episode(task, config, runs_dir=runs_dir, provider=provider, bus=bus)
    result = await ep.run()
    if result.action is not Outcome.SCORED or result.reward != 1.0:
        raise RuntimeError(f"the engine episode did not score: {result.summary} ({result.run_dir})")
    ops = provider.logs[-1].ops
    phase = {e.phase: _ts(e.ts) for e in events if isinstance(e, PhaseChanged)}
    calls = sorted((e for e in events if isinstance(e, ModelCall)), key=lambda e: e.started_at)
    launch = next(o for o in ops if o.label.startswith("launch"))
    t_agent = phase[Phase.AGENT]
    staging = [o for o in ops if t_agent <= o.start < launch.start]
    session_ops = [
        o for o in staging if o.label == "session mkdir" or o.label.endswith(("/supervisor.py", "/stdin"))
    ]
    harness_ops = [o for o in staging if o not in session_ops]
    install_ops = [o for o in ops if phase[Phase.INSTALL] <= o.start < t_agent]
    return {
        "t_agent": t_agent,
        "t_launch": launch.start,
        "t_log": B.opencode_log_start(Path(result.run_dir) / RunFiles.OPENCODE_DATA),
        "t_first_call": _ts(calls[0].started_at),
        "t_last_call": _ts(calls[-1].started_at),
        "t_exit": phase[Phase.CLOSING],
        "staging_session_ops": sum(o.duration for o in session_ops),
        "staging_harness_ops": sum(o.duration for o in harness_ops),
        "staging_n_ops": len(staging),
        "staging_uploads": sum(1 for o in staging if o.kind == "upload"),
        "staging_execs": sum(1 for o in staging if o.kind == "exec"),
        "install_phase": result.durations_s.get("install"),
        "install_ops": {o.label: o.duration for o in install_ops},
        "durations_s": result.durations_s,
        "calls": len(calls),
    }


async def replica(task: Any, config: AgentConfig, variant: str, tag: str) -> dict[str, Any]:
    """The engine's launch path with the OpenCode binary replaced by a timestamp printer."""
    from opencode_tui_core.model.endpoint import ModelEndpoint
    from opencode_tui_core.runtime.opencode import OpenCodeHarness
    from opencode_tui_core.runtime.prepare import RUNTIME_CACHE_MOUNT
    from opencode_tui_core.sandbox.base import LABEL_OWNER, LABEL_RUN, Mount, NetworkPolicy, SandboxSpec
    from opencode_tui_core.sandbox.docker.provider import DockerProvider
    from opencode_tui_core.session import SandboxSession

    tmp = Path(tempfile.mkdtemp(prefix="octui-bench-replica-"))
    run_id = f"bench-replica-{tag}"
    cache_dir = B.cached_binary_dir(VERSION).parents[1]
    try:
        async with ModelEndpoint(task, config.model, tmp, on_call=lambda _e: None) as endpoint:
            spec = SandboxSpec(
                run_id=run_id,
                image=task.image,
                workdir=task.workdir,
                network=NetworkPolicy.MODEL_ONLY,
                model_socket=endpoint.unix_path,
                mounts=[Mount(source=str(cache_dir), target=RUNTIME_CACHE_MOUNT)],
                labels={LABEL_RUN: run_id, LABEL_OWNER: OWNER},
            )
            sb = await DockerProvider().create(spec)
            try:
                await sb.upload_file(STAMP, STAMP_SCRIPT, 0o755)
                log = B.OpLog()
                tsb = B.make_timed_sandbox(sb, log)
                harness = OpenCodeHarness(run_id, task, config, endpoint)
                session = SandboxSession(
                    tsb,
                    harness.layout.session_dir,
                    run_timeout_s=60,
                    close_timeout_s=30,
                    python="/usr/bin/python3",
                )
                if variant == "relay":
                    runtime = SimpleNamespace(python="/usr/bin/python3", binary=STAMP)
                    argv, env = harness.command(runtime)
                    import inspect

                    # One upload with the session's files where the engine does that (else the
                    # harness's own stage step, as older engines did).
                    staging: dict[str, Any] = (
                        {"files": harness.staged_files()}
                        if "files" in inspect.signature(SandboxSession.execute).parameters
                        else {"stage": harness.stage}
                    )
                    kw: dict[str, Any] = {
                        **staging,
                        "stdin": harness.prompt_bytes(),
                        "env": env,
                        "cwd": task.workdir,
                    }
                else:
                    argv, kw = [STAMP], {}
                t_call = time.time()
                r = await session.execute(argv, **kw)
                # The serve runner fails on purpose here (the stand-in never listens); what counts is
                # that the stand-in ran. Read before close: closing the session releases the sandbox.
                try:
                    stamp = float((await sb.download_file(STAMP_OUT)).decode().strip())
                except Exception as exc:
                    raise RuntimeError(
                        f"replica {variant}: the stand-in did not run: {exc!r} {r.stderr[-300:]!r}"
                    ) from exc
                receipt = await session.close()
                if receipt is None or not receipt.cleanup_confirmed:
                    raise RuntimeError(f"replica {variant}: cleanup not confirmed: {r.error}")
                launch = next(o for o in log.ops if o.label.startswith("launch"))
                return {"staging": launch.start - t_call, "launch_to_exec": stamp - launch.start}
            finally:
                with contextlib.suppress(Exception):
                    await sb.release()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def bench_first_call(reps: int, rep: B.Report) -> dict[str, Any]:
    # Imports an episode would otherwise pay inside its first phase (once per process).
    import opencode_tui_core.episode
    import opencode_tui_core.model.endpoint
    import opencode_tui_core.runtime.opencode
    import opencode_tui_core.sandbox.docker  # noqa: F401

    task = load_task(TASK_DIR)
    config = AgentConfig(sandbox=SandboxConfig(provider="docker"), model=ModelSettings())
    binary_dir = await asyncio.to_thread(B.cached_binary_dir, VERSION)
    raw = B.RawOpenCode(task, binary_dir, OWNER)
    runs = Path(tempfile.mkdtemp(prefix="octui-bench-runs-"))
    engine: list[dict[str, Any]] = []
    baseline: list[dict[str, Any]] = []
    rep_sup: list[dict[str, Any]] = []
    rep_relay: list[dict[str, Any]] = []
    try:
        # Warm the page cache with the binary once, so neither side pays the first read of 185 MB.
        await asyncio.to_thread(
            subprocess.run, [str(binary_dir / "opencode"), "--version"], capture_output=True, timeout=120
        )
        for i in range(reps):
            rep.progress(f"first call: engine episode {i + 1}/{reps}")
            engine.append(await engine_episode(task, config, runs))
            rep.progress(f"first call: raw docker exec {i + 1}/{reps}")
            b = await raw.exec_run(f"rt{i}")
            if b["rc"] != 0 or not b["verified"] or b["t_first_call"] is None:
                raise RuntimeError(f"the raw run failed: rc={b['rc']} {b['stderr']}")
            baseline.append(b)
            rep.progress(f"launch path replica {i + 1}/{reps}")
            rep_sup.append(await replica(task, config, "supervisor", f"s{i}"))
            rep_relay.append(await replica(task, config, "relay", f"r{i}"))
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    return {"engine": engine, "raw": baseline, "replica_supervisor": rep_sup, "replica_relay": rep_relay}


async def cli_first_call(runs_dir: Path, provider: str, tag: str) -> dict[str, Any]:
    """``opencode-tui run --batch`` of hello-file as a fresh process: from just before the spawn to the
    first model call the recording proxy saw (``model_calls.jsonl``), and to the process's exit."""
    import json
    import os

    out = runs_dir / tag
    argv = [sys.executable, "-m", "opencode_tui.cli", "run", str(TASK_DIR), "--batch"]
    argv += ["--provider", provider, "--runs-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(B.ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.time()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(B.ROOT)
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=300)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"opencode-tui run ({provider}) did not finish in 300 s") from None
    t_end = time.time()
    firsts = []
    for calls in out.glob(f"*/{RunFiles.MODEL_CALLS}"):
        for line in calls.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError):
                firsts.append(_iso(json.loads(line)["started_at"]))
    if proc.returncode != 0 or not firsts:
        raise RuntimeError(
            f"opencode-tui run ({provider}) rc={proc.returncode}, {len(firsts)} model calls: "
            f"{stdout.decode()[-300:]} {stderr.decode()[-500:]}"
        )
    return {"first_call": min(firsts) - t0, "exit": t_end - t0}


def _iso(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def bench_cli(reps: int, providers: list[str], rep: B.Report) -> dict[str, Any]:
    runs = Path(tempfile.mkdtemp(prefix="octui-bench-cli-"))
    res: dict[str, list[dict[str, Any]]] = {p: [] for p in providers}
    try:
        for i in range(reps):
            for prov in providers:
                rep.progress(f"process start → first model call: opencode-tui run ({prov}) {i + 1}/{reps}")
                res[prov].append(await cli_first_call(runs, prov, f"{prov}{i}"))
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    rows = []
    out: dict[str, Any] = {}
    for prov, rs in res.items():
        first = [r["first_call"] for r in rs]
        end = [r["exit"] for r in rs]
        rows.append(
            [prov, B.fmt_s(B.med(first)), B.fmt_spread(first), B.fmt_s(B.med(end)), B.fmt_spread(end)]
        )
        out[prov] = {"first_call": B.summary(first), "exit": B.summary(end)}
    rep.say(
        B.table(
            ["provider", "spawn → first model call", "min-max ms", "spawn → exit", "min-max ms"],
            rows,
            title="Process start → first model call: `opencode-tui run hello-file --batch` as a new process "
            "(warm: cached binary, images present)",
        )
    )
    rep.say()
    return out


# ---- report --------------------------------------------------------------------------------------


def first_call_tables(res: dict[str, Any], rep: B.Report) -> dict[str, Any]:
    eng, raw = res["engine"], res["raw"]

    def col(rows: list[dict[str, Any]], f: Any) -> list[float]:
        out = []
        for r in rows:
            with contextlib.suppress(TypeError, KeyError):
                v = f(r)
                if v is not None:
                    out.append(v)
        return out

    m: dict[str, tuple[list[float], list[float] | None]] = {
        "run → first model call": (
            col(eng, lambda r: r["t_first_call"] - r["t_agent"]),
            col(raw, lambda r: r["t_first_call"] - r["t_start"]),
        ),
        "  staging (agent phase → launch exec)": (col(eng, lambda r: r["t_launch"] - r["t_agent"]), None),
        "  launch exec → OpenCode's first log line": (
            col(eng, lambda r: r["t_log"] - r["t_launch"]),
            col(raw, lambda r: r["t_log"] - r["t_start"]),
        ),
        "  OpenCode first log line → first model call": (
            col(eng, lambda r: r["t_first_call"] - r["t_log"]),
            col(raw, lambda r: r["t_first_call"] - r["t_log"]),
        ),
        "last model call → exit observed": (
            col(eng, lambda r: r["t_exit"] - r["t_last_call"]),
            col(raw, lambda r: r["t_end"] - r["t_last_call"]),
        ),
    }
    rows = []
    out: dict[str, Any] = {}
    for name, (e, b) in m.items():
        rows.append(
            [
                name,
                B.fmt_s(B.med(e)),
                B.fmt_spread(e),
                B.fmt_s(B.med(b)) if b is not None else "",
                B.fmt_spread(b) if b is not None else "",
                B.fmt_ratio(B.ratio(B.med(e), B.med(b))) if b is not None else "",
            ]
        )
        out[name.strip()] = {"engine": B.summary(e), "raw": B.summary(b) if b is not None else None}
    rep.say(
        B.table(
            ["metric", "engine", "min-max ms", "raw docker exec", "min-max ms", "ratio"],
            rows,
            title="Run → first model call (hello-file, docker, scripted model); "
            "raw = docker exec opencode run, host network, no harness",
        )
    )
    rep.say()

    # Where the engine's time goes before the first call.
    sup = [r["launch_to_exec"] for r in res["replica_supervisor"]]
    rel = [r["launch_to_exec"] for r in res["replica_relay"]]
    rstage = [r["staging"] for r in res["replica_relay"]]
    stage_s = col(eng, lambda r: r["staging_session_ops"])
    stage_h = col(eng, lambda r: r["staging_harness_ops"])
    first = col(eng, lambda r: r["t_first_call"] - r["t_agent"])
    launch_log = col(eng, lambda r: r["t_log"] - r["t_launch"])
    raw_log = col(raw, lambda r: r["t_log"] - r["t_start"])
    oc_boot = col(eng, lambda r: r["t_first_call"] - r["t_log"])
    n_ops = eng[0]["staging_n_ops"] if eng else 0
    n_up = eng[0]["staging_uploads"] if eng else 0
    n_ex = eng[0]["staging_execs"] if eng else 0
    bd = [
        ["staging: session dir, supervisor, prompt", B.fmt_s(B.med(stage_s)), "episode (timed sandbox ops)"],
        [
            "staging: OpenCode config, plugin, dependency fence, relay",
            B.fmt_s(B.med(stage_h)),
            "episode (timed sandbox ops)",
        ],
        ["staging, replayed (same calls)", B.fmt_s(B.med(rstage)), "replica (b)"],
        [
            "launch exec → harness starts (docker exec, launch script, supervisor)",
            B.fmt_s(B.med(sup)),
            "replica (a)",
        ],
        [
            "harness start → OpenCode exec (relay start + wait loop)",
            B.fmt_s(None if not (rel and sup) else B.med(rel) - B.med(sup)),
            "replica (b) - (a)",
        ],
        [
            "OpenCode exec → its first log line (binary load)",
            B.fmt_s(None if not (launch_log and rel) else B.med(launch_log) - B.med(rel)),
            "episode - replica (b)",
        ],
        ["  same, raw docker exec (incl. CLI)", B.fmt_s(B.med(raw_log)), "raw"],
        ["OpenCode first log line → first model call (OpenCode init)", B.fmt_s(B.med(oc_boot)), "episode"],
        ["total: agent phase → first model call", B.fmt_s(B.med(first)), "episode"],
    ]
    rep.say(
        B.table(
            ["engine: before the first model call", "median", "source"],
            bd,
            title=f"Breakdown (medians). Staging = {n_ops} sequential sandbox calls: {n_up} file uploads "
            f"(each an exec of mkdir -p + a put_archive) and {n_ex} execs",
        )
    )
    rep.say()
    out["breakdown"] = {
        "staging_session_ops": B.summary(stage_s),
        "staging_harness_ops": B.summary(stage_h),
        "staging_replica": B.summary(rstage),
        "launch_to_harness_start": B.summary(sup),
        "launch_to_opencode_exec": B.summary(rel),
        "staging_ops": {"n": n_ops, "uploads": n_up, "execs": n_ex},
    }
    # Install phase of the episodes (warm cache).
    labels: dict[str, list[float]] = {}
    for r in eng:
        for k, v in r["install_ops"].items():
            labels.setdefault(k, []).append(v)
    inst = col(eng, lambda r: r["install_phase"])
    irows = [["install phase (cache hit)", B.fmt_s(B.med(inst)), B.fmt_spread(inst)]]
    irows += [[f"  {k}", B.fmt_s(B.med(v)), B.fmt_spread(v)] for k, v in labels.items()]
    rep.say(B.table(["episode install phase, warm cache", "median", "min-max ms"], irows))
    rep.say()
    out["install_phase"] = {"total": B.summary(inst), **{k: B.summary(v) for k, v in labels.items()}}
    return out


def install_table(res: dict[str, Any], rep: B.Report) -> dict[str, Any]:
    cold, warm, raw = res["cold"], res["warm"], res["raw_download"]
    mb = res.get("tarball_bytes", 0) / 1e6
    rows = [
        ["cold: Installer.ensure, empty cache", B.fmt_s(B.med(cold)), B.fmt_spread(cold), ""],
        ["  raw download (metadata + tarball)", B.fmt_s(B.med(raw)), B.fmt_spread(raw), f"{mb:.1f} MB"],
        [
            "  sha512 of the tarball (installer routine)",
            B.fmt_s(B.med(res["sha512"])),
            B.fmt_spread(res["sha512"]),
            "",
        ],
        [
            "  extract binary + sha256 + fsync (installer routine)",
            B.fmt_s(B.med(res["extract"])),
            B.fmt_spread(res["extract"]),
            f"{res.get('binary_bytes', 0) / 1e6:.0f} MB",
        ],
        ["warm: Installer.ensure, cache hit", B.fmt_s(B.med(warm)), B.fmt_spread(warm), f"n={len(warm)}"],
    ]
    rep.say(B.table(["OpenCode install (controller)", "median", "min-max ms", "note"], rows))
    r1 = B.ratio(B.med(cold), B.med(warm))
    r2 = B.ratio(B.med(cold), B.med(raw))
    steps = (B.med(raw) or 0) + (B.med(res["sha512"]) or 0) + (B.med(res["extract"]) or 0)
    rep.say(
        f"cold / warm = {B.fmt_ratio(r1)}; cold / raw download = {B.fmt_ratio(r2)}; "
        f"raw download + verify + extract = {B.fmt_s(steps)} vs cold {B.fmt_s(B.med(cold))}"
    )
    rep.say()
    return {
        "cold": B.summary(cold),
        "warm": B.summary(warm),
        "raw_download": B.summary(raw),
        "sha512": B.summary(res["sha512"]),
        "extract": B.summary(res["extract"]),
        "tarball_bytes": res.get("tarball_bytes"),
        "binary_bytes": res.get("binary_bytes"),
        "cold_over_warm": r1,
        "cold_over_raw_download": r2,
    }


async def main_async(args: argparse.Namespace) -> int:
    reps = args.reps or (1 if args.quick else 3)
    ireps = args.install_reps or (1 if args.quick else 3)
    rep = B.Report("runtime", args.json, {"reps": reps, "install_reps": ireps, "opencode_version": VERSION})
    rep.say(f"runtime benchmark: {ireps} cold install(s), {reps} engine episode(s) vs {reps} raw run(s)")
    started = time.monotonic()
    status = 0
    try:
        if not args.skip_install:
            res = await bench_install(ireps, 20, rep)
            rep.say()
            rep.data["install"] = install_table(res, rep)
        rep.data["process_start"] = await bench_cli(reps, args.providers, rep)
        res = await bench_first_call(reps, rep)
        rep.data["first_call_raw"] = res
        rep.data["first_call"] = first_call_tables(res, rep)
    finally:
        left = await B.reap_leftovers(OWNER)
    return B.close_report(rep, left, OWNER, started, status)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, help="engine episodes and raw runs (default 3, --quick 1)")
    p.add_argument("--install-reps", type=int, help="cold installs (default 3, --quick 1)")
    p.add_argument("--skip-install", action="store_true", help="skip the install part (no downloads)")
    p.add_argument(
        "--providers",
        nargs="+",
        default=["docker", "local"],
        help="providers for the process start → first model call part (default docker local)",
    )
    B.add_common_args(p)
    args = p.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
