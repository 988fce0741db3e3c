"""Episode benchmark: the hello-file episode through the engine vs the raw floor, and batch throughput.

    python benchmarks/episode.py                   # 3 engine episodes vs 3 raw runs; batch of 4 at jobs 1, 2, 4
    python benchmarks/episode.py --quick           # 1 vs 1; batch of 2 at jobs 1, 2
    python benchmarks/episode.py --batch 6 --jobs 1 3 --json out.json
    python benchmarks/episode.py --executor ray --quick   # 8 episodes: Ray at 2 CPUs vs local --jobs 2

1. One episode. Engine: ``Episode(task, config).run()`` of ``sample_tasks/hello-file`` with the docker
   provider and the embedded scripted model (recording proxy, model-only network, relay, supervisor,
   confirmed cleanup, transcript, verification, release), wall clock around ``run()``; the phase
   durations come from the EpisodeResult. Raw floor: ``docker run --rm -i`` of the same image with the
   installer's cached OpenCode binary bind-mounted read-only, host networking, a ScriptedModel of the
   same trajectory on 127.0.0.1, running ``opencode run --format json`` and then the task's verify
   command; no harness. The engine runs with the default ``serve`` harness (live output through the
   server's event stream) and, for comparison, with the ``run`` harness (``opencode run --format json``,
   the floor's own command). Engine and floor repetitions alternate; ratio = median / median.

2. Batch throughput: ``opencode_tui_core.batch.run_batch`` (what ``opencode-tui run --batch`` uses) over N copies of
   hello-file at each ``--jobs`` value, each in a fresh temporary runs directory, one attempt each.
   Episodes per minute = N / wall clock; speed-up against the first jobs value.

3. ``--executor ray``: the same batch (8 hello-file copies unless ``--batch``) through ``run_batch`` with
   the Ray executor on a local Ray instance started here (127.0.0.1, 2 CPUs, one CPU per episode: two
   worker processes), against the local executor at ``--jobs 2`` in the same run; they alternate
   (local first), ``--reps`` pairs (default 1). Ray's time includes what a batch pays on a running
   cluster: joining it, the shared-storage probe, the workers' first imports. Overhead = Ray wall /
   local wall. Machine CPU-seconds per episode (``/proc/stat`` busy time over the batch / episodes)
   include whatever else runs on the machine. Part 1 is skipped.

4. ``--warm``: the batch's warm pool (issue 31); parts 1-2 are skipped. Per pair (``--reps``, default
   3, --quick 1): raw floors (2 with ``--quick``, else 3; part 1's ``RawOpenCode``: docker, a ``docker exec`` of
   ``opencode run`` in a running container of the image; local, one plain ``bwrap``), then a batch of N
   distinct hello-file copies (3 with ``--quick``, else 5) at ``--jobs 1`` with ``batch.warm: 0``, the
   same with ``batch.warm: --warm-depth`` (default 2), then the throughput batches: warm-ahead at
   every ``--jobs`` (default 1 and the core count) over max(``--ceiling-batch``, 2 x jobs) copies
   (default 12; ``--quick``: N): long enough that their start (no sandbox is ready for the first
   episode) and end (the last one runs alone) do not decide the rate. Printed (and in ``--json``,
   one object):

   - ``warm_first_call_ratio``: p50 of attempt start (its EpisodeStarted event) → its first model
     request (the earliest ``started_at`` of its ModelCall events) over the attempts after the first
     of the warm ``--jobs 1`` batch ÷ p50 of the raw floor's exec → its first model request (target
     ≤ 0.2); ``warm_vs_cold_first_call_ratio``: the same against the cold batch.
   - ``jobs1_warm_speedup``: cold wall / warm wall at ``--jobs 1`` (target ≥ 1.3): the median over the
     pairs (``--reps``, default 3 with ``--warm``; each pair back to back, its order alternating), printed
     with every pair's figure and their spread.
   - ``ceiling_efficiency``: episodes per minute ÷ the machine's CPU ceiling (cores x 60 / machine
     CPU-s per episode of that batch, ``/proc/stat`` busy time over the batch ÷ episodes), per
     ``--jobs`` over the throughput batches (``ceiling_efficiency_by_jobs``) and the least of them
     (target ≥ 0.9); ``ceiling_efficiency_short_batch``: the same for the N-episode warm batch.
   - ``cpu_per_episode_ratio``: machine CPU-s per episode of the warm ``--jobs 1`` batch ÷ the raw
     floor's (the same ``/proc/stat`` accounting around one raw episode, its sandbox's creation and
     removal included; target ≤ 1.1). ``/proc/stat`` sees the whole machine: ``..._own`` (docker
     only) is the same ratio over this process, its reaped descendants and the Docker engine's
     containers (a local sandbox's processes are no reaped descendants: bwrap's init reaps them).
   - ``controller_cpu_ms_per_episode``: this process's CPU (RUSAGE_SELF: engine, proxy, scripted
     model, warm pool) over the warm ``--jobs 1`` batch ÷ episodes (target ≤ 150 ms).

No container may be left behind: all containers of this process carry its own owner label
(``opencode-tui.owner=bench-<pid>@<host>``) and are counted after every batch and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import _bench as B

OWNER = B.setup()

from opencode_tui_core.config import AgentConfig, SandboxConfig  # noqa: E402
from opencode_tui_core.failures import Outcome  # noqa: E402
from opencode_tui_core.tasks import load_task  # noqa: E402

TASK_DIR = B.ROOT / "sample_tasks" / "hello-file"
PHASES = ("seed", "install", "agent", "closing", "transcript", "verification", "release")


async def engine_episode(task: Any, config: AgentConfig, runs_dir: Path) -> dict[str, Any]:
    from opencode_tui_core.episode import Episode

    ep = Episode(task, config, runs_dir=runs_dir)
    c0 = time.process_time()
    t0 = time.perf_counter()
    result = await ep.run()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    if result.action is not Outcome.SCORED or result.reward != 1.0:
        raise RuntimeError(f"the engine episode did not score: {result.summary} ({result.run_dir})")
    return {
        "wall": wall,
        "engine_cpu": cpu,
        "durations": result.durations_s,
        "cleanup_confirmed": result.cleanup_confirmed,
    }


async def batch(task: Any, config: AgentConfig, n: int, jobs: int) -> dict[str, Any]:
    from opencode_tui_core.batch import run_batch

    runs = Path(tempfile.mkdtemp(prefix=f"octui-bench-batch-j{jobs}-"))
    try:
        c0 = time.process_time()
        t0 = time.perf_counter()
        summary = await run_batch([task] * n, config, runs_dir=runs, jobs=jobs, max_attempts=1)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    agent = [r.durations_s.get("agent") for r in summary.results if r.durations_s.get("agent")]
    left = B.leftovers(OWNER)["ours"]
    return {
        "jobs": jobs,
        "episodes": n,
        "wall": wall,
        "episodes_per_min": n / wall * 60,
        "engine_cpu_per_episode": cpu / n,
        "peak_rss_mb": B.peak_rss_mb(),
        "loadavg_after": B.loadavg(),
        "scored": summary.scored,
        "failures": summary.failures_by_kind,
        "agent_phase_median": B.med(agent),
        "cleanup_confirmed": sum(1 for r in summary.results if r.cleanup_confirmed),
        "leftover_containers": left,
    }


def start_local_ray(cpus: int) -> Path:
    """A Ray instance owned by this process (``ray.shutdown()`` stops it), bound to loopback; its
    workers import this tree (PYTHONPATH) and inherit our owner label."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(B.ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Token authentication with a token of this run's own: Ray 2.60 would otherwise write one into
    # ~/.ray/auth_token, which every later `ray start` on the machine then follows.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    import logging

    import ray

    temp = Path(tempfile.mkdtemp(prefix="rayb-", dir="/tmp"))  # short: Ray's Unix sockets live here
    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        _node_ip_address="127.0.0.1",
        _temp_dir=str(temp),
    )
    return temp


