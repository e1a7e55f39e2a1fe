"""The GEMM wave model (popviz/target/gpu_gemm.py) against cuBLAS kernels timed on an H200.

    PYTHONPATH=. python bench/fit_gpu_gemm.py            # the error of the constants in use
    PYTHONPATH=. python bench/fit_gpu_gemm.py --fit      # grid search per kernel family

Reads bench/data/gpu_gemm_shapes_h200.json (bench/gpu_gemm_shapes.py: 264 GEMMs, fp32 and
bf16, M = 8 to 8192, the three GEMMs of a Linear and eager attention's batched ones) and
prints, per dtype, the mean |log(modelled / measured)| of the wave model in use, of the
model it replaced (FLOPs at the efficiency plus a fixed 19 us ramp), and the worst cases.
The GEMMs with GPT-2's vocabulary (50,257: no multiple of 8, align1 kernels) are printed
apart. --fit searches each family's fixed time, efficiency, HBM share, split-K time and
SM load rate on a grid and prints the best.
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
from popviz.target.gpu_gemm import gemm_ns  # noqa: E402

DATA = ROOT / "bench" / "data" / "gpu_gemm_shapes_h200.json"
VOCAB = 50257


def load(path: Path = DATA) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["cases"])


def modelled_ns(cases: list[dict[str, Any]], cost: GpuCost) -> np.ndarray:
    """The wave model's ns per case on the H200 target, launch (`kernel_ns`) included."""
    t = H200_SXM
    arr = {k: np.array([c[k] for c in cases], dtype=np.float64)
           for k in ("batch", "rows", "cols", "inner")}
    half = np.array([c["dtype"] != "float32" for c in cases])
    itemsize = np.where(half, 2.0, 4.0)
    b, m, n, k = arr["batch"], arr["rows"], arr["cols"], arr["inner"]
    moved = b * (m * k + k * n + m * n) * itemsize
    odd = np.array([VOCAB in (c["rows"], c["cols"], c["inner"]) for c in cases])
    odd_out = np.array([c["cols"] == VOCAB for c in cases])
    odd_rate = np.where(odd_out, cost.misaligned_output_matmul_efficiency,
                        cost.misaligned_matmul_efficiency)
    rate = np.where(half, t.bf16_flops * np.where(odd, odd_rate, cost.matmul_efficiency),
                    t.fp32_flops * cost.fp32_matmul_efficiency)
    return gemm_ns(b, m, n, k, moved, itemsize, rate, half, t, cost) + cost.kernel_ns


def ramp_ns(cases: list[dict[str, Any]]) -> np.ndarray:
    """The model before the wave model: FLOPs at 0.80 (half) / 0.75 (fp32) of the peak,
    plus a 18,950 ns ramp, at least the operands' bytes at 0.84 of HBM, plus the launch."""
    t = H200_SXM
    out = []
    for c in cases:
        half = c["dtype"] != "float32"
        size = 2 if half else 4
        flops = 2 * c["batch"] * c["rows"] * c["cols"] * c["inner"]
        rate = t.bf16_flops * 0.80 if half else t.fp32_flops * 0.75
        moved = c["batch"] * (c["rows"] * c["inner"] + c["inner"] * c["cols"]
                              + c["rows"] * c["cols"]) * size
        out.append(1456 + max(flops / rate * 1e9 + 18950,
                              moved / (t.hbm_bytes_per_s * 0.84) * 1e9))
    return np.array(out)


def errors(cases: list[dict[str, Any]], cost: GpuCost) -> np.ndarray:
    measured = np.array([c["ns"] for c in cases])
    return np.log(modelled_ns(cases, cost) / measured)


