"""Can one set of fitted factors serve training and inference? (docs/cost-model.md section
6, "Inference (held out)"). The 25 fitted training points and the 7 held-out C600
inference points are planned once; then three fits are compared side by side:

- as committed: the factors fitted on training only (calibration.json);
- all 32 points in the fit, every factor bounded to [0.7, 1] as usual;
- `conv_efficiency` held at 1 (PopLibs' estimate, what the inference points and the
  PopLibs layer benchmarks say of convolutions) with `vector_efficiency` free below its
  bound, fitted on training only: where the training gap would have to sit.

    PYTHONPATH=. python bench/bench_inference_factors.py     # about 2 minutes

Each row: the factors, the mean |error| over the training points and over the inference
points, and every inference point's error. A diagnostic: nothing here is written back.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tooling.calibration as calibration  # noqa: E402
from popviz.target.machines import ipu_target  # noqa: E402

FACTORS = ("amp_efficiency", "conv_efficiency", "vector_efficiency")


def main() -> int:
    start = time.perf_counter()
    points = calibration.load_points()
    training = [p for p in points if p["use"] == "fit"]
    inference = [p for p in points if p["kind"] == "throughput" and p["use"] == "holdout"
                 and not p["config"].get("training", True)]
    evaluator = calibration.Evaluator(training + inference)
    committed = ipu_target("mk2").cost
    rows = [("as committed (training fit)", committed),
            ("fitted on all 32", calibration.fit(evaluator, training + inference, committed)),
            ("conv at 1, vector free (training fit)",
             calibration.fit(evaluator, training, committed,
                             {**calibration.BOUNDS, "conv_efficiency": (0.999, 1.0),
                              "vector_efficiency": (0.1, 1.0)}))]
    print(f"{len(training)} training points, {len(inference)} inference points "
          f"({time.perf_counter() - start:.0f} s)\n")
    print(f"{'fit':<40}{'amp':>6}{'conv':>6}{'vector':>8}{'training':>10}{'inference':>11}"
          "   inference points")
    for label, cost in rows:
        train = evaluator.errors(cost, training)
        infer = evaluator.errors(cost, inference)
        values = "".join(f"{getattr(cost, k):>{w}.3g}" for k, w in zip(FACTORS, (6, 6, 8),
                                                                         strict=True))
        print(f"{label:<40}{values}{np.mean(np.abs(train)):>10.1%}"
              f"{np.mean(np.abs(infer)):>11.1%}   " + " ".join(f"{e:+.0%}" for e in infer))
    print("\ninference points: " + ", ".join(p["id"] for p in inference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