async def executor_batch(task: Any, config: AgentConfig, n: int, jobs: int, executor: str) -> dict[str, Any]:
    """One batch of ``n`` through ``run_batch``: the local executor at ``jobs``, or the Ray executor
    on the Ray instance this process started (its CPUs bound the concurrency)."""
    from opencode_tui_core.batch import LocalExecutor, run_batch

    runs = Path(tempfile.mkdtemp(prefix=f"octui-bench-{executor}-"))
    if executor == "ray":
        from opencode_tui_core.ray_executor import RayExecutor

        ex: Any = RayExecutor(config.executor.ray)
        jobs = n
    else:
        ex = LocalExecutor()
    try:
        busy0 = B.machine_busy_s()
        self0, kids0 = B.process_cpu_s()
        t0 = time.perf_counter()
        if executor == "ray":
            await asyncio.to_thread(ex.connect)
        summary = await run_batch([task] * n, config, runs_dir=runs, jobs=jobs, max_attempts=1, executor=ex)
        wall = time.perf_counter() - t0
        busy = B.machine_busy_s() - busy0
        self1, kids1 = B.process_cpu_s()
        await ex.close()
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    left = B.leftovers(OWNER)["ours"]
    if str(config.sandbox.provider) == "local":
        from opencode_tui_core.sandbox.providers import get_provider

        left += [r.sandbox_id for r in await get_provider(config.sandbox.provider).listed(owner=OWNER)]
    return {
        "executor": executor,
        "episodes": n,
        "wall": wall,
        "episodes_per_min": n / wall * 60,
        "machine_cpu_s_per_episode": busy / n,
        # The local executor: the engine's CPU (and, local provider, the whole episode's); Ray: the driver's.
        "process_cpu_s_per_episode": (self1 - self0 + kids1 - kids0) / n,
        "probe_s": getattr(ex, "probe_s", None),
        "loadavg_after": B.loadavg(),
        "scored": summary.scored,
        "failures": summary.failures_by_kind,
        "cleanup_confirmed": sum(1 for r in summary.results if r.cleanup_confirmed),
        "leftover_containers": left,
    }


