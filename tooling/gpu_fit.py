"""Checking and fitting the GPU cost model against measured kernel times per op class.

A measured side is an imported torch.profiler trace's `ops` table (`popviz import`: each
op's `gpu_ns` is the GPU time of the kernels it launched itself); a modelled side is a GPU
plan's ops. Both are summed per (pass, op class) with the same class names: conv (all
convolutions), matmul (GEMMs and attention), norm, reduction, and elementwise (which takes
copies and the rest: memory-bound kernels). `fit_gpu_cost` sets the fitted constants of
`GpuCost` to one measured run (bench/fit_gpu_cost.py prints the result and the check on the
runs kept out of the fit).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from popviz.compiler.gpu_compile import costed_gpu_plan
from popviz.options import Options
from popviz.recorder.program import Program
from popviz.target.gpu import GpuCost, GpuTarget
from popviz.target.gpu_cost import gpu_op_costs

CLASS_OF = {"conv": "conv", "grouped_conv": "conv", "depthwise_conv": "conv",
            "matmul": "matmul", "norm": "norm", "reduction": "reduction"}
# no longer among them: norm_reads, conv_efficiency, conv_backward_efficiency and ramp_ns.
# ResNet-50's norms are batch norms and its convolutions 2-D ones, which
# popviz/target/gpu_norm.py and gpu_conv.py time from their kernels' own measurements
FITTED = ("kernel_ns", "memory_efficiency")


def class_times(ops: pd.DataFrame, time_column: str) -> pd.Series:
    """ns per (pass, class) of an ops table (`gpu_ns` measured, `cycles` modelled)."""
    cls = ops["op_class"].astype(str).map(CLASS_OF).fillna("elementwise")
    passes = ops["pass"].astype(str).replace({"R": "B"})
    times = ops[time_column].to_numpy(np.float64)
    frame = pd.DataFrame({"pass": passes.to_numpy(), "op_class": cls.to_numpy(), "ns": times})
    frame = frame[frame["pass"].isin(["F", "B", "WU"])]
    return frame.groupby(["pass", "op_class"])["ns"].sum()


def compare_classes(measured_ops: pd.DataFrame, modelled_ops: pd.DataFrame) -> pd.DataFrame:
    """measured and modelled kernel ns per (pass, class), with the relative error of each
    (a plan's wait for the host is not kernel time: `host_wait_ns` is left out)."""
    m = class_times(measured_ops, "gpu_ns").rename("measured_ns")
    if "host_wait_ns" in modelled_ops:
        modelled_ops = modelled_ops.assign(cycles=modelled_ops["cycles"]
                                           - modelled_ops["host_wait_ns"])
    p = class_times(modelled_ops, "cycles").rename("modelled_ns")
    out = pd.concat([m, p], axis=1).fillna(0.0)
    out = out[out["measured_ns"] > 0]
    out["error"] = out["modelled_ns"] / out["measured_ns"] - 1.0
    return out


def kernel_ns_total(measured_ops: pd.DataFrame) -> float:
    """The measured GPU time of every kernel of the step's passes."""
    return float(class_times(measured_ops, "gpu_ns").sum())


def fit_gpu_cost(program: Program, options: Options, target: GpuTarget,
                 measured_ops: pd.DataFrame) -> tuple[GpuCost, pd.DataFrame]:
    """The fitted constants (least squares on the log of each class's modelled over
    measured time, weighted by the square root of its measured share) and the comparison
    table they give."""
    from scipy.optimize import least_squares

    _, _, _, ops = costed_gpu_plan(program, options, target)
    keep = ops["cycles"].to_numpy() > 0
    measured = class_times(measured_ops, "gpu_ns")
    weight = np.sqrt(measured / measured.sum())

    def model(values: np.ndarray) -> GpuCost:
        return replace(target.cost, **dict(zip(FITTED, values.tolist(), strict=True)))

    def residual(values: np.ndarray) -> np.ndarray:
        costed = ops.assign(cycles=np.where(keep, gpu_op_costs(ops, target, model(values))
                                            ["cycles"].to_numpy(), 0))
        modelled = class_times(costed, "cycles").reindex(measured.index).fillna(1.0)
        return (np.log(np.maximum(modelled, 1.0) / measured) * weight).to_numpy()

    start = np.array([getattr(target.cost, k) for k in FITTED], dtype=np.float64)
    lower = np.array([0.0, 0.05])
    upper = np.array([20_000.0, 1.0])
    # op times are whole ns: finite differences need steps well above one ns
    result = least_squares(residual, start, bounds=(lower, upper), x_scale=start + 1e-9,
                           diff_step=1e-3)
    cost = model(result.x)
    costed = ops.assign(cycles=np.where(keep, gpu_op_costs(ops, target, cost)["cycles"]
                                        .to_numpy(), 0))
    return cost, compare_classes(measured_ops, costed)
