"""Batch norm's model (popviz/target/gpu_norm.py) against its CUDA kernels timed on an H200.

    PYTHONPATH=. python bench/fit_gpu_norm.py

Reads bench/data/gpu_norm_kernels_h200.json (bench/gpu_norm_kernels.py: 36 training-mode
batch norms over ResNet-50's shapes, batch 16 and 64, fp32 through cuDNN and bf16 through
PyTorch's native kernels) and prints each case's measured and modelled forward and backward
(through gpu_op_costs, as a plan costs them) beside the roofline it replaced (the input read
`norm_reads` times), and the mean |log error| of each; then the layer norms measured
beside them (rows x hidden, fp32 and bf16) against the roofline they keep.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popviz.target.gpu import H200_SXM  # noqa: E402
from popviz.target.gpu_cost import gpu_op_costs  # noqa: E402

DATA = ROOT / "bench" / "data" / "gpu_norm_kernels_h200.json"
# the forward's num_batches_tracked += 1 is an op of its own in a recording (about 1 us)
COUNTER_NS = 1000.0


def load(path: Path = DATA) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["cases"])


def ops_of(cases: list[dict[str, Any]]) -> pd.DataFrame:
    """Each case's forward and backward as a recording's ops rows."""
    rows = []
    for c in cases:
        n, ch, side = c["batch"], c["channels"], c["side"]
        size = 2 if c["dtype"] == "bfloat16" else 4
        act = f"[{n},{ch},{side},{side}]"
        values = n * ch * side * side
        for name, shapes, read in (
                ("aten.native_batch_norm.default", f"{act};[{ch}];[{ch}];[{ch}];[{ch}]", 1),
                ("aten.native_batch_norm_backward.default",
                 f"{act};{act};[{ch}];[{ch}];[{ch}];[{ch}];[{ch}]", 2)):
            rows.append({"op": name, "op_class": "norm", "phase": "forward", "flops": 0,
                         "bytes_read": read * values * size, "bytes_written": values * size,
                         "dtype": c["dtype"], "shapes": shapes, "out_shape": act})
    return pd.DataFrame(rows)


def table(cases: list[dict[str, Any]]) -> pd.DataFrame:
    ops = ops_of(cases)
    modelled = gpu_op_costs(ops, H200_SXM)["cycles"].to_numpy(np.float64)
    plain = ops.assign(op="aten.layer_norm_like.default")  # the roofline every norm had
    before = gpu_op_costs(plain, H200_SXM)["cycles"].to_numpy(np.float64)
    out = []
    for i, c in enumerate(cases):
        for j, key in ((0, "forward_ns"), (1, "backward_ns")):
            measured = c[key] - (COUNTER_NS if j == 0 else 0.0)
            out.append({"dtype": c["dtype"], "shape": f"{c['batch']}x{c['channels']}x"
                        f"{c['side']}x{c['side']}", "pass": "F" if j == 0 else "B",
                        "measured_us": measured / 1e3, "modelled_us": modelled[2 * i + j] / 1e3,
                        "roofline_us": before[2 * i + j] / 1e3})
    frame = pd.DataFrame(out)
    frame["error"] = np.log(frame["modelled_us"] / frame["measured_us"])
    frame["roofline_error"] = np.log(frame["roofline_us"] / frame["measured_us"])
    return frame


def layer_norm_table(path: Path = DATA) -> pd.DataFrame:
    """Each measured layer norm's forward and backward against the roofline (`norm_reads`)."""
    cases = json.loads(path.read_text()).get("layer_norm", [])
    rows = []
    for c in cases:
        size = 2 if c["dtype"] == "bfloat16" else 4
        act, values = f"[{c['rows']},{c['hidden']}]", c["rows"] * c["hidden"]
        for name, read in (("aten.native_layer_norm.default", 1),
                           ("aten.native_layer_norm_backward.default", 2)):
            rows.append({"op": name, "op_class": "norm", "phase": "forward", "flops": 0,
                         "bytes_read": read * values * size, "bytes_written": values * size,
                         "dtype": c["dtype"], "shapes": act, "out_shape": act})
    modelled = gpu_op_costs(pd.DataFrame(rows), H200_SXM)["cycles"].to_numpy(np.float64)
    out = []
    for i, c in enumerate(cases):
        for j, key in ((0, "forward_ns"), (1, "backward_ns")):
            out.append({"dtype": c["dtype"], "shape": f"{c['rows']}x{c['hidden']}",
                        "pass": "F" if j == 0 else "B", "measured_us": c[key] / 1e3,
                        "modelled_us": modelled[2 * i + j] / 1e3})
    frame = pd.DataFrame(out)
    frame["error"] = np.log(frame["modelled_us"] / frame["measured_us"])
    return frame


def main() -> int:
    frame = table(load())
    print(frame.round(2).to_string(index=False))
    summary = frame[["dtype", "pass"]].assign(
        error=frame["error"].abs(), roofline_error=frame["roofline_error"].abs()).groupby(
        ["dtype", "pass"]).mean()
    print("\nmean |log error| (model, roofline it replaced):")
    print(summary.round(3).to_string())
    layer = layer_norm_table()
    if len(layer):
        print("\nlayer norms (the roofline, `norm_reads`):")
        print(layer.round(2).to_string(index=False))
        print(layer.assign(error=layer["error"].abs()).groupby(["dtype", "pass"])["error"]
              .mean().round(3).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