async def ray_comparison(task: Any, config: AgentConfig, n: int, cpus: int, reps: int, rep: B.Report) -> int:
    temp = await asyncio.to_thread(start_local_ray, cpus)
    pairs: list[dict[str, Any]] = []
    status = 0
    try:
        for i in range(reps):
            rep.progress(f"local executor, {n} episodes at jobs {cpus} ({i + 1}/{reps})")
            local = await executor_batch(task, config, n, cpus, "local")
            rep.progress(f"ray executor, {n} episodes on {cpus} Ray CPUs ({i + 1}/{reps})")
            on_ray = await executor_batch(task, config, n, cpus, "ray")
            pairs.append({"local": local, "ray": on_ray, "overhead": on_ray["wall"] / local["wall"]})
            if local["leftover_containers"] or on_ray["leftover_containers"]:
                status = 1
    finally:
        import ray

        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    provider = config.sandbox.provider
    rep.data["ray_comparison"] = {"cpus": cpus, "provider": provider, "pairs": pairs}
    rows = [
        [
            f"{b['executor']} #{i + 1}",
            str(b["episodes"]),
            B.fmt_s(b["wall"]),
            f"{b['episodes_per_min']:.2f}",
            f"{b['scored']}/{b['episodes']}",
            f"{b['cleanup_confirmed']}/{b['episodes']}",
            B.fmt_s(b["machine_cpu_s_per_episode"]),
            B.fmt_s(b["process_cpu_s_per_episode"]),
            B.fmt_s(b["probe_s"]) if b["probe_s"] is not None else "",
            " ".join(f"{x:.1f}" for x in b["loadavg_after"]),
            str(len(b["leftover_containers"])),
        ]
        for i, pair in enumerate(pairs)
        for b in (pair["local"], pair["ray"])
    ]
    headers = ["executor", "episodes", "wall", "episodes/min", "scored", "cleanup ok", "machine CPU/ep"]
    headers += ["process CPU/ep", "probe", "loadavg after", "leftovers"]
    title = f"Batch throughput: Ray ({cpus} CPUs) vs local (--jobs {cpus}), {provider} provider"
    rep.say(B.table(headers, rows, title=title))
    rep.say(
        "process CPU/ep: local = this process and its reaped descendants (the engine and proxy; not the "
        "sandboxes: bwrap's init reaps a local sandbox's processes, containerd a container's); "
        "ray = the driver alone"
    )
    overheads = [p["overhead"] for p in pairs]
    rep.say(
        f"Ray overhead (Ray wall / local wall): {', '.join(f'{x:.3f}x' for x in overheads)}; "
        f"median {B.med(overheads):.3f}x (target <= 1.15x); load average at start "
        f"{rep.data['meta']['loadavg_start']}, now {B.loadavg()}"
    )
    rep.data["ray_comparison"]["overhead_median"] = B.med(overheads)
    if any(p["local"]["scored"] < n or p["ray"]["scored"] < n for p in pairs):
        status = 1
    return status


def single_table(
    engine: list[dict[str, Any]], engine_run: list[dict[str, Any]], floor: list[dict[str, Any]], rep: B.Report
) -> dict[str, Any]:
    ew = [e["wall"] for e in engine]
    fw = [f["wall"] for f in floor]
    rows = [
        [
            "episode wall clock",
            B.fmt_s(B.med(ew)),
            B.fmt_spread(ew, "s"),
            B.fmt_s(B.med(fw)),
            B.fmt_spread(fw, "s"),
            B.fmt_ratio(B.ratio(B.med(ew), B.med(fw))),
        ],
    ]
    phases: dict[str, Any] = {}
    for ph in PHASES:
        xs = [e["durations"][ph] for e in engine if ph in e["durations"]]
        phases[ph] = B.summary(xs)
        rows.append([f"  {ph}", B.fmt_s(B.med(xs)), B.fmt_spread(xs, "s"), "", "", ""])
    other = [e["wall"] - sum(e["durations"].get(p, 0) for p in PHASES) for e in engine]
    rows.append(
        ["  outside phases (admission, outcome)", B.fmt_s(B.med(other)), B.fmt_spread(other, "s"), "", "", ""]
    )
    agent = [e["durations"].get("agent", 0) for e in engine]
    rows.append(
        [
            "agent phase alone vs raw floor",
            B.fmt_s(B.med(agent)),
            "",
            B.fmt_s(B.med(fw)),
            "",
            B.fmt_ratio(B.ratio(B.med(agent), B.med(fw))),
        ]
    )
    rw = [e["wall"] for e in engine_run]
    ragent = [e["durations"].get("agent", 0) for e in engine_run]
    rows.append(
        [
            "episode, run harness (no live output)",
            B.fmt_s(B.med(rw)),
            B.fmt_spread(rw, "s"),
            B.fmt_s(B.med(fw)),
            "",
            B.fmt_ratio(B.ratio(B.med(rw), B.med(fw))),
        ]
    )
    rows.append(["  agent phase, run harness", B.fmt_s(B.med(ragent)), B.fmt_spread(ragent, "s"), "", "", ""])
    ecpu = [e["engine_cpu"] for e in engine]
    fcpu = [f["cpu"] for f in floor if f.get("cpu") is not None]
    rows.append(
        ["engine process CPU (controller)", B.fmt_s(B.med(ecpu)), B.fmt_spread(ecpu, "s"), "", "", ""]
    )
    rss = rep.data["meta"].get("peak_rss_mb_after_single")
    rows.append(
        ["controller peak RSS (whole process so far)", f"{rss:.0f} MB" if rss else "-", "", "", "", ""]
    )
    rows.append(
        ["OpenCode + verifier CPU (raw floor)", "", "", B.fmt_s(B.med(fcpu)), B.fmt_spread(fcpu, "s"), ""]
    )
    rep.say()
    rep.say(
        B.table(
            [
                f"hello-file, {rep.data['meta']['provider']}",
                "engine",
                "min-max s",
                "raw floor",
                "min-max s",
                "ratio",
            ],
            rows,
            title="One episode: engine (Episode.run) vs raw floor ("
            + (
                "docker run --rm -i … opencode run && verify)"
                if rep.data["meta"]["provider"] == "docker"
                else "bwrap … opencode run && verify)"
            ),
        )
    )
    rep.say()
    return {
        "engine": {
            "wall": B.summary(ew),
            "phases": phases,
            "outside_phases": B.summary(other),
            "controller_cpu": B.summary(ecpu),
        },
        "engine_run_harness": {"wall": B.summary(rw), "agent": B.summary(ragent)},
        "raw_floor": {"wall": B.summary(fw), "cpu": B.summary(fcpu)},
        "ratio_wall": B.ratio(B.med(ew), B.med(fw)),
        "ratio_agent_phase_vs_floor": B.ratio(B.med(agent), B.med(fw)),
    }


