"""popviz's IPU model against PopLibs' own estimate of each layer, per op class (issue #29:
evidence that isolates a class). PopLibs pinned the cycles of 146 convolution and fully
connected layers (ResNet-50, Inception, MobileNet's depthwise and pointwise, VGG-16,
AlexNet, BERT's matmuls, small FC layers) on its Mk1 and Mk2 IPU models: forward, input
gradient, weight gradient and update, half data (tooling/poplibs_benchmarks.py says where
from). Each is recorded as PyTorch runs it and compiled by popviz for the same IPU
(tooling/poplibs_layers.py), and the per-class errors are printed twice: with every fitted
factor at 1 (popviz's plan at PopLibs' own vertex and exchange estimates: this is what
should match) and as fitted (the factors' share of hardware over estimate).

    PYTHONPATH=. python bench/bench_poplibs_layers.py            # ~30 s
    PYTHONPATH=. python bench/bench_poplibs_layers.py --worst 20 --targets mk2
    PYTHONPATH=. python bench/bench_poplibs_layers.py --fit      # ~4 min: plan_compute_set_cycles

Columns: layers, mean |log(popviz / PopLibs)|, the geometric-mean ratio, the worst
layer's ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popviz.target.costmodel import CostModel  # noqa: E402
from tooling.poplibs_layers import (  # noqa: E402
    class_errors,
    compare,
    fit_set_cycles,
    load_layers,
    set_cycles_error,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=["mk1", "mk2"],
                        choices=["mk1", "mk2"])
    parser.add_argument("--worst", type=int, default=10,
                        help="list this many layers furthest from PopLibs (at the estimates)")
    parser.add_argument("--fit", action="store_true",
                        help="fit plan_compute_set_cycles to these layers (mk1 and mk2) "
                             "and print it against the model's default")
    args = parser.parse_args(argv)
    if args.fit:
        return _fit()
    pd.set_option("display.width", 160)
    layers = load_layers()
    start = time.perf_counter()
    at_estimates = compare(layers, tuple(args.targets), at_estimates=True)
    fitted = compare(layers, tuple(args.targets))
    took = time.perf_counter() - start
    print(f"{len(layers)} PopLibs layers x {len(args.targets)} IPU models, planned twice "
          f"in {took:.1f} s\n")
    print("popviz's plan at PopLibs' estimates (every fitted factor 1):")
    print(class_errors(at_estimates).round(3).to_string(), "\n")
    print("as fitted (amp_efficiency, conv_efficiency, vector_efficiency of calibration.json):")
    print(class_errors(fitted).round(3).to_string(), "\n")
    worst = at_estimates.reindex(at_estimates["log_error"].abs()
                                 .sort_values(ascending=False).index).head(args.worst)
    print(f"furthest {args.worst} at the estimates:")
    print(worst[["layer", "class", "target", "poplibs", "popviz", "ratio"]]
          .round(3).to_string(index=False))
    return 0


def _fit() -> int:
    start = time.perf_counter()
    best, grid = fit_set_cycles(load_layers())
    default = CostModel().plan_compute_set_cycles
    print(f"plan_compute_set_cycles fitted to PopLibs' simulated cycles of its layers "
          f"(mk1 and mk2, every fitted factor 1) in {time.perf_counter() - start:.1f} s:")
    for value in sorted({0, best, default}):
        err = float(grid.loc[grid["cycles"] == value, "mean_abs_log"].iloc[0]) \
            if value in set(grid["cycles"]) else set_cycles_error(load_layers(), value)
        mark = " (best)" if value == best else ""
        mark += " (the model's default)" if value == default else ""
        print(f"  {value:>5} cycles a compute set: mean |log(popviz / PopLibs)| {err:.4f}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
