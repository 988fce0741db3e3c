"""Soak benchmark: a long mixed batch with warm-ahead on; the controller's memory, leaks, every result.

    python benchmarks/soak.py                      # 200 episodes, --jobs 4, local provider
    python benchmarks/soak.py --quick              # 12 episodes (each sample at least once)
    python benchmarks/soak.py --provider docker --episodes 60 --json out.json

The batch (``opencode_tui_core.batch.run_batch``, what ``opencode-tui run --batch`` runs) cycles through the sample
tasks whose outcomes tests/core/test_episode.py pins (``EXPECTED``: scored ones, a kernel OOM kill, a
run deadline, a model that answers 429 then recovers, one that keeps answering 500), each copy under
an id of its own (``<sample>-<n>``), at ``--jobs`` (default 4) with the warm pool on (``batch.warm``:
the configured default where it is above 0 for these jobs on this machine, else ``--warm``, default 2)
and the policy's two attempts, as the test runs them.

Reported (and in ``--json``, one object):

- the controller's resident set (VmRSS of this process, where every episode runs) after the
  ``--checkpoint``-th result (default 20; half the batch when it is shorter) and after the last, and
  their ratio (``rss_growth_ratio``; the issue's bound: within 10 %); the peak;
- leaked sandboxes after the batch: the provider's sandboxes with this run's owner label
  (``listed``), Docker containers with it, and processes still alive below this process (the local
  provider's bwrap keepers); 0 expected;
- every result line: one per task in ``results.jsonl``, each with its sample's outcome (action,
  reward, failure kind) and its cleanup confirmed;
- the warm pool's counts, episodes per minute, the controller's CPU per episode.

Exit status 1 when a sandbox leaked or a result is missing or wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import _bench as B

OWNER = B.setup()

from opencode_tui_core.config import AgentConfig, warm_depth  # noqa: E402
from opencode_tui_core.samples import EXPECTED_OUTCOMES  # noqa: E402
from opencode_tui_core.tasks import Task, load_task  # noqa: E402

SAMPLES = B.ROOT / "sample_tasks"
EXPECTED = EXPECTED_OUTCOMES  # (action, reward, failure kind) per sample


def make_tasks(n: int, root: Path) -> list[tuple[Task, str]]:
    """``n`` tasks cycling through the samples, each copy with an id of its own: (task, sample)."""
    names = list(EXPECTED)
    out = []
    for i in range(n):
        sample = names[i % len(names)]
        d = root / f"{sample}-{i:03d}"
        shutil.copytree(SAMPLES / sample, d)
        text = (d / "task.yaml").read_text()
        (d / "task.yaml").write_text(text.replace(f"id: {sample}\n", f"id: {sample}-{i:03d}\n", 1))
        task = load_task(d)
        if task.id != f"{sample}-{i:03d}":
            raise RuntimeError(f"could not give the copy of {sample} its own id (task.yaml: {d})")
        out.append((task, sample))
    return out


def descendants() -> list[dict[str, Any]]:
    """Processes still alive below this one (zombies aside): what an episode left running."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        children.setdefault(ppid, []).append(int(entry))
        info[int(entry)] = (state, cmd.strip()[:200])
    out, todo = [], list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        state, cmd = info.get(pid, ("?", ""))
        if state != "Z":
            out.append({"pid": pid, "state": state, "command": cmd})
    return out


async def leaked(provider_name: str, config: AgentConfig) -> dict[str, Any]:
    from opencode_tui_core.sandbox.providers import get_provider

    listed = [r.sandbox_id for r in await get_provider(provider_name, config).listed(owner=OWNER)]
    containers = B.leftovers(OWNER)["ours"] if provider_name == "docker" else []
    procs = descendants()
    return {
        "sandboxes": listed,
        "containers": containers,
        "processes": procs,
        "count": len(set(listed) | set(containers)) + len(procs),
    }


def check_results(runs: Path, tasks: list[tuple[Task, str]]) -> dict[str, Any]:
    """Every task's line in results.jsonl, with its sample's outcome and its cleanup confirmed."""
    lines = [json.loads(line) for line in (runs / "results.jsonl").read_text().splitlines() if line]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_id.setdefault(line["task_id"], []).append(line)
    missing, wrong, unconfirmed, doubled = [], [], [], []
    for task, sample in tasks:
        got = by_id.get(task.id, [])
        if not got:
            missing.append(task.id)
            continue
        if len(got) > 1:
            doubled.append(task.id)
        line = got[-1]
        outcome = (line.get("action"), line.get("reward"), line.get("failure_kind"))
        if outcome != EXPECTED[sample]:
            wrong.append({"task": task.id, "expected": EXPECTED[sample], "got": outcome})
        if not line.get("cleanup_confirmed"):
            unconfirmed.append(task.id)
    return {
        "lines": len(lines),
        "missing": missing,
        "wrong": wrong,
        "cleanup_unconfirmed": unconfirmed,
        "doubled": doubled,
        "ok": not (missing or wrong or unconfirmed or doubled) and len(lines) == len(tasks),
    }


