"""Fault-watch benchmark: how soon a real OOM kill is seen live (``Sandbox.watch_faults``), per provider.

    python benchmarks/fault_watch.py              # docker and local, 8 kills each
    python benchmarks/fault_watch.py --quick      # 3 kills each
    python benchmarks/fault_watch.py --provider local --reps 15 --json out.json

One memory-limited sandbox per provider (128 MiB); each repetition runs a Python that allocates far
past the limit, so the kernel's OOM killer kills it. Measured from the kill's own time (the kernel's
record, the event's ``ts``):

- watch: until the live event reached the watcher's consumer (the target: within 2 s);
- baseline, exec: until the provider's ``exec`` of that command returned with its SIGKILL (the
  engine's own observation of the same death, in the same run).

The ratio is watch median / exec median: above 1 the live event comes later than the command's
own exit is seen. The pid the event names must be the killed command's (it prints its pid first).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import _bench as B

OWNER = B.setup()

from opencode_tui_core.events import FaultKind, SandboxFault  # noqa: E402
from opencode_tui_core.sandbox.base import Sandbox, SandboxSpec  # noqa: E402

HOG = "echo $$; exec python3 -c 'b = [bytearray(32 << 20) for _ in range(64)]'"
TARGET_S = 2.0


async def one_kill(sb: Sandbox) -> tuple[float, float, bool]:
    got: list[tuple[SandboxFault, datetime]] = []
    stop = asyncio.Event()

    async def collect() -> None:
        async for fault in sb.watch_faults(stop):
            got.append((fault, datetime.now(UTC)))

    task = asyncio.create_task(collect())
    await asyncio.sleep(0.5)
    r = await sb.exec(["/bin/sh", "-c", HOG], timeout=60)
    for _ in range(100):  # bounded: 5 s
        if any(f.kind is FaultKind.OOM_KILL for f, _ in got):
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 10)
    kill, arrived = next((f, at) for f, at in got if f.kind is FaultKind.OOM_KILL)
    pid_ok = r.stdout.split()[:1] == [str(kill.pid).encode()]
    return (arrived - kill.ts).total_seconds(), (r.ended_at - kill.ts).total_seconds(), pid_ok


async def bench(provider: str, reps: int) -> dict:
    if provider == "local":
        from opencode_tui_core.sandbox.local.provider import LocalProvider

        prov = LocalProvider(base_dir=Path(tempfile.mkdtemp(prefix="bench-faults-")) / "state")
        spec = SandboxSpec(run_id="bench-faults", memory_bytes=128 << 20)
    else:
        from opencode_tui_core.sandbox.docker.provider import DockerProvider

        prov = DockerProvider()
        spec = SandboxSpec(run_id="bench-faults", memory_bytes=128 << 20, image=B.IMAGE)
    sb = await prov.create(spec)
    watch, exec_, pids = [], [], []
    try:
        await one_kill(sb)  # warm-up, unrecorded
        for _ in range(reps):
            w, e, ok = await one_kill(sb)
            watch.append(w)
            exec_.append(e)
            pids.append(ok)
    finally:
        await sb.release()
    return {"watch": B.summary(watch), "exec": B.summary(exec_), "pid_named": all(pids)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", choices=["docker", "local"], action="append")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="3 repetitions")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    reps = 3 if args.quick else args.reps
    results, ok = {}, True
    for provider in args.provider or ["docker", "local"]:
        res = results[provider] = asyncio.run(bench(provider, reps))
        w, e = res["watch"], res["exec"]
        ratio = w["median"] / e["median"] if e["median"] else None
        print(
            f"{provider:7} watch median {w['median']:.3f}s (max {w['max']:.3f}s) · "
            f"exec median {e['median']:.3f}s · ratio {ratio if ratio is None else round(ratio, 2)} · "
            f"pid named: {res['pid_named']}"
        )
        ok = ok and w["max"] < TARGET_S and res["pid_named"]
    if args.json:
        args.json.write_text(__import__("json").dumps(results, indent=2))
    print(
        "ok" if ok else f"FAILED: a kill was seen later than {TARGET_S:g}s, or its pid was not the command's"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
