"""Fit the cost model's fitted constants to the published points of calibration.json.

    .venv/bin/python bench/fit_cost_model.py            # fit, print in-sample and LOO errors
    .venv/bin/python bench/fit_cost_model.py --write    # ... and store them in calibration.json

Deterministic: the same points give the same constants (least squares on log error, each
point weighted by 1 / its tolerance; see tooling.calibration.fit). Every fitted
constant's provenance (popviz/target/costmodel.py) names this procedure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from popviz.target.costmodel import CALIBRATION_FILE, CostModel, load_calibration
from tooling.calibration import FITTED, Evaluator, fit, leave_one_out, load_points

PROCEDURE = ("bench/fit_cost_model.py: scipy least_squares (trf) on log(modelled / published) "
             "weighted by 1 / tolerance over the points with use='fit'; start: CostModel() "
             "defaults; values rounded to 4 significant digits")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the fit in calibration.json")
    args = parser.parse_args()
    doc = load_calibration()
    points = [p for p in load_points() if p.get("use") == "fit"]
    t0 = time.perf_counter()
    ev = Evaluator(points)
    start = CostModel()
    cost = fit(ev, points, start)
    inside = ev.errors(cost)
    loo = leave_one_out(ev, points, start)
    print(f"fitted in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{k} = {getattr(cost, k):.4g}" for k in FITTED))
    for p, e, lo in zip(points, inside, loo, strict=True):
        print(f"  {p['id']:<42} in-sample {e:+7.1%}   leave-one-out {lo:+7.1%}")
    counted = sum(p["kind"] == "throughput" for p in points)  # what issue 20's target counts
    print(f"mean |error| over {len(points)} fitted points ({counted} published throughput / "
          f"latency figures): in-sample {np.mean(np.abs(inside)):.1%}, "
          f"leave-one-out {np.mean(np.abs(loo)):.1%} (target: <= 10% over >= 25)")
    if args.write:
        doc["fit"] = {"procedure": PROCEDURE, "points": [p["id"] for p in points],
                      "values": {k: getattr(cost, k) for k in FITTED}}
        Path(CALIBRATION_FILE).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {CALIBRATION_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