def batch_table(batches: list[dict[str, Any]], single: dict[str, Any], rep: B.Report) -> None:
    base = batches[0]["episodes_per_min"] if batches else None
    brows = [
        [
            str(b["jobs"]),
            str(b["episodes"]),
            B.fmt_s(b["wall"]),
            f"{b['episodes_per_min']:.2f}",
            B.fmt_ratio(B.ratio(b["episodes_per_min"], base)),
            f"{b['scored']}/{b['episodes']}",
            f"{b['cleanup_confirmed']}/{b['episodes']}",
            B.fmt_s(b["agent_phase_median"]),
            B.fmt_s(b["engine_cpu_per_episode"]),
            f"{b['peak_rss_mb']:.0f} MB",
            str(len(b["leftover_containers"])),
        ]
        for b in batches
    ]
    headers = ["jobs", "episodes", "wall", "episodes/min", "speed-up", "scored", "cleanup ok"]
    headers += ["agent phase med", "engine CPU/ep", "peak RSS", "leftovers"]
    rep.say(
        B.table(
            headers,
            brows,
            title=f"Batch throughput (run_batch, {rep.data['meta']['provider']}, one attempt per episode)",
        )
    )
    fcpu = single.get("raw_floor", {}).get("cpu", {}).get("median")
    ecpu = single.get("engine", {}).get("controller_cpu", {}).get("median")
    if fcpu and ecpu:
        per_ep = fcpu + ecpu
        cpus = os.cpu_count() or 1
        rep.say(
            f"CPU-bound ceiling: {cpus} cores x 60 s / {per_ep:.1f} CPU-s per episode (OpenCode {fcpu:.1f} + "
            f"engine {ecpu:.1f}) = {cpus * 60 / per_ep:.1f} episodes/min on an idle machine; load average "
            f"at start {rep.data['meta']['loadavg_start']}, now {B.loadavg()}"
        )
    rep.say()


async def main_async(args: argparse.Namespace) -> int:
    if args.executor == "ray":
        return await main_ray(args)
    if args.warm:
        return await main_warm(args)
    reps = args.reps or (1 if args.quick else 3)
    n = args.batch or (2 if args.quick else 4)
    jobs_list = args.jobs or ([1, 2] if args.quick else [1, 2, 4])
    meta = {
        "provider": args.provider,
        "reps": reps,
        "batch": n,
        "jobs": jobs_list,
        "cpus": os.cpu_count(),
        "loadavg_start": B.loadavg(),
    }
    rep = B.Report("episode", args.json, meta)
    rep.say(
        f"episode benchmark: {reps} engine episode(s) vs {reps} raw run(s); "
        f"batch of {n} hello-file episodes at jobs {', '.join(map(str, jobs_list))}"
    )
    started = time.monotonic()
    status = 0
    # Imports an episode would otherwise pay inside its first phase (once per process).
    import opencode_tui_core.batch
    import opencode_tui_core.episode
    import opencode_tui_core.model.endpoint
    import opencode_tui_core.runtime.opencode
    import opencode_tui_core.sandbox.docker  # noqa: F401

    task = load_task(TASK_DIR)
    config = AgentConfig(sandbox=SandboxConfig(provider=args.provider))
    binary_dir = await asyncio.to_thread(B.cached_binary_dir, config.runtime.opencode_version)
    raw = B.RawOpenCode(task, binary_dir, OWNER)
    run_config = config.model_copy(update={"runtime": config.runtime.model_copy(update={"harness": "run"})})
    engine: list[dict[str, Any]] = []
    engine_run: list[dict[str, Any]] = []
    floor: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = []
    runs = Path(tempfile.mkdtemp(prefix="octui-bench-episode-"))
    try:
        # Page cache: the first read of the 185 MB binary is paid by neither side.
        await asyncio.to_thread(
            subprocess.run, [str(binary_dir / "opencode"), "--version"], capture_output=True, timeout=120
        )
        for i in range(reps):
            rep.progress(f"engine episode {i + 1}/{reps}")
            engine.append(await engine_episode(task, config, runs))
            rep.progress(f"engine episode, run harness {i + 1}/{reps}")
            engine_run.append(await engine_episode(task, run_config, runs))
            rep.progress(f"raw floor {i + 1}/{reps}")
            f = await (raw.floor_run if args.provider == "docker" else raw.bwrap_floor_run)(f"ep{i}")
            if f["rc"] != 0:
                raise RuntimeError(f"the raw floor failed (rc {f['rc']}): {f['stderr']}")
            floor.append(f)
        rep.data["meta"]["peak_rss_mb_after_single"] = B.peak_rss_mb()
        single = single_table(engine, engine_run, floor, rep)
        rep.data.update(single)
        for j in jobs_list:
            rep.progress(f"batch of {n} at jobs={j}")
            b = await batch(task, config, n, j)
            batches.append(b)
            if b["leftover_containers"]:
                status = 1
        rep.data["batches"] = batches
        batch_table(batches, single, rep)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
        left = await B.reap_leftovers(OWNER)
    return B.close_report(rep, left, OWNER, started, status)


