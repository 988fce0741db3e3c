"""TUI benchmark: terminal-pane ingest rate, event-loop latency while streaming, key response, start-up.

    python benchmarks/tui.py                 # 50 MB of mixed ANSI output through a headless live app
    python benchmarks/tui.py --mb 10 --check # smaller; exit 1 if the ingest target is missed
    python benchmarks/tui.py --startup       # also: first screen on a 100k-event run directory

Live path, end to end: TerminalOutput events are emitted on a real ``core.events.EventBus`` (by a
stand-in for the engine, the same way an episode emits them), arrive through ``bus.queue()``, are
batched by the run screen and ingested by the terminal pane, which is redrawn while they stream.

Reported, all measured in this run on this machine:
- baseline: plain line splitting (``str.split("\\n")`` into a list) of the same data;
- ingest: MB/s from the first event emitted to the last byte in the terminal pane, and its ratio to
  the baseline; target >= 20 MB/s;
- event-loop latency: the worst and 99th-percentile lateness of a 5 ms ticker while streaming
  (how long the UI could not react);
- key response: a key pressed half-way through the stream, time until its action ran.

``--rate 5`` paces the stream like a process writing 5 MB/s (heavy but real output) instead of a flood:
then the ingest figure is the pacing, and the latency figures are what a user would feel.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.control import EpisodeControl  # noqa: E402
from core.events import EpisodeStarted, EventBus, Phase, PhaseChanged, TerminalOutput  # noqa: E402
from opencode_tui.app import OpenCodeTUI  # noqa: E402
from opencode_tui.screens.run import RunScreen  # noqa: E402
from opencode_tui.widgets.terminal import TerminalView  # noqa: E402

TARGET_MB_S = 20.0
TICK_S = 0.005


def make_chunks(total_bytes: int) -> list[str]:
    """Mixed terminal output (colours, progress bars with carriage returns, long lines, unicode), cut into
    chunks of 4-64 KB the way reads from a pipe or a PTY arrive."""
    lines: list[str] = []
    for i in range(4000):
        kind = i % 8
        if kind == 0:
            lines.append(
                f"\x1b[2m2025-05-14T09:{i % 60:02d}:00\x1b[0m \x1b[1;34mINFO\x1b[0m compiling module_{i}.py ... "
                f"\x1b[32mok\x1b[0m"
            )
        elif kind == 1:
            lines.append(
                "".join(f"\r\x1b[36m[{'=' * p}{' ' * (20 - p)}]\x1b[0m {p * 5:3d}%" for p in range(0, 21, 4))
            )
        elif kind == 2:
            lines.append(f"✓ test_case_{i} passed — 0.{i % 100:02d}s · ünïcödé ✔ 日本語")
        elif kind == 3:
            lines.append(
                f"\x1b[31merror\x1b[0m: src/file_{i}.c:{i}:7: \x1b[1mundefined reference to `foo_{i}'\x1b[0m"
            )
        elif kind == 4:
            lines.append("x" * 230 + f" long line {i}")
        elif kind == 5:
            lines.append(
                f"\x1b[38;5;{i % 256}m256-colour\x1b[0m \x1b[48;2;30;30;{i % 256}mtruecolour\x1b[0m cell {i}"
            )
        else:
            lines.append(f"plain output line {i} with some words in it to make it a typical length")
    block = "\r\n".join(lines) + "\r\n"
    chunks: list[str] = []
    size = 0
    sizes = (4096, 16384, 65536, 8192, 32768)
    pos = 0
    n = 0
    while size < total_bytes:
        want = sizes[n % len(sizes)]
        n += 1
        if pos + want > len(block):
            pos = 0
        chunk = block[pos : pos + want]
        pos += want
        chunks.append(chunk)
        size += len(chunk.encode())
    return chunks


def baseline_split(chunks: list[str]) -> float:
    """Seconds to split the same data into lines with plain ``str.split`` (the floor for any ingest)."""
    start = time.perf_counter()
    lines: list[str] = [""]
    for chunk in chunks:
        parts = chunk.split("\n")
        lines[-1] += parts[0]
        lines.extend(parts[1:])
    return time.perf_counter() - start


class StreamingEngine(EpisodeControl):
    """Stand-in for the engine: emits the chunks on a real EventBus, yielding to the loop between reads."""

    def __init__(self) -> None:
        self.bus = EventBus()
        self._done = asyncio.Event()

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    async def cancel(self) -> None:
        self._done.set()

    @property
    def kept(self) -> bool:
        return False

    @property
    def keep_changeable(self) -> bool:
        return True

    def keep_sandbox(self, keep: bool = True) -> None:
        pass

    async def open_shell(self, cols: int = 80, rows: int = 24):
        raise RuntimeError("no shell in the benchmark")

    async def wait(self) -> object:
        await self._done.wait()
        return None

    async def stream(self, chunks: list[str], yield_every: int = 256 * 1024, rate_mb_s: float = 0.0) -> None:
        self.bus.emit(
            EpisodeStarted(
                run_id="bench",
                task_id="bench",
                provider="local",
                opencode_version="1.18.32",
                run_budget_s=600,
                close_budget_s=30,
                model="scripted",
            )
        )
        self.bus.emit(PhaseChanged(phase=Phase.AGENT))
        since_yield = 0
        sent = 0
        start = time.perf_counter()
        for chunk in chunks:
            self.bus.emit(TerminalOutput(stream="pty", data=chunk))
            since_yield += len(chunk)
            sent += len(chunk)
            if rate_mb_s:  # paced like a real process writing at this rate
                ahead = sent / (rate_mb_s * 1e6) - (time.perf_counter() - start)
                await asyncio.sleep(max(ahead, 0))
            elif since_yield >= yield_every:  # a reader hands over what one read returned, then awaits more
                since_yield = 0
                await asyncio.sleep(0)


async def run_stream(total_mb: float, rate_mb_s: float = 0.0) -> dict[str, float]:
    chunks = make_chunks(int(total_mb * 1024 * 1024))
    total_chars = sum(len(c) for c in chunks)
    total_bytes = sum(len(c.encode()) for c in chunks)
    base_s = min(baseline_split(chunks) for _ in range(3))

    engine = StreamingEngine()
    app = OpenCodeTUI(control=engine)
    key_at: dict[str, float] = {}
    original = TerminalView.action_toggle_follow

    def recording_toggle(self: TerminalView) -> None:
        key_at.setdefault("handled", time.perf_counter())
        original(self)

    TerminalView.action_toggle_follow = recording_toggle  # type: ignore[method-assign]
    try:
        async with app.run_test(size=(160, 45)) as pilot:
            screen = app.screen
            assert isinstance(screen, RunScreen)
            term = screen.terminal
            lateness: list[float] = []
            streaming = True

            async def ticker() -> None:
                while streaming:
                    t = time.perf_counter()
                    await asyncio.sleep(TICK_S)
                    lateness.append(time.perf_counter() - t - TICK_S)

            async def press_midway() -> None:
                while term.rendered.chars < total_chars // 2:  # noqa: ASYNC110 (polling the pane, no event to wait on)
                    await asyncio.sleep(0.001)
                key_at["pressed"] = time.perf_counter()
                await pilot.press("l")

            await pilot.pause(0.5)  # let start-up finish (first paint, heap freeze): start-up is timed apart
            tick_task = asyncio.create_task(ticker())
            key_task = asyncio.create_task(press_midway())
            start = time.perf_counter()
            await engine.stream(chunks, rate_mb_s=rate_mb_s)
            emitted = time.perf_counter()
            while term.rendered.chars < total_chars:  # noqa: ASYNC110 (polling the pane, no event to wait on)
                await asyncio.sleep(0.001)
            ingested = time.perf_counter()
            screen.redraw()
            await pilot.pause()
            drawn = time.perf_counter()
            streaming = False
            await tick_task
            await key_task
            assert term.rendered.count > 0
            await engine.cancel()
    finally:
        TerminalView.action_toggle_follow = original  # type: ignore[method-assign]
    mb = total_bytes / 1e6
    ingest_s = ingested - start
    lateness.sort()
    return {
        "mb": mb,
        "lines": float(term.rendered.count),
        "baseline_mb_s": mb / base_s,
        "ingest_mb_s": mb / ingest_s,
        "emit_s": emitted - start,
        "ingest_s": ingest_s,
        "drawn_s": drawn - start,
        "worst_tick_ms": lateness[-1] * 1000 if lateness else float("nan"),
        "p99_tick_ms": lateness[int(len(lateness) * 0.99)] * 1000 if lateness else float("nan"),
        "median_tick_ms": statistics.median(lateness) * 1000 if lateness else float("nan"),
        "ticks": float(len(lateness)),
        "key_ms": (key_at["handled"] - key_at["pressed"]) * 1000 if "handled" in key_at else float("nan"),
    }


def write_run(runs_dir: Path, n_events: int) -> Path:
    from core.artifacts import RunDir, RunInfo

    rd = RunDir.create(runs_dir, "startup")
    bus = EventBus()
    bus.subscribe(rd.append_event)
    t0 = datetime(2025, 5, 14, tzinfo=UTC)
    bus.emit(
        EpisodeStarted(
            ts=t0,
            run_id="startup",
            task_id="startup",
            provider="local",
            opencode_version="1.18.32",
            run_budget_s=600,
            close_budget_s=30,
            model="scripted",
        )
    )
    for i in range(1, n_events):
        bus.emit(
            TerminalOutput(
                ts=t0 + timedelta(milliseconds=i),
                stream="pty",
                data=f"\x1b[3{i % 8}m{i:>7}\x1b[0m building module {i % 97} ... ok\r\n",
            )
        )
    rd.write_run_info(RunInfo(run_id="startup", task_id="startup", provider="local", started_at=t0))
    rd.close()
    return rd.path


async def run_startup(n_events: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_run(Path(tmp), n_events)
        start = time.perf_counter()
        app = OpenCodeTUI(run_dir=path)
        async with app.run_test(size=(160, 45)) as pilot:
            first = time.perf_counter() - start
            screen = app.screen
            while screen.replay_loading:
                await pilot.pause(0.01)
            loaded = time.perf_counter() - start
            assert screen.total == n_events
    return {"events": float(n_events), "first_screen_s": first, "all_events_s": loaded}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=50.0, help="megabytes of terminal output (default 50)")
    p.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="emit at this many MB/s like a real process (default 0: as fast as possible)",
    )
    p.add_argument(
        "--startup", action="store_true", help="also time the first screen on a 100k-event run dir"
    )
    p.add_argument("--events", type=int, default=100_000, help="events in the start-up run directory")
    p.add_argument("--check", action="store_true", help=f"exit 1 if ingest < {TARGET_MB_S:g} MB/s")
    args = p.parse_args(argv)

    r = asyncio.run(run_stream(args.mb, args.rate))
    pace = f"emitted at {args.rate:g} MB/s" if args.rate else "emitted as fast as possible"
    print(
        f"terminal pane, {r['mb']:.1f} MB of mixed ANSI output ({r['lines']:,.0f} lines, {pace}), "
        "headless app, live path"
    )
    print(f"  baseline (plain line splitting, same data): {r['baseline_mb_s']:8.1f} MB/s")
    print(
        f"  TUI ingest (emit -> bus -> batches -> pane): {r['ingest_mb_s']:8.1f} MB/s   "
        f"= {r['ingest_mb_s'] / r['baseline_mb_s']:.2f}x baseline   target >= {TARGET_MB_S:g} MB/s"
    )
    print(
        f"  ingested in {r['ingest_s']:.2f}s (engine emitting for {r['emit_s']:.2f}s), last frame drawn at "
        f"{r['drawn_s']:.2f}s"
    )
    print(
        f"  event-loop lateness of a {TICK_S * 1000:g} ms ticker while streaming: worst {r['worst_tick_ms']:.1f} ms, "
        f"p99 {r['p99_tick_ms']:.1f} ms, median {r['median_tick_ms']:.2f} ms ({r['ticks']:.0f} ticks)"
    )
    print(f"  key pressed mid-stream handled after {r['key_ms']:.1f} ms")
    ok = r["ingest_mb_s"] >= TARGET_MB_S
    if args.startup:
        s = asyncio.run(run_startup(args.events))
        print(
            f"start-up on a {s['events']:,.0f}-event run directory: first screen {s['first_screen_s']:.3f}s, "
            f"all events loaded {s['all_events_s']:.2f}s (target: first screen < 1 s)"
        )
        ok = ok and s["first_screen_s"] < 1.0
    if args.check and not ok:
        print("FAILED: below target", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