async def soak(args: argparse.Namespace, rep: B.Report) -> int:
    from opencode_tui_core.batch import run_batch

    n, jobs = rep.data["meta"]["episodes"], args.jobs
    checkpoint = min(args.checkpoint, max(1, n // 2))
    config = AgentConfig.model_validate(
        {"sandbox": {"provider": args.provider}, "policy": {"max_attempts": 2}}
    )
    depth = warm_depth(config.batch, jobs, os.cpu_count())
    if depth <= 0:  # the default gives no pool here (every core runs an episode): warm-ahead on anyway
        depth = args.warm
        config = config.model_copy(update={"batch": config.batch.model_copy(update={"warm": depth})})
    rep.data["meta"].update({"warm_depth": depth, "checkpoint": checkpoint})
    root = Path(tempfile.mkdtemp(prefix="octui-bench-soak-"))
    runs = root / "runs"
    tasks = make_tasks(n, root / "tasks")
    rss: dict[str, float] = {}
    done = 0

    def on_result(result: Any) -> None:
        nonlocal done
        done += 1
        if done == checkpoint:
            rss["checkpoint"] = B.rss_mb()
        if done % max(1, n // 10) == 0 or done == n:
            rep.progress(f"{done}/{n} results, RSS {B.rss_mb():.0f} MB")

    rep.say(
        f"soak: {n} episodes cycling {len(EXPECTED)} samples at --jobs {jobs}, warm {depth}, "
        f"{args.provider} provider"
    )
    rss["start"] = B.rss_mb()
    try:
        meter = B.CpuMeter(docker=args.provider == "docker")
        summary = await run_batch(
            [t for t, _ in tasks], config, runs_dir=runs, jobs=jobs, on_result=on_result
        )
        span = meter.span()
        rss["last"] = B.rss_mb()
        results = check_results(runs, tasks)
        left = await leaked(args.provider, config)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    growth = B.ratio(rss["last"], rss.get("checkpoint"))
    rep.data.update(
        {
            "rss_mb": {**rss, "peak": B.peak_rss_mb()},
            "rss_growth_ratio": growth,
            "leaked": left,
            "leaked_sandboxes": left["count"],
            "results": results,
            "results_ok": results["ok"],
            "summary_line": summary.line(),
            "warm": summary.warm.model_dump() if summary.warm else None,
            "wall_s": span.wall,
            "episodes_per_min": n / span.wall * 60,
            "controller_cpu_ms_per_episode": span.controller / n * 1000,
            "cpu_s": {**asdict(span), "own": span.own},
        }
    )
    pool = summary.warm
    rows = [
        ["controller RSS at start", f"{rss['start']:.0f} MB"],
        [f"controller RSS after result {checkpoint}", f"{rss.get('checkpoint', 0):.0f} MB"],
        [f"controller RSS after result {n}", f"{rss['last']:.0f} MB"],
        ["RSS growth (last / checkpoint)", B.fmt_ratio(growth) + " (bound: <= 1.10x)"],
        ["controller peak RSS", f"{B.peak_rss_mb():.0f} MB"],
        [
            "leaked sandboxes / containers / processes",
            f"{len(left['sandboxes'])} / {len(left['containers'])} / {len(left['processes'])}",
        ],
        ["result lines", f"{results['lines']} of {n}"],
        [
            "missing / wrong / cleanup unconfirmed",
            f"{len(results['missing'])} / {len(results['wrong'])} / {len(results['cleanup_unconfirmed'])}",
        ],
        [
            "warm pool prepared / used / discarded / failed",
            f"{pool.prepared} / {pool.used} / {pool.discarded} / {pool.failed}" if pool else "-",
        ],
        ["wall, episodes per minute", f"{span.wall:.0f} s, {n / span.wall * 60:.2f}"],
        ["controller CPU per episode", f"{span.controller / n * 1000:.0f} ms"],
        ["machine CPU per episode", f"{span.machine / n:.2f} s"],
    ]
    rep.say(B.table(["soak", "value"], rows, title=f"Soak ({args.provider}, {os.cpu_count()} cores)"))
    rep.say(summary.line())
    for w in results["wrong"][:10]:
        rep.say(f"  wrong outcome: {w['task']}: expected {w['expected']}, got {w['got']}")
    for p in left["processes"][:10]:
        rep.say(f"  process left running: {p['pid']} {p['command']}")
    rep.say(f"load average at start {rep.data['meta']['loadavg_start']}, now {B.loadavg()}")
    return 0 if results["ok"] and left["count"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, help="episodes in the batch (default 200, --quick 12)")
    p.add_argument("--jobs", type=int, default=4, help="concurrency (default 4)")
    p.add_argument("--provider", choices=["local", "docker"], default="local")
    p.add_argument(
        "--warm", type=int, default=2, help="batch.warm when the default gives no pool at --jobs (default 2)"
    )
    p.add_argument("--checkpoint", type=int, default=20, help="the result after which RSS is first read")
    B.add_common_args(p)
    args = p.parse_args(argv)
    n = args.episodes or (12 if args.quick else 200)
    meta = {"episodes": n, "jobs": args.jobs, "provider": args.provider, "cpus": os.cpu_count()}
    meta["loadavg_start"] = B.loadavg()
    rep = B.Report("soak", args.json, meta)
    started = time.monotonic()
    status = 1
    try:
        status = asyncio.run(soak(args, rep))
    finally:
        left = asyncio.run(B.reap_leftovers(OWNER))
    return B.close_report(rep, left, OWNER, started, status)


if __name__ == "__main__":
    sys.exit(main())
