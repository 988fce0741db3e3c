"""How long ``build_trajectory`` takes on a large run directory (the issue's bar: 100k events < 2 s).

Builds a synthetic run directory from the recorded ``tests/fixtures/runs/hello-file`` run, scaled up:
``--events`` lines in events.jsonl (the fixture's events repeated, with a few failures among them),
``--turns`` assistant messages with one tool call each in OpenCode's export, and one recorded model
call per turn carrying the fixture's full request/response bodies. Then times the export.

    python3 benchmarks/atif_export.py [--events 100000] [--turns 3000] [--repeat 3] [--json]
    python3 benchmarks/atif_export.py --quick     # 20,000 events, 600 turns, once (CI: it still runs)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opencode_tui_core.export.atif import build_trajectory  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "runs" / "hello-file"


def make_run_dir(dest: Path, events: int, turns: int) -> dict[str, int]:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "run.json").write_text((FIXTURE / "run.json").read_text())
    lines = [line for line in (FIXTURE / "events.jsonl").read_text().splitlines() if line]
    failure = next(
        (
            line
            for line in (ROOT / "tests/fixtures/runs/oom/events.jsonl").read_text().splitlines()
            if '"type":"failure"' in line
        ),
        None,
    )
    with (dest / "events.jsonl").open("w") as f:
        for i in range(events):
            f.write((failure if failure and i % 25_000 == 0 else lines[i % len(lines)]) + "\n")
    doc = json.loads((FIXTURE / "opencode" / "export.json").read_text())
    user, tool_msg = doc["messages"][0], doc["messages"][1]
    messages = [user]
    calls = [json.loads(line) for line in (FIXTURE / "model_calls.jsonl").read_text().splitlines() if line]
    agent_call = calls[1]
    with (dest / "model_calls.jsonl").open("w") as f:
        for t in range(turns):
            m = copy.deepcopy(tool_msg)
            mid = f"msg_bench_{t:06d}"
            m["info"]["id"] = mid
            m["parts"][1]["callID"] = f"call_{t}"
            m["parts"][1]["state"]["output"] = f"output of call {t}\n" * 20
            messages.append(m)
            rec = dict(agent_call, call_id=f"mc-bench-{t:06d}", message_id=mid)
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    doc["messages"] = messages
    (dest / "opencode").mkdir(exist_ok=True)
    (dest / "opencode" / "export.json").write_text(json.dumps(doc))
    return {
        "events": events,
        "turns": turns,
        "events_bytes": (dest / "events.jsonl").stat().st_size,
        "model_calls_bytes": (dest / "model_calls.jsonl").stat().st_size,
        "export_bytes": (dest / "opencode" / "export.json").stat().st_size,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--turns", type=int, default=3_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="20,000 events, 600 turns, one repetition (for CI)")
    args = ap.parse_args()
    if args.quick:
        args.events, args.turns, args.repeat = min(args.events, 20_000), min(args.turns, 600), 1
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        sizes = make_run_dir(run, args.events, args.turns)
        times, cpu = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            traj = build_trajectory(run)
            text = traj.to_json()
            times.append(round(time.perf_counter() - t0, 3))
            # CPU time as well: on a shared machine the wall clock also counts others' work.
            cpu.append(round(time.process_time() - c0, 3))
        result = {
            **sizes,
            "steps": len(traj.steps),
            "trajectory_bytes": len(text),
            "seconds": times,
            "cpu_seconds": cpu,
            "load_average_1m": round(os.getloadavg()[0], 1),
        }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>18}: {v}")
        print(f"{'best':>18}: {min(times):.3f} s wall, {min(cpu):.3f} s CPU  (bar: < 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
