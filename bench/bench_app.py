"""Bench the app's pages on a big profile against a small one.

    .venv/bin/python bench/bench_app.py [--events 1000000] [--steps 20000]

Writes two synthetic profiles (large: 1,000,000 trace events, 1472 tiles x 20,000 steps of
per-tile liveness on IPU0, 20,000 liveness steps per IPU; small: 2,000 events, 200 steps)
to a temporary folder, opens them through the app's cache as `popviz serve` would, then
times each page's layout and callbacks, called directly (median of 3 warm runs). Prints
large / small ratios; the target is <= 3 for warm calls. The first (cold) visit, which
reads the file and builds the indexes, is reported on its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tooling/: the repository's test and bench tools

from popviz_app import create_app, render  # noqa: E402

from popviz.format import write_report  # noqa: E402
from tooling.testing.synthetic import synthetic_report  # noqa: E402

PAGES = ["/summary", "/trace", "/liveness", "/memory", "/stages", "/exchange", "/operations"]


def _time(fn: Callable[[], Any], repeat: int = 3) -> float:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def _cases(app: Any, rel: str, end: float, steps: int) -> dict[str, Callable[[], Any]]:
    ctx, cb, q = app.popviz_context, app.popviz_callbacks, f"?profile={rel}"
    cases: dict[str, Callable[[], Any]] = {
        f"page {p}": (lambda p=p: render(ctx, p, q)) for p in PAGES}
    cases.update({
        "trace zoom: all": lambda: cb["trace.zoom"]({"xaxis.autorange": True}, q),
        "trace zoom: 1/10": lambda: cb["trace.zoom"]({"xaxis.range": [end * .4, end * .5]}, q),
        "trace zoom: 1/1e4": lambda: cb["trace.zoom"](
            {"xaxis.range": [end * .5, end * .5 + end / 1e4]}, q),
        "liveness zoom: half": lambda: cb["liveness.zoom"]({"xaxis.range": [0, steps / 2]}, q),
        "liveness click": lambda: cb["liveness.click"](
            {"points": [{"x": steps // 3, "customdata": ["", "", 0, 0]}]}, q),
        "tile heat: all": lambda: cb["liveness.heat"](0, {"yaxis.autorange": True}, q),
        "tile heat: 1/100": lambda: cb["liveness.heat"](
            0, {"yaxis.range": [steps * .5, steps * .51]}, q),
        "memory pick IPU": lambda: cb["memory.pick_ipu"](1, q),
        "memory pick tile": lambda: cb["memory.pick_tile"]({"points": [{"x": 700}]}, None, 1,
                                                           q),
        "ops filter+sort": lambda: cb["operations.refresh"](
            3, 25, [{"column_id": "cycles", "direction": "desc"}],
            "{op_class} contains conv && {cycles} > 5000", q),
    })
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        big = synthetic_report(events=args.events, steps=args.steps, microbatches=16,
                               tile_liveness_ipus=1, num_ops=20_000, model="large")
        write_report(big, root / "large.h5")
        del big
        write_report(synthetic_report(events=2_000, steps=200, tile_liveness_ipus=1,
                                      model="small"), root / "small.h5")
        print(f"wrote profiles in {time.perf_counter() - t:.1f} s "
              f"(large.h5 {(root / 'large.h5').stat().st_size / 2**20:.0f} MiB)")
        app = create_app(root)
        ends, results = {}, {}
        for rel in ("small.h5", "large.h5"):
            profile = app.popviz_context.cache.get(rel).profile
            ends[rel] = float(profile.summary["step_cycles"])
            steps = int(profile.liveness["step"].max()) + 1
            cold = {}
            for page in PAGES:  # first visits: read tables, build indexes and caches
                cold[page] = _time(lambda page=page, rel=rel: render(app.popviz_context, page,
                                                             f"?profile={rel}"), 1)
            results[rel] = {"cold": cold, "warm": {name: _time(fn) for name, fn in
                                                   _cases(app, rel, ends[rel], steps).items()}}
        print(f"\n{'first visit (cold)':24} {'small ms':>10} {'large ms':>10}")
        for page in PAGES:
            print(f"{page:24} {results['small.h5']['cold'][page] * 1e3:10.1f} "
                  f"{results['large.h5']['cold'][page] * 1e3:10.1f}")
        print(f"\n{'warm call':24} {'small ms':>10} {'large ms':>10} {'ratio':>7}")
        worst = 0.0
        for name, small in results["small.h5"]["warm"].items():
            large = results["large.h5"]["warm"][name]
            ratio = large / small
            worst = max(worst, ratio)
            print(f"{name:24} {small * 1e3:10.1f} {large * 1e3:10.1f} {ratio:7.2f}"
                  + ("  > 3" if ratio > 3 else ""))
        print(f"\nworst warm ratio {worst:.2f} (target <= 3)")


if __name__ == "__main__":
    main()
