"""Where the IPU model's cycles go, per op class, with the two fitted factors and without
them (issue #29's first step, docs/notes/ipu-model-v4-research.md §6.1: instrument before
changing). For each calibration point named, the planned program is re-costed with
`amp_efficiency` = `conv_efficiency` = `vector_efficiency` = 1 (PopLibs' own plan and
popops' own vertex estimates, plus each compute set's sync and exchange fixed costs) and
with the fitted values, and the cycles of one step's passes are summed per op class:

    PYTHONPATH=. python bench/bench_ipu_classes.py
    PYTHONPATH=. python bench/bench_ipu_classes.py --points mk2-rn50-train-16x1ipu-mb20

Per class: ops, cycles at the estimates (share), cycles as fitted (share), the ratio, the
share of the class that is fixed cost (compute sets' syncs, exchanges' fixed cycles and a
vector op's exchanged bytes), and the median op's cycles. The fitted factors are bounded
to [0.7, 1], so no class's ratio can pass 1 / 0.7.

`--vector-at V [V ...]` then fits `amp_efficiency` and `conv_efficiency` together (one
factor, unbounded: a diagnostic) over the calibration's fit throughput points with
`vector_efficiency` held at each V (1 = popops' estimates) and prints the error of every
point that moves past 15% (about a minute: every point is planned once).

    PYTHONPATH=. python bench/bench_ipu_classes.py --vector-at 1.0 0.7
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tooling.calibration import load_points, prepare  # noqa: E402

POINTS = ("mk2-rn50-train-16x1ipu-mb20", "bow-resnext101-train-pod16-2stage-mb6",
          "bow-bertlarge-ph1-train-pod16-batch65536")


def class_table(point_id: str) -> tuple[pd.DataFrame, dict[str, float]]:
    points = {p["id"]: p for p in load_points()}
    if point_id not in points:
        raise SystemExit(f"unknown point {point_id!r}; e.g. {', '.join(POINTS)}")
    prepared = prepare(points[point_id])
    fitted = prepared.target.cost
    unit = fitted.at_estimates()
    ops = prepared.ops
    compute = prepared.pass_code >= 0
    frame = pd.DataFrame({"op_class": ops["op_class"].astype(str).to_numpy()[compute],
                          "estimate": prepared.op_cycles(unit)[compute],
                          "fitted": prepared.op_cycles(fitted)[compute]})
    assert prepared.terms is not None  # set by op_cycles: only the fitted factors differ
    frame["fixed"] = prepared.terms.fixed[compute]
    table = frame.groupby("op_class").agg(ops=("estimate", "size"),
                                          estimate=("estimate", "sum"),
                                          fitted=("fitted", "sum"),
                                          fixed=("fixed", "sum"),
                                          median_op=("fitted", "median"))
    table["estimate_share"] = table["estimate"] / table["estimate"].sum()
    table["fitted_share"] = table["fitted"] / table["fitted"].sum()
    table["fitted_over_estimate"] = table["fitted"] / table["estimate"]
    table["fixed_share"] = table["fixed"] / table["fitted"]
    facts = {"amp_efficiency": float(fitted.amp_efficiency),
             "conv_efficiency": float(fitted.conv_efficiency),
             "vector_efficiency": float(fitted.vector_efficiency),
             "step_estimate": float(prepared.step_cycles(unit)),
             "step_fitted": float(prepared.step_cycles(fitted))}
    return table.sort_values("fitted", ascending=False), facts


def render(point_id: str, table: pd.DataFrame, facts: dict[str, float]) -> str:
    lines = [f"{point_id}: amp_efficiency {facts['amp_efficiency']:.3g}, conv_efficiency "
             f"{facts['conv_efficiency']:.3g}, vector_efficiency "
             f"{facts['vector_efficiency']:.3g}; step {facts['step_estimate'] / 1e6:,.1f} M "
             "cycles at the estimates, "
             f"{facts['step_fitted'] / 1e6:,.1f} M as fitted",
             f"  {'op class':<15}{'ops':>7}{'estimate Mc':>13}{'share':>7}{'fitted Mc':>11}"
             f"{'share':>7}{'ratio':>7}{'fixed':>7}{'median op':>11}"]
    for cls, r in table.iterrows():
        lines.append(f"  {cls!s:<15}{int(r['ops']):>7}{r['estimate'] / 1e6:>13,.2f}"
                     f"{r['estimate_share']:>7.1%}{r['fitted'] / 1e6:>11,.2f}"
                     f"{r['fitted_share']:>7.1%}{r['fitted_over_estimate']:>7.2f}"
                     f"{r['fixed_share']:>7.0%}{r['median_op']:>11,.0f}")
    return "\n".join(lines)


def vector_at(values: list[float]) -> list[str]:
    from scipy.optimize import minimize_scalar

    from popviz.target.costmodel import DEFAULT_COST
    from tooling.calibration import Evaluator, quantitative

    points = [p for p in quantitative() if p["use"] == "fit" and p["kind"] == "throughput"]
    evaluator = Evaluator(points)
    weights = np.array([1.0 / float(p["tolerance"]) for p in points])
    now = evaluator.errors(DEFAULT_COST)
    lines = [f"{len(points)} fit throughput points; as fitted (amp_efficiency "
             f"{DEFAULT_COST.amp_efficiency:.3g}, vector_efficiency "
             f"{DEFAULT_COST.vector_efficiency:.3g}): mean |error| {np.abs(now).mean():.1%}"]
    for vector in values:
        def loss(amp: float, vector: float = vector) -> float:
            cost = DEFAULT_COST.with_values(amp_efficiency=amp, conv_efficiency=amp,
                                            vector_efficiency=vector)
            return float(np.sum((weights * np.log1p(evaluator.errors(cost))) ** 2))

        amp = float(minimize_scalar(loss, bounds=(0.3, 1.5), method="bounded").x)
        cost = DEFAULT_COST.with_values(amp_efficiency=amp, conv_efficiency=amp,
                                        vector_efficiency=vector)
        errors = evaluator.errors(cost)
        lines.append(f"vector_efficiency {vector:g} held, amp_efficiency fitted {amp:.3f}: "
                     f"mean |error| {np.abs(errors).mean():.1%}, max {np.abs(errors).max():.1%}")
        lines += [f"    {p['id']:<44} {e:+6.0%} (as fitted {e0:+.0%})"
                  for p, e, e0 in zip(points, errors, now, strict=True) if abs(e) > 0.15]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--points", nargs="+", default=list(POINTS),
                   help=f"calibration point ids (default: {', '.join(POINTS)})")
    p.add_argument("--vector-at", type=float, nargs="+", metavar="V",
                   help="also fit amp_efficiency alone with vector_efficiency held at each V")
    args = p.parse_args(argv)
    for point_id in args.points:
        t0 = time.perf_counter()
        table, facts = class_table(point_id)
        print(render(point_id, table, facts))
        print(f"  ({time.perf_counter() - t0:.1f} s)\n", flush=True)
    if args.vector_at:
        print("\n".join(vector_at(args.vector_at)))
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