def report(cases: list[dict[str, Any]], cost: GpuCost) -> dict[str, float]:
    """Mean |log error| per dtype (aligned GEMMs), printed with the worst cases."""
    measured = np.array([c["ns"] for c in cases])
    new, old = errors(cases, cost), np.log(ramp_ns(cases) / measured)
    odd = np.array([VOCAB in (c["rows"], c["cols"], c["inner"]) for c in cases])
    out = {}
    for dtype in ("float32", "bfloat16"):
        sel = np.array([c["dtype"] == dtype for c in cases]) & ~odd
        out[dtype] = float(np.mean(np.abs(new[sel])))
        print(f"{dtype:9} {sel.sum():3} GEMMs: mean |log error| wave model "
              f"{out[dtype]:.3f} (x{np.exp(out[dtype]):.3f}), fixed ramp "
              f"{np.mean(np.abs(old[sel])):.3f} (x{np.exp(np.mean(np.abs(old[sel]))):.2f}); "
              f"worst {np.exp(new[sel].min()):.2f}x .. {np.exp(new[sel].max()):.2f}x")
        worst = np.argsort(-np.abs(np.where(sel, new, 0.0)))[:5]
        for i in worst:
            c = cases[i]
            print(f"    {c['case']:34} {c['kind']:12} measured {c['ns'] / 1e3:8.1f} us, "
                  f"modelled {np.exp(new[i]) * c['ns'] / 1e3:8.1f} us")
    sel = odd & np.array([c["dtype"] != "float32" for c in cases])
    print(f"bf16 with the vocabulary (align1, {sel.sum()} GEMMs): mean |log error| "
          f"{np.mean(np.abs(new[sel])):.3f}")
    return out


def fit(cases: list[dict[str, Any]], cost: GpuCost) -> GpuCost:
    grids = {"tensor": dict(fixed=(500.0, 1044.0, 1500.0), eff=(0.80, 0.83, 0.86),
                            mem=(0.75, 0.80, 0.85), split=(1000.0, 2000.0, 3000.0),
                            load=(60.0, 76.0, 100.0)),
             "simt": dict(fixed=(1044.0, 1544.0, 2544.0), eff=(0.70, 0.72, 0.75),
                          mem=(0.65, 0.70, 0.75), split=(2000.0, 3000.0, 4000.0),
                          load=(6.0, 8.0, 10.0))}
    odd = [VOCAB in (c["rows"], c["cols"], c["inner"]) for c in cases]
    for family, dtype in (("tensor", "bfloat16"), ("simt", "float32")):
        sub = [c for c, o in zip(cases, odd, strict=True) if c["dtype"] == dtype and not o]
        g = grids[family]
        best: tuple[float, GpuCost] | None = None
        for fixed, eff, mem, split, load in itertools.product(*g.values()):
            eff_key = "matmul_efficiency" if family == "tensor" else "fp32_matmul_efficiency"
            trial = cost.with_values(**{f"{family}_gemm_fixed_ns": fixed, eff_key: eff,
                                        f"{family}_gemm_memory_efficiency": mem,
                                        f"{family}_gemm_split_k_ns": split,
                                        f"{family}_gemm_load_bytes_per_cycle": load})
            score = float(np.mean(np.abs(errors(sub, trial))))
            if best is None or score < best[0]:
                best = (score, trial)
        assert best is not None
        cost = best[1]
        print(f"{family}: mean |log error| {best[0]:.3f} with " + ", ".join(
            f"{k} = {getattr(cost, k):g}" for k in (
                f"{family}_gemm_fixed_ns", f"{family}_gemm_memory_efficiency",
                f"{family}_gemm_split_k_ns", f"{family}_gemm_load_bytes_per_cycle",
                "matmul_efficiency" if family == "tensor" else "fp32_matmul_efficiency")))
    return cost


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--fit", action="store_true", help="grid-search the constants")
    args = p.parse_args(argv)
    cases = load(args.data)
    env = json.loads(args.data.read_text())["environment"]
    print(f"{len(cases)} GEMMs measured on {env['device']} (torch {env['torch']}, "
          f"{env['date']}); modelled on the h200 target")
    cost = H200_SXM.cost
    if args.fit:
        cost = fit(cases, cost)
    report(cases, cost)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
