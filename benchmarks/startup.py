"""Start-up benchmark: how long each ``opencode-tui`` command takes before it needs the engine.

    python benchmarks/startup.py            # 20 runs of each command
    python benchmarks/startup.py --quick    # 5 runs (CI: a few seconds)
    python benchmarks/startup.py --check    # exit 1 if a command starts in more than TARGET_MS over
                                            # the baseline (never used by tests)

Each command is a fresh process started the way the console script starts it (``from opencode_tui.cli
import main``), with this checkout first on ``PYTHONPATH``: ``--help``, ``--version``, every
sub-command's ``--help``, and ``--provider`` given a wrong name (the registry is read then, to name the
registered providers). The baseline, measured in the same run, interleaved with the commands (so that
the machine's load falls on both alike), is ``python -c pass``: the interpreter's own start.

Reported: the median wall time of each, its ratio to the baseline, and the time over the baseline
(what opencode-tui adds); target: under TARGET_MS for every command. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 100.0
ENTRY = "import sys; from opencode_tui.cli import main; sys.exit(main())"
SUBCOMMANDS = ("run", "open", "runs", "diff", "attach", "sweep", "export", "samples", "doctor")

COMMANDS: dict[str, list[str]] = {
    "baseline: python -c pass": ["-c", "pass"],
    "--help": ["-c", ENTRY, "--help"],
    "--version": ["-c", ENTRY, "--version"],
    **{f"{name} --help": ["-c", ENTRY, name, "--help"] for name in SUBCOMMANDS},
    "run --provider nosuch (usage error)": ["-c", ENTRY, "run", "x", "--provider", "nosuch"],
}
BASELINE = "baseline: python -c pass"


def _once(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )
    return time.perf_counter() - start


def measure(repeats: int) -> dict[str, list[float]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for args in COMMANDS.values():  # warm the file cache (and .pyc files) once, unmeasured
        _once(args, env)
    for _ in range(repeats):  # round-robin: load on the machine hits every command alike
        for name, args in COMMANDS.items():
            samples[name].append(_once(args, env))
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5 runs of each command")
    p.add_argument("--repeats", type=int, help="runs of each command (default 20, --quick 5)")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    p.add_argument(
        "--check", action="store_true", help=f"exit 1 if a command adds more than {TARGET_MS:g} ms"
    )
    args = p.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 20)
    samples = measure(repeats)
    base = statistics.median(samples[BASELINE])
    rows = []
    print(
        f"start-up, median of {repeats} (python {sys.version.split()[0]}); target: < {TARGET_MS:g} ms over baseline"
    )
    print(f"{'command':<40} {'median':>9} {'x baseline':>10} {'over baseline':>14}")
    missed = []
    for name, xs in samples.items():
        m = statistics.median(xs)
        over_ms = (m - base) * 1000
        rows.append(
            {"command": name, "median_s": m, "ratio": m / base, "over_baseline_ms": over_ms, "samples": xs}
        )
        flag = "" if name == BASELINE or over_ms < TARGET_MS else "  MISSED"
        if flag:
            missed.append(name)
        print(f"{name:<40} {m * 1000:>7.0f}ms {m / base:>10.2f} {over_ms:>12.0f}ms{flag}")
    print(
        f"{len(missed)} of {len(COMMANDS) - 1} commands over the target"
        + (f": {', '.join(missed)}" if missed else "")
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"repeats": repeats, "target_ms": TARGET_MS, "rows": rows}, indent=1)
        )
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