async def warm_batch(tasks: list[Any], config: AgentConfig, warm: int, jobs: int = 1) -> dict[str, Any]:
    """One batch at ``jobs`` with ``batch.warm: warm``: wall clock, the CPU it took (see B.CpuSpan), and
    for each attempt that did not start at once (after the first ``jobs``) its attempt start → first
    model request."""
    from opencode_tui_core.artifacts import RunDirReader
    from opencode_tui_core.batch import run_batch
    from opencode_tui_core.events import EpisodeStarted, ModelCall

    cfg = config.model_copy(update={"batch": config.batch.model_copy(update={"warm": warm})})
    runs = Path(tempfile.mkdtemp(prefix=f"octui-bench-warm{warm}-j{jobs}-"))
    n = len(tasks)
    try:
        meter = B.CpuMeter(docker=str(config.sandbox.provider) == "docker")
        summary = await run_batch(tasks, cfg, runs_dir=runs, jobs=jobs, max_attempts=1)
        span = meter.span()
        firsts: list[float] = []
        by_task = {r.task_id: r for r in summary.results}
        for task in tasks[jobs:]:
            events = list(RunDirReader(Path(by_task[task.id].run_dir)).events())
            start = next(e.ts for e in events if isinstance(e, EpisodeStarted))
            calls = [e.started_at for e in events if isinstance(e, ModelCall)]
            if calls:
                firsts.append((min(calls) - start).total_seconds())
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    per = span.per(n)
    per_min = n / span.wall * 60
    cores = os.cpu_count() or 1
    # The machine's CPU ceiling at this batch's own cost: cores x 60 s / machine CPU-s per episode.
    ceiling = cores * 60 / per["machine"] if per["machine"] else None
    return {
        "warm": warm,
        "jobs": jobs,
        "wall": span.wall,
        "scored": summary.scored,
        "episodes": n,
        "episodes_per_min": per_min,
        "cpu_s": asdict(span),
        "cpu_s_per_episode": per,
        "controller_cpu_ms_per_episode": span.controller / n * 1000,
        "ceiling_episodes_per_min": ceiling,
        "ceiling_efficiency": B.ratio(per_min, ceiling),
        "first_call_s": firsts,
        "first_call_median": B.med(firsts),
        "pool": summary.warm.model_dump() if summary.warm else None,
        "warm_used": sum(1 for r in summary.results if r.warm),
        "peak_rss_mb": B.peak_rss_mb(),
        "loadavg_after": B.loadavg(),
        "leftover_containers": B.leftovers(OWNER)["ours"],
    }


async def raw_floor(raw: B.RawOpenCode, provider: str, tag: str) -> dict[str, Any]:
    """One raw ``opencode run`` episode, no engine, in the provider's kind of sandbox: docker, a
    ``docker exec`` in a running container (``docker run -d`` and the removal inside the CPU span, not
    in the first-request time); local, one plain ``bwrap``. Exec → first model request, and its CPU."""
    meter = B.CpuMeter(docker=provider == "docker")
    r = await (raw.exec_run if provider == "docker" else raw.bwrap_floor_run)(tag)
    span = meter.span()
    if r["rc"] != 0 or r.get("verified") is False or r["t_first_call"] is None:
        raise RuntimeError(f"the raw floor failed (rc {r['rc']}, {r['calls']} calls): {r['stderr']}")
    return {
        "first_call_s": r["t_first_call"] - r["t_start"],
        "cpu_s": asdict(span),
        "opencode_cpu_s": r.get("cpu"),  # the ``times`` of the shell around it (local only)
        "calls": r["calls"],
    }


def _spread_words(fig: dict[str, Any]) -> str:
    """``median of 3 pairs, 1.28-1.41``: how many pairs the speed-up is the median of, and their spread."""
    spread = fig.get("jobs1_warm_speedup_spread")
    n = len([p for p in fig.get("jobs1_warm_speedup_pairs") or [] if p is not None])
    if spread is None:
        return "no pair"
    return f"median of {n} pair{'s' if n != 1 else ''}, {spread[0]:.2f}-{spread[1]:.2f}"


