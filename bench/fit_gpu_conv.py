"""The convolution model (popviz/target/gpu_conv.py) against cuDNN kernels timed on an H200.

    PYTHONPATH=. python bench/fit_gpu_conv.py            # the error of the constants in use
    PYTHONPATH=. python bench/fit_gpu_conv.py --fit      # grid search of its constants

Reads bench/data/gpu_conv_shapes_h200.json (bench/gpu_conv_shapes.py: ResNet-50's 23
convolutions at batch 32 and 64, fp32 and bf16, forward, input and weight gradient) and
prints the mean |log(modelled / measured)| per dtype and pass, beside the roofline it
replaced (FLOPs at `conv_efficiency` / `conv_backward_efficiency` plus `ramp_ns`), and the
worst cases.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popviz.target.gpu import H200_SXM, GpuCost  # noqa: E402
from popviz.target.gpu_conv import ConvShape, pass_ns  # noqa: E402

DATA = ROOT / "bench" / "data" / "gpu_conv_shapes_h200.json"
KINDS = {"forward": "forward", "input_grad": "input", "weight_grad": "weight"}
# kernels a pass launches besides its GEMM: a GEMM-path pass none, an implicit GEMM its
# copies (counted in the trace: 3-7 a pass); each pays `kernel_ns` to launch
LAUNCHES = 3


def load(path: Path = DATA) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["cases"])


def shape_of(c: dict[str, Any]) -> ConvShape:
    return ConvShape(c["batch"], c["cin"], c["cout"], c["kernel"] ** 2, c["side"] ** 2,
                     c["out_side"] ** 2, c["stride"], c["kernel"] == 1)


def modelled_ns(c: dict[str, Any], cost: GpuCost) -> float:
    return pass_ns(shape_of(c), KINDS[c["kind"]], c["dtype"] != "float32", H200_SXM, cost) \
        + LAUNCHES * cost.kernel_ns


def roofline_ns(c: dict[str, Any], cost: GpuCost) -> float:
    t = H200_SXM
    peak = t.bf16_flops if c["dtype"] != "float32" else t.tf32_flops
    eff = cost.conv_efficiency if c["kind"] == "forward" else cost.conv_backward_efficiency
    return c["flops"] / (peak * eff) * 1e9 + cost.ramp_ns + LAUNCHES * cost.kernel_ns


def errors(cases: list[dict[str, Any]], cost: GpuCost) -> np.ndarray:
    return np.array([np.log(modelled_ns(c, cost) / c["ns"]) for c in cases])


def report(cases: list[dict[str, Any]], cost: GpuCost) -> dict[tuple[str, str], float]:
    err = errors(cases, cost)
    old = np.array([np.log(roofline_ns(c, cost) / c["ns"]) for c in cases])
    out = {}
    for dtype in ("float32", "bfloat16"):
        for kind in KINDS:
            sel = np.array([c["dtype"] == dtype and c["kind"] == kind for c in cases])
            out[(dtype, kind)] = float(np.mean(np.abs(err[sel])))
            print(f"{dtype:9} {kind:12} {sel.sum():3} convolutions: mean |log error| "
                  f"{out[(dtype, kind)]:.3f} (roofline {np.mean(np.abs(old[sel])):.3f}); "
                  f"worst {np.exp(err[sel].min()):.2f}x .. {np.exp(err[sel].max()):.2f}x")
    print(f"all: {np.mean(np.abs(err)):.3f} (roofline {np.mean(np.abs(old)):.3f})")
    for i in np.argsort(-np.abs(err))[:6]:
        c = cases[i]
        print(f"    {c['dtype']:9} b{c['batch']} {c['kind']:12} ({c['cin']}, {c['cout']}, "
              f"{c['kernel']}x{c['kernel']}, stride {c['stride']}, {c['side']}^2): measured "
              f"{c['ns'] / 1e3:7.1f} us, modelled {np.exp(err[i]) * c['ns'] / 1e3:7.1f} us")
    return out


def fit(cases: list[dict[str, Any]], cost: GpuCost) -> GpuCost:
    grid = {"conv_gemm_efficiency": (0.45, 0.5, 0.55, 0.6),
            "conv_weight_grad_efficiency": (0.6, 0.7, 0.8),
            "conv_misaligned_efficiency": (0.15,),
            "conv_align4_efficiency": (0.25, 0.35, 0.45),
            "conv_copy_passes": (1.0, 1.2, 1.5),
            "conv_copy_fixed_ns": (3000.0, 4000.0, 5000.0)}
    best: tuple[float, GpuCost] | None = None
    for values in itertools.product(*grid.values()):
        trial = cost.with_values(**dict(zip(grid, values, strict=True)))
        score = float(np.mean(np.abs(errors(cases, trial))))
        if best is None or score < best[0]:
            best = (score, trial)
    assert best is not None
    print(f"best mean |log error| {best[0]:.3f}: " + ", ".join(
        f"{k} = {getattr(best[1], k):g}" for k in grid))
    return best[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fit", action="store_true", help="grid-search the constants")
    args = p.parse_args(argv)
    cases = load()
    cost = H200_SXM.cost
    if args.fit:
        cost = fit(cases, cost)
    report(cases, cost)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
