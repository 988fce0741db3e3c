"""``benchmarks/episode.py --warm``'s jobs=1 speed-up: the median of back-to-back pairs, with every
pair's figure and their spread (one pair's ratio moved with the machine's load: 1.28-1.44 for the same
code). The figure is computed from the batches' wall times as the benchmark records them."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _load() -> Any:
    # Its `import _bench`; and _bench.setup() names this process as the owner of sandboxes: put back.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    owner = os.environ.get("OPENCODE_TUI_OWNER")
    try:
        spec = importlib.util.spec_from_file_location("bench_episode", ROOT / "benchmarks" / "episode.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_episode"] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
        if owner is None:
            os.environ.pop("OPENCODE_TUI_OWNER", None)
        else:
            os.environ["OPENCODE_TUI_OWNER"] = owner


def test_the_speedup_is_the_median_of_the_pairs_with_their_spread() -> None:
    bench = _load()
    cold = [{"wall": 13.0}, {"wall": 14.4}, {"wall": 12.8}]
    warm = [{"wall": 10.0}, {"wall": 10.0}, {"wall": 10.0}]
    fig = bench.speedup_figures(cold, warm)
    assert fig["jobs1_warm_speedup_pairs"] == [1.3, 1.44, 1.28]
    assert fig["jobs1_warm_speedup"] == 1.3  # the median pair, not the ratio of the medians' sides
    assert fig["jobs1_warm_speedup_spread"] == [1.28, 1.44]
    assert bench._spread_words(fig) == "median of 3 pairs, 1.28-1.44"


def test_one_loaded_pair_moves_the_median_less_than_it_moved_the_single_ratio() -> None:
    """A pair run while something else loaded the machine (its cold batch slowed twice as much as its
    warm one) shifts a one-pair figure; among three pairs it is one figure of the spread."""
    bench = _load()
    quiet = ({"wall": 14.0}, {"wall": 10.0})
    loaded = ({"wall": 22.0}, {"wall": 13.0})
    alone = bench.speedup_figures([loaded[0]], [loaded[1]])["jobs1_warm_speedup"]
    three = bench.speedup_figures([quiet[0], loaded[0], quiet[0]], [quiet[1], loaded[1], quiet[1]])
    assert abs(three["jobs1_warm_speedup"] - 1.4) < 1e-9 and abs(alone - 1.4) > 0.2
    assert three["jobs1_warm_speedup_spread"][1] == alone


def test_no_pair_says_so() -> None:
    bench = _load()
    fig = bench.speedup_figures([], [])
    assert fig["jobs1_warm_speedup"] is None and bench._spread_words(fig) == "no pair"