def _pool_words(batches: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{b['pool']['prepared']}/{b['pool']['used']}/{b['pool']['discarded']}" if b["pool"] else "-"
        for b in batches
    )


async def main_warm(args: argparse.Namespace) -> int:
    n = args.batch or (3 if args.quick else 5)
    # Three pairs by default: one pair's speed-up moves with the machine's load (1.28-1.44 was seen
    # for the same code); the median of three, with its spread, says how far.
    reps = args.reps or (1 if args.quick else 3)
    depth = args.warm_depth
    cores = os.cpu_count() or 1
    jobs_list = args.jobs or sorted({1, cores})
    n_floor = 2 if args.quick else 3
    # The throughput batches: long enough that their start (the first episode has no sandbox ready)
    # and end (the last runs alone, half the machine idle) do not decide a steady rate.
    ceiling_n = args.ceiling_batch or (n if args.quick else 12)
    meta = {"mode": "warm", "provider": args.provider, "batch": n, "reps": reps, "cpus": cores}
    meta["ceiling_batch"] = ceiling_n
    meta.update({"warm_depth": depth, "jobs": jobs_list, "raw_floor_runs": n_floor * reps})
    meta["loadavg_start"] = B.loadavg()
    rep = B.Report("episode", args.json, meta)
    rep.say(
        f"episode benchmark, warm pool ({args.provider}): {n} hello-file episodes at --jobs 1, warm 0 vs "
        f"warm {depth}; warm {depth} at --jobs {', '.join(map(str, jobs_list))}; {n_floor} raw "
        f"`opencode run` floor(s) per pair; {reps} pair(s); throughput batches of {ceiling_n} (at least 2 x jobs)"
    )
    started = time.monotonic()
    import opencode_tui_core.batch
    import opencode_tui_core.episode
    import opencode_tui_core.sandbox.docker  # noqa: F401

    config = AgentConfig(sandbox=SandboxConfig(provider=args.provider))
    binary_dir = await asyncio.to_thread(B.cached_binary_dir, config.runtime.opencode_version)
    raw = B.RawOpenCode(load_task(TASK_DIR), binary_dir, OWNER)
    root = Path(tempfile.mkdtemp(prefix="octui-bench-warm-tasks-"))
    tasks = []
    for i in range(max([n, ceiling_n, *(2 * j for j in jobs_list)])):
        d = root / f"hello-{i}"
        shutil.copytree(TASK_DIR, d)
        (d / "task.yaml").write_text(
            (d / "task.yaml").read_text().replace("id: hello-file", f"id: hello-{i}")
        )
        tasks.append(load_task(d))
    floor: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    warm: list[dict[str, Any]] = []
    by_jobs: dict[int, list[dict[str, Any]]] = {j: [] for j in jobs_list}
    status = 0
    try:
        # Page cache: the first read of the 185 MB binary is paid by neither side.
        await asyncio.to_thread(
            subprocess.run, [str(binary_dir / "opencode"), "--version"], capture_output=True, timeout=120
        )
        for i in range(reps):
            for k in range(n_floor):
                rep.progress(f"raw floor {k + 1}/{n_floor} ({i + 1}/{reps})")
                floor.append(await raw_floor(raw, args.provider, f"warm{i}-{k}"))
            # The pair runs back to back, its order alternating (a load that rises or falls through
            # the run weighs on each side alike); its speed-up is one figure of the spread.
            for warm_side in (False, True) if i % 2 == 0 else (True, False):
                rep.progress(
                    f"batch {'with warm ' + str(depth) if warm_side else 'without warm'} ({i + 1}/{reps})"
                )
                if warm_side:
                    warm.append(await warm_batch(tasks[:n], config, depth))
                else:
                    cold.append(await warm_batch(tasks[:n], config, 0))
            for j in jobs_list:
                m = max(ceiling_n, 2 * j)
                if j == 1 and m == n:
                    by_jobs[1].append(warm[-1])
                    continue
                rep.progress(f"batch of {m} with warm {depth} at --jobs {j} ({i + 1}/{reps})")
                by_jobs[j].append(await warm_batch(tasks[:m], config, depth, jobs=j))
        batches = cold + [b for bs in by_jobs.values() for b in bs]
        for b in batches:
            if b["leftover_containers"] or b["scored"] != b["episodes"]:
                status = 1
        figures = warm_figures(floor, cold, warm, by_jobs)
        rep.data.update({"raw_floor": floor, "cold": cold, "warm": warm})
        rep.data["warm_by_jobs"] = {str(j): bs for j, bs in by_jobs.items()}
        rep.data.update(figures)
        warm_tables(floor, cold, warm, by_jobs, figures, rep)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        left = await B.reap_leftovers(OWNER)
    return B.close_report(rep, left, OWNER, started, status)


