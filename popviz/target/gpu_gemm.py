"""A GEMM's time as cuBLAS runs it: output tiles spread over the SMs in waves.

cuBLAS cuts the [rows x cols] output into tiles, one thread block (CTA) each, and may split
the inner dimension K into S slices whose partial sums a second pass adds (split-K). The
CTAs run in waves of one per SM. One CTA's time is the larger of its multiply-adds at the
SM's rate and its operand loads (tile rows + tile cols elements per step of K; rows past
the matrix edge are predicated off) at the SM's load rate; the whole GEMM can go no faster
than its operands' bytes over HBM. cuBLAS's heuristics pick a good configuration, so the
model takes the fastest of the candidate tiles x splits:

    time = fixed + min over (tile, S) of max(waves * CTA time, bytes / HBM) + [S > 1] split_k

This is what makes a small GEMM slow (an M = 8 micro-batch: a few CTAs, each bound by its
loads, or split-K's extra pass) and a large one run at `efficiency` of the peak less its
last wave's idle SMs. Two kernel families, each with its own tiles and constants: tensor
cores (bf16 / fp16: Hopper's nvjet, Ampere's CUTLASS tensorop) and fp32 on the CUDA cores
(SIMT SGEMM: PyTorch does not let fp32 matmuls use TF32 by default). The constants were
measured kernel by kernel on an H200 (bench/gpu_gemm_shapes.py -> bench/data/
gpu_gemm_shapes_h200.json, fit: bench/fit_gpu_gemm.py); rates scale with each target's
peak, SMs and clock.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from popviz.target.convparams import dims_of
from popviz.target.gpu import GpuCost, GpuTarget

# (tile rows, tile cols) the kernels the H200 ran use (names such as
# nvjet_sm90_tst_64x8_..., sm80_xmma_gemm_..._tilesize64x64x8, cutlass_80_simt_sgemm_128x32)
TENSOR_TILES = ((64, 8), (8, 64), (64, 16), (16, 64), (64, 32), (32, 64), (64, 64),
                (128, 64), (64, 128), (128, 128), (256, 128), (128, 256))
SIMT_TILES = ((32, 32), (64, 32), (32, 64), (64, 64), (128, 32), (32, 128), (128, 64),
              (64, 128), (128, 128), (256, 128), (128, 256))
SPLITS = (1, 2, 4, 8, 16)
MIN_SPLIT_DEPTH = 64  # a K slice shorter than one pipeline stage's depth is not split


def gemm_dims(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(batch, rows, cols, inner) of each op's GEMM: the output's last two dimensions, its
    leading ones as the batch, and the inner dimension from the FLOPs (2 x batch x rows x
    cols x inner), so that mm, addmm, bmm and a matmul's views all read alike; an op
    without a recorded output shape is taken as a square GEMM of its FLOPs."""
    n = len(ops)
    flops = ops["flops"].to_numpy(np.float64)
    side = np.maximum(1.0, np.round(np.cbrt(flops / 2.0)))
    batch, rows, cols = np.ones(n), side.copy(), side.copy()  # no shape: a square GEMM
    shapes = ops["out_shape"].astype(str) if "out_shape" in ops else pd.Series([""] * n)
    for i, text in enumerate(shapes):
        parts = dims_of(text)
        dims = parts[0] if parts else []
        if not dims:
            continue
        cols[i] = dims[-1]
        rows[i] = dims[-2] if len(dims) >= 2 else 1
        batch[i] = math.prod(dims[:-2]) if len(dims) > 2 else 1
    outputs = batch * rows * cols
    inner = np.maximum(1.0, np.round(flops / np.maximum(2.0 * outputs, 1.0)))
    return batch, rows, cols, inner


def _family(target: GpuTarget, cost: GpuCost, tensor: bool) -> tuple[float, float, float,
                                                                     float]:
    """(SM load bytes per s, HBM bytes per s, split-K ns, fixed ns) of a kernel family."""
    if tensor:
        return (cost.tensor_gemm_load_bytes_per_cycle * target.sm_clock_hz,
                target.hbm_bytes_per_s * cost.tensor_gemm_memory_efficiency,
                cost.tensor_gemm_split_k_ns, cost.tensor_gemm_fixed_ns)
    return (cost.simt_gemm_load_bytes_per_cycle * target.sm_clock_hz,
            target.hbm_bytes_per_s * cost.simt_gemm_memory_efficiency,
            cost.simt_gemm_split_k_ns, cost.simt_gemm_fixed_ns)


def gemm_ns(batch: np.ndarray, rows: np.ndarray, cols: np.ndarray, inner: np.ndarray,
            moved: np.ndarray, itemsize: np.ndarray, flops_per_s: np.ndarray,
            tensor: np.ndarray, target: GpuTarget, cost: GpuCost) -> np.ndarray:
    """ns each GEMM's kernels run, without the launch (`kernel_ns`): `flops_per_s` is the
    GPU's rate for its dtype and kernel at its efficiency, `moved` its operands' bytes,
    `tensor` whether it runs on the tensor cores."""
    out = np.zeros(len(batch))
    for family in (True, False):
        sel = np.flatnonzero(tensor == family)
        if not len(sel):
            continue
        load, hbm, split_ns, fixed_ns = _family(target, cost, family)
        b, m, n, k = batch[sel], rows[sel], cols[sel], inner[sel]
        sm_rate = flops_per_s[sel] / target.sms
        memory = moved[sel] / hbm
        best = np.full(len(sel), np.inf)
        for tile_rows, tile_cols in (TENSOR_TILES if family else SIMT_TILES):
            tiles = b * np.ceil(m / tile_rows) * np.ceil(n / tile_cols)
            loads_per_k = (np.minimum(tile_rows, m) + np.minimum(tile_cols, n)) * itemsize[sel]
            for split in SPLITS:
                depth = np.ceil(k / split)
                allowed = (split == 1) | (k / split >= MIN_SPLIT_DEPTH)
                waves = np.ceil(tiles * split / target.sms)
                cta = np.maximum(2.0 * tile_rows * tile_cols * depth / sm_rate,
                                 loads_per_k * depth / load)
                t = np.maximum(waves * cta, memory) + (split_ns * 1e-9 if split > 1 else 0.0)
                best = np.where(allowed, np.minimum(best, t), best)
        out[sel] = best * 1e9 + fixed_ns
    return out
