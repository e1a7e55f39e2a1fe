"""The GEMM wave model (popviz/target/gpu_gemm.py): against 264 cuBLAS GEMMs timed kernel by
kernel on an H200 (bench/data/gpu_gemm_shapes_h200.json), and its mechanisms one by one."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from popviz.target.gpu import H100_SXM, H200_SXM
from popviz.target.gpu_gemm import gemm_dims, gemm_ns

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from fit_gpu_gemm import VOCAB, errors, load, ramp_ns  # noqa: E402


def test_the_h200_gemms_within_their_measured_error() -> None:
    cases = [c for c in load() if VOCAB not in (c["rows"], c["cols"], c["inner"])]
    err = errors(cases, H200_SXM.cost)
    measured = np.array([c["ns"] for c in cases])
    old = np.abs(np.log(ramp_ns(cases) / measured))
    for dtype, bound in (("float32", 0.13), ("bfloat16", 0.11)):
        sel = np.array([c["dtype"] == dtype for c in cases])
        assert sel.sum() >= 100
        assert np.mean(np.abs(err[sel])) <= bound, dtype
        assert np.abs(err[sel]).max() <= np.log(2.0), dtype  # none off by 2x
        assert np.mean(np.abs(err[sel])) * 2.5 < np.mean(old[sel])  # the ramp it replaced
    # the pipelining fixture's GEMMs (M = 8, 1024 x 1024, fp32): 3.3-7.7 us measured
    small = [i for i, c in enumerate(cases) if c["dtype"] == "float32" and c["rows"] * c[
        "cols"] * c["inner"] == 8 * 1024 * 1024 and 8 in (c["rows"], c["inner"])]
    assert len(small) == 3 and (np.abs(err[small]) <= np.log(1.8)).all()


def _ops(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame({"op": [r[0] for r in rows], "out_shape": [r[1] for r in rows],
                         "flops": [r[2] for r in rows]})


def test_dimensions_from_the_output_and_the_flops() -> None:
    ops = _ops([("aten.addmm.default", "[8,1024]", 2 * 8 * 1024 * 4096),
                ("aten.bmm.default", "[96,1024,64]", 2 * 96 * 1024 * 64 * 1024),
                ("aten.mm.default", "", 2 * 64 ** 3)])
    batch, rows, cols, inner = gemm_dims(ops)
    assert list(batch) == [1, 96, 1] and list(rows) == [8, 1024, 64]
    assert list(cols) == [1024, 64, 64] and list(inner) == [4096, 1024, 64]


def _one(rows: float, cols: float, inner: float, half: bool = True, target=H100_SXM
         ) -> float:
    size = 2.0 if half else 4.0
    rate = target.bf16_flops * target.cost.matmul_efficiency if half else \
        target.fp32_flops * target.cost.fp32_matmul_efficiency
    moved = (rows * inner + inner * cols + rows * cols) * size
    return float(gemm_ns(np.array([1.0]), np.array([rows]), np.array([cols]),
                         np.array([inner]), np.array([moved]), np.array([size]),
                         np.array([rate]), np.array([half]), target, target.cost)[0])


def test_a_last_wave_costs_a_whole_wave() -> None:
    # 256 x 128 tiles: 132 of them fill the H100's SMs once, 133 need a second wave
    full = _one(256 * 12, 128 * 11, 8192)
    over = _one(256 * 12 + 1, 128 * 11, 8192)  # one more row of tiles... part of one
    assert over > 1.05 * full
    assert _one(256 * 24, 128 * 11, 8192) < 2.1 * full


def test_a_thin_gemm_streams_its_weights() -> None:
    # M = 8 rows against a 4096 x 4096 bf16 weight: bound by reading the 32 MiB weight
    t = _one(8, 4096, 4096)
    weight = 4096 * 4096 * 2 / (H100_SXM.hbm_bytes_per_s * H100_SXM.cost.
                                tensor_gemm_memory_efficiency) * 1e9
    assert weight < t < weight * 1.2 + H100_SXM.cost.tensor_gemm_fixed_ns
    # and a small fp32 one is a few microseconds, not a ramp of 19
    assert _one(8, 1024, 1024, half=False) < 8000


def test_rates_follow_the_target() -> None:
    # a large compute-bound GEMM: H200 and H100 share SMs and clocks, A100 is slower
    from popviz.target.gpu import A100_80GB
    big = (8192, 8192, 8192)
    assert abs(_one(*big, target=H200_SXM) / _one(*big) - 1) < 0.02
    assert _one(*big, target=A100_80GB) > 2.5 * _one(*big)