def warm_figures(
    floor: list[dict[str, Any]],
    cold: list[dict[str, Any]],
    warm: list[dict[str, Any]],
    by_jobs: dict[int, list[dict[str, Any]]],
) -> dict[str, Any]:
    """The headline ratios of ``--warm`` (issue 31), each against a baseline measured in this run."""
    f_first = B.med([f["first_call_s"] for f in floor])
    c_first = B.med([x for b in cold for x in b["first_call_s"]])
    w_first = B.med([x for b in warm for x in b["first_call_s"]])
    f_cpu = B.med([f["cpu_s"]["machine"] for f in floor])
    f_own = _med_known([_own(f["cpu_s"]) for f in floor])
    w_cpu = B.med([b["cpu_s_per_episode"]["machine"] for b in warm])
    w_own = _med_known([b["cpu_s_per_episode"]["own"] for b in warm])
    efficiency = {
        str(j): B.med([b["ceiling_efficiency"] for b in bs if b["ceiling_efficiency"] is not None])
        for j, bs in by_jobs.items()
    }
    known = [e for e in efficiency.values() if e is not None]
    return {
        "warm_first_call_ratio": B.ratio(w_first, f_first),
        "warm_vs_cold_first_call_ratio": B.ratio(w_first, c_first),
        "first_call_s_p50": {"raw_floor": f_first, "cold": c_first, "warm": w_first},
        **speedup_figures(cold, warm),
        "ceiling_efficiency": min(known) if known else None,
        "ceiling_efficiency_by_jobs": efficiency,
        # The short warm batch's own (its start and end weigh on it; see --ceiling-batch).
        "ceiling_efficiency_short_batch": B.med(
            [b["ceiling_efficiency"] for b in warm if b["ceiling_efficiency"] is not None]
        ),
        "cpu_per_episode_ratio": B.ratio(w_cpu, f_cpu),
        "cpu_per_episode_ratio_own": B.ratio(w_own, f_own),
        "cpu_s_per_episode": {"raw_floor": f_cpu, "warm": w_cpu, "raw_floor_own": f_own, "warm_own": w_own},
        "controller_cpu_ms_per_episode": B.med([b["controller_cpu_ms_per_episode"] for b in warm]),
        "controller_cpu_ms_per_episode_cold": B.med([b["controller_cpu_ms_per_episode"] for b in cold]),
    }


def speedup_figures(cold: list[dict[str, Any]], warm: list[dict[str, Any]]) -> dict[str, Any]:
    """``jobs1_warm_speedup``: the median of each pair's cold wall / warm wall (a pair ran back to back,
    under the same load), with every pair's figure and their spread, so that a reader sees how far one
    run's load moved it rather than one ratio of two single batches."""
    pairs = [B.ratio(c["wall"], w["wall"]) for c, w in zip(cold, warm, strict=True)]
    known = [p for p in pairs if p is not None]
    return {
        "jobs1_warm_speedup": B.med(known),
        "jobs1_warm_speedup_pairs": pairs,
        "jobs1_warm_speedup_spread": [min(known), max(known)] if known else None,
    }


def _own(cpu: dict[str, Any]) -> float | None:
    """B.CpuSpan.own of a span written out as a dict."""
    return None if cpu["docker"] is None else cpu["controller"] + cpu["children"] + cpu["docker"]


def _med_known(xs: list[float | None]) -> float | None:
    return B.med([x for x in xs if x is not None])


