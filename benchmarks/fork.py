"""Rerun and fork benchmark (issue 28): what a child run costs against its parent, measured in one run.

    python benchmarks/fork.py                    # 3 repetitions on local and docker
    python benchmarks/fork.py --quick            # 1 repetition on local and docker
    python benchmarks/fork.py --providers local --step-delay 1.0 --json out.json
    python benchmarks/fork.py --digests-only --reps 5   # the digests' cost alone, 5 pairs per provider

Per provider and repetition, with ``sample_tasks/fix-bug`` and the embedded scripted model:

1. **baseline**: an episode with workspace digests off (``debug.workspace_digests: false``; on is the
   default); its wall clock and agent phase.
2. **original**: the same with ``debug.workspace_digests`` on. Digest cost = the agent phase against
   the baseline's (ratio), and the digests' own time (``workspace_digests.jsonl``) / its agent phase.
3. **rerun** of the original (every call answered from its record): wall / the original's wall.
4. **fork --at 2** of the original: time from the episode's start (``EpisodeStarted``) to its first
   live model request, against the original's time from its start to its own request of step 3 (the
   same request, answered by the model there).

``--step-delay S`` gives every scripted step S seconds before its first byte (a model's latency,
which a replayed call does not pay). Ratios are medians over medians. Nothing may be left behind: the
containers of this process carry its owner label and are counted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench as B
import yaml

OWNER = B.setup()

from opencode_tui_core.artifacts import RunDirReader, RunFiles  # noqa: E402
from opencode_tui_core.config import AgentConfig  # noqa: E402
from opencode_tui_core.episode import Episode, child_inputs, load_parent  # noqa: E402
from opencode_tui_core.events import EpisodeStarted  # noqa: E402
from opencode_tui_core.tasks import load_task  # noqa: E402

TASK_DIR = B.ROOT / "sample_tasks" / "fix-bug"
FORK_AT = 2


def _task(base: Path, delay: float) -> Path:
    task = base / "task"
    shutil.copytree(TASK_DIR, task)
    if delay:
        data = yaml.safe_load((task / "trajectory.yaml").read_text())
        for step in data["steps"]:
            step["delay"] = delay
        (task / "trajectory.yaml").write_text(yaml.safe_dump(data))
    return task


def _start(run_dir: Path) -> float:
    for event in RunDirReader(run_dir).events():
        if isinstance(event, EpisodeStarted):
            return event.ts.timestamp()
    raise RuntimeError(f"{run_dir}: no episode_started event")


def _agent_calls(run_dir: Path) -> list[Any]:
    calls = [c for c in RunDirReader(run_dir).model_calls() if c.kind == "agent"]
    return sorted(calls, key=lambda c: c.started_at)


async def _episode(task: Path, provider: str, runs: Path, digests: bool) -> tuple[Path, float, float]:
    config = AgentConfig.model_validate(
        {
            "sandbox": {"provider": provider},
            "policy": {"max_attempts": 1},
            "debug": {"workspace_digests": digests},
        }
    )
    t0 = time.monotonic()
    result = await Episode(load_task(task), config, runs_dir=runs).run()
    wall = time.monotonic() - t0
    if result.reward != 1.0:
        raise RuntimeError(f"{provider}: the episode did not score 1: {result.summary}")
    return Path(result.run_dir), wall, result.durations_s.get("agent") or 0.0


async def _child(parent_dir: Path, lineage: str, fork_step: int | None = None) -> tuple[Path, float]:
    parent = load_parent(parent_dir)
    config, task, plan = child_inputs(parent, lineage=lineage, fork_step=fork_step)
    t0 = time.monotonic()
    result = await Episode(task, config, runs_dir=parent_dir.parent, child_of=(plan, parent)).run()
    wall = time.monotonic() - t0
    info = RunDirReader(Path(result.run_dir)).info()
    assert info is not None and info.replay is not None
    if lineage == "rerun" and not info.replay.reproduced:
        raise RuntimeError(f"the rerun diverged: {info.replay.divergence}")
    return Path(result.run_dir), wall


async def one(provider: str, delay: float, digests_only: bool = False) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="bench-fork-"))
    try:
        task, runs = _task(base, delay), base / "runs"
        _, base_wall, base_agent = await _episode(task, provider, runs, digests=False)
        orig, orig_wall, orig_agent = await _episode(task, provider, runs, digests=True)
        lines = [json.loads(line) for line in (orig / RunFiles.WORKSPACE_DIGESTS).read_text().splitlines()]
        digest_s = sum(float(line.get("elapsed_s") or 0) for line in lines)
        if any("digest" not in line for line in lines):
            raise RuntimeError(f"{provider}: a digest failed: {lines}")
        if digests_only:
            return {
                "baseline_wall_s": base_wall,
                "baseline_agent_s": base_agent,
                "original_wall_s": orig_wall,
                "original_agent_s": orig_agent,
                "digests_s": digest_s,
                "digests": float(len(lines)),
                "via_server": float(sum(line.get("via") == "server" for line in lines)),
            }
        _, rerun_wall = await _child(orig, "rerun")
        fork, _ = await _child(orig, "fork", FORK_AT)
        orig_to_call = _agent_calls(orig)[FORK_AT].started_at.timestamp() - _start(orig)
        live = [c for c in _agent_calls(fork) if c.replayed_from is None]
        fork_to_live = live[0].started_at.timestamp() - _start(fork)
        return {
            "baseline_wall_s": base_wall,
            "baseline_agent_s": base_agent,
            "original_wall_s": orig_wall,
            "original_agent_s": orig_agent,
            "digests_s": digest_s,
            "rerun_wall_s": rerun_wall,
            "original_to_step3_s": orig_to_call,
            "fork_to_live_s": fork_to_live,
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--providers", nargs="+", default=["local", "docker"])
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds before each scripted answer")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument(
        "--digests-only",
        action="store_true",
        help="only the digests' cost (baseline and original, no rerun or fork): cheap enough for more reps",
    )
    args = ap.parse_args()
    reps = 1 if args.quick else args.reps
    if args.digests_only:
        return _digests_only(args, reps)
    out = B.Report("fork", args.json, {"reps": reps, "step_delay": args.step_delay, "fork_at": FORK_AT})
    rows = []
    for provider in args.providers:
        samples: list[dict[str, float]] = []
        for i in range(reps):
            out.progress(f"{provider}: repetition {i + 1}/{reps}")
            samples.append(asyncio.run(one(provider, args.step_delay)))

        def m(key: str, s: list[dict[str, float]] = samples) -> float | None:
            return B.med([x[key] for x in s])

        result = {
            "samples": samples,
            "digest_agent_ratio": B.ratio(m("original_agent_s"), m("baseline_agent_s")),
            "digest_share_of_agent": B.ratio(m("digests_s"), m("original_agent_s")),
            "rerun_wall_ratio": B.ratio(m("rerun_wall_s"), m("original_wall_s")),
            "fork_to_live_ratio": B.ratio(m("fork_to_live_s"), m("original_to_step3_s")),
        }
        out.data[provider] = result
        rows.append(
            [
                provider,
                B.fmt_s(m("baseline_agent_s"), "s"),
                B.fmt_s(m("original_agent_s"), "s"),
                B.fmt_ratio(result["digest_agent_ratio"]),
                f"{100 * (result['digest_share_of_agent'] or 0):.1f}%",
                B.fmt_ratio(result["rerun_wall_ratio"]),
                B.fmt_ratio(result["fork_to_live_ratio"]),
            ]
        )
    out.say(
        B.table(
            [
                "provider",
                "agent (no digests)",
                "agent (digests)",
                "digests: agent ratio",
                "digests' share",
                "rerun / original wall",
                "fork → first live / original → step 3",
            ],
            rows,
            title=f"fix-bug, {reps} repetition(s), step delay {args.step_delay:g} s",
        )
    )
    left = B.leftovers(OWNER)["ours"] if "docker" in args.providers else []
    out.say(f"containers left behind: {len(left)}")
    out.finish()
    return 1 if left else 0


def _digests_only(args: argparse.Namespace, reps: int) -> int:
    """The digests' cost alone: per provider, ``reps`` pairs (no digests, then digests) of fix-bug."""
    out = B.Report("fork-digests", args.json, {"reps": reps, "step_delay": args.step_delay})
    rows = []
    for provider in args.providers:
        samples: list[dict[str, float]] = []
        for i in range(reps):
            out.progress(f"{provider}: pair {i + 1}/{reps}")
            samples.append(asyncio.run(one(provider, args.step_delay, digests_only=True)))

        def m(key: str, s: list[dict[str, float]] = samples) -> float | None:
            return B.med([x[key] for x in s])

        pair_ratios = [x["original_agent_s"] / x["baseline_agent_s"] for x in samples]
        result = {
            "samples": samples,
            "digest_agent_ratio": B.ratio(m("original_agent_s"), m("baseline_agent_s")),
            "pair_ratio_median": B.med(pair_ratios),
            "digest_share_of_agent": B.ratio(m("digests_s"), m("original_agent_s")),
        }
        out.data[provider] = result
        per = (m("digests_s") or 0) / max(m("digests") or 1, 1)
        rows.append(
            [
                provider,
                B.fmt_s(m("baseline_agent_s"), "s"),
                B.fmt_s(m("original_agent_s"), "s"),
                B.fmt_ratio(result["digest_agent_ratio"]),
                f"{100 * (result['digest_share_of_agent'] or 0):.2f}%",
                f"{1000 * per:.1f} ms",
                f"{sum(x['via_server'] for x in samples):.0f}/{sum(x['digests'] for x in samples):.0f}",
            ]
        )
    out.say(
        B.table(
            [
                "provider",
                "agent (no digests)",
                "agent (digests)",
                "agent ratio",
                "digests' share of agent",
                "per digest",
                "by the server",
            ],
            rows,
            title=f"workspace digests, fix-bug, {reps} pair(s), step delay {args.step_delay:g} s",
        )
    )
    left = B.leftovers(OWNER)["ours"] if "docker" in args.providers else []
    out.say(f"containers left behind: {len(left)}")
    out.finish()
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