def warm_tables(
    floor: list[dict[str, Any]],
    cold: list[dict[str, Any]],
    warm: list[dict[str, Any]],
    by_jobs: dict[int, list[dict[str, Any]]],
    fig: dict[str, Any],
    rep: B.Report,
) -> None:
    provider = rep.data["meta"]["provider"]
    depth = rep.data["meta"]["warm_depth"]
    n = rep.data["meta"]["batch"]
    f_first = [f["first_call_s"] for f in floor]
    rows = [["raw floor: exec of opencode run", B.fmt_s(B.med(f_first)), B.fmt_spread(f_first), "1.00x", "-"]]
    for label, bs in (("warm 0 (cold)", cold), (f"warm {depth}", warm)):
        xs = [x for b in bs for x in b["first_call_s"]]
        rows.append(
            [
                label,
                B.fmt_s(B.med(xs)),
                B.fmt_spread(xs),
                B.fmt_ratio(B.ratio(B.med(xs), B.med(f_first))),
                _pool_words(bs),
            ]
        )
    rep.say()
    rep.say(
        B.table(
            ["", "start → 1st request p50", "spread ms", "vs floor", "prepared/used/discarded"],
            rows,
            title=f"Attempts 2..{n} at --jobs 1: attempt start → first model request ({provider})",
        )
    )
    rep.say()
    f_cpu = [f["cpu_s"] for f in floor]
    rows = [
        [
            "raw floor (one episode)",
            "-",
            str(len(floor)),
            B.fmt_s(B.med([c["wall"] for c in f_cpu]), "s"),
            "-",
            B.fmt_s(B.med([c["machine"] for c in f_cpu]), "s"),
            B.fmt_s(_med_known([_own(c) for c in f_cpu]), "s"),
            B.fmt_s(B.med([c["controller"] for c in f_cpu])),
            "-",
            "-",
            "-",
        ]
    ]
    labelled = [(f"warm 0 (cold) #{i + 1}", b) for i, b in enumerate(cold)]
    throughput = [b for bs in by_jobs.values() for b in bs]
    labelled += [(f"warm {depth} #{i + 1}", b) for i, b in enumerate(warm) if b not in throughput]
    labelled += [
        (f"warm {depth}, throughput #{i + 1}", b) for bs in by_jobs.values() for i, b in enumerate(bs)
    ]
    for label, b in labelled:
        per = b["cpu_s_per_episode"]
        rows.append(
            [
                label,
                str(b["jobs"]),
                str(b["episodes"]),
                B.fmt_s(b["wall"], "s"),
                f"{b['episodes_per_min']:.2f}",
                B.fmt_s(per["machine"], "s"),
                B.fmt_s(per["own"], "s"),
                f"{b['controller_cpu_ms_per_episode']:.0f} ms",
                "-" if b["ceiling_episodes_per_min"] is None else f"{b['ceiling_episodes_per_min']:.2f}",
                "-" if b["ceiling_efficiency"] is None else f"{b['ceiling_efficiency']:.2f}",
                f"{b['scored']}/{b['episodes']}",
            ]
        )
    headers = ["batch", "jobs", "episodes", "wall", "episodes/min", "machine CPU/ep", "own CPU/ep"]
    headers += ["controller CPU/ep", "ceiling/min", "of ceiling", "scored"]
    rep.say(B.table(headers, rows, title=f"Batches and the CPU ceiling ({provider}, {os.cpu_count()} cores)"))
    rep.say(
        "machine CPU = /proc/stat busy time (everything on the machine); own CPU (docker only) = this "
        "process, its reaped descendants and the Docker engine's containers; ceiling = cores x 60 / machine CPU-s per "
        "episode of that batch"
    )
    rep.say()

    def r(key: str) -> str:
        return B.fmt_ratio(fig[key])

    eff = ", ".join(
        f"jobs {j}: {e:.2f}" for j, e in fig["ceiling_efficiency_by_jobs"].items() if e is not None
    )
    rep.say(
        f"warm_first_call_ratio {r('warm_first_call_ratio')} (target <= 0.20x; warm vs cold "
        f"{r('warm_vs_cold_first_call_ratio')}); jobs1_warm_speedup {r('jobs1_warm_speedup')} "
        f"({_spread_words(fig)}; target >= 1.30x); ceiling_efficiency {fig['ceiling_efficiency'] or 0:.2f} ({eff}; batches of "
        f"{rep.data['meta']['ceiling_batch']}+; the batch of {n} at jobs 1: "
        f"{fig['ceiling_efficiency_short_batch'] or 0:.2f}; target >= 0.90); "
        f"cpu_per_episode_ratio {r('cpu_per_episode_ratio')} (own CPU {r('cpu_per_episode_ratio_own')}; "
        f"target <= 1.10x); controller_cpu_ms_per_episode {fig['controller_cpu_ms_per_episode'] or 0:.0f} ms "
        f"(cold {fig['controller_cpu_ms_per_episode_cold'] or 0:.0f} ms; target <= 150 ms)"
    )
    rep.say(f"load average at start {rep.data['meta']['loadavg_start']}, now {B.loadavg()}")


async def main_ray(args: argparse.Namespace) -> int:
    n = args.batch or 8
    cpus = (args.jobs or [2])[0]
    reps = args.reps or 1
    meta = {"executor": "ray", "provider": args.provider, "reps": reps, "batch": n, "cpus": cpus}
    meta["loadavg_start"] = B.loadavg()
    rep = B.Report("episode", args.json, meta)
    rep.say(
        f"episode benchmark, executors: {n} hello-file episodes on Ray at {cpus} CPUs vs local --jobs {cpus}"
    )
    started = time.monotonic()
    import opencode_tui_core.batch
    import opencode_tui_core.episode
    import opencode_tui_core.model.endpoint
    import opencode_tui_core.runtime.opencode
    import opencode_tui_core.sandbox.docker  # noqa: F401

    task = load_task(TASK_DIR)
    config = AgentConfig(sandbox=SandboxConfig(provider=args.provider))
    status = 1
    try:
        status = await ray_comparison(task, config, n, cpus, reps, rep)
    finally:
        left = await B.reap_leftovers(OWNER)
    return B.close_report(rep, left, OWNER, started, status)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, help="engine episodes and raw floors (default 3, --quick 1)")
    p.add_argument("--batch", type=int, help="episodes per batch (default 4, --quick 2)")
    p.add_argument("--jobs", type=int, nargs="+", help="concurrency levels (default 1 2 4, --quick 1 2)")
    p.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="ray: only the batch, on Ray at --jobs CPUs (default 2) vs the local executor (needs Ray)",
    )
    p.add_argument(
        "--provider",
        choices=["docker", "local"],
        default="docker",
        help="docker (floor: docker run … opencode run && verify) or local (floor: the same under plain bwrap); also the provider of --executor ray's comparison",
    )
    p.add_argument(
        "--warm",
        action="store_true",
        help="only the warm pool: attempt start → first model request against the raw floor, warm 0 vs "
        "warm-ahead at --jobs 1, warm-ahead at --jobs (default 1 and the core count), CPU per episode",
    )
    p.add_argument("--warm-depth", type=int, default=2, help="batch.warm of the warm batches (default 2)")
    p.add_argument(
        "--ceiling-batch",
        type=int,
        help="--warm: episodes of each throughput batch (default 12, --quick the --batch size; at least 2 x jobs)",
    )
    B.add_common_args(p)
    args = p.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
