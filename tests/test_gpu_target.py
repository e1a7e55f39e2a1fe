"""The GPU target family: machine figures and their sources, the caching allocator model,
the per-op roofline."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from popviz.compiler.gpu_alloc import (
    LARGE_BUFFER,
    SMALL_BUFFER,
    CachingAllocator,
    round_size,
    segment_size,
)
from popviz.options import Options
from popviz.target import get_target, make_target, target_names
from popviz.target.gpu import A100_80GB, H100_PCIE, H100_SXM, H200_SXM, GpuTarget, is_gpu
from popviz.target.gpu_cost import gpu_op_costs

MIB = 1 << 20
FIGURES = ("memory_bytes", "hbm_bytes_per_s", "fp32_flops", "tf32_flops", "bf16_flops",
           "fp8_flops", "nvlink_bytes_per_s", "pcie_bytes_per_s", "p2p_latency_s",
           "host_latency_s", "sms", "nvlink_gpus")


def test_gpu_targets_by_name_and_alias() -> None:
    assert get_target("h100") is H100_SXM and get_target("H100-SXM") is H100_SXM
    assert get_target("h100-pcie") is H100_PCIE and get_target("a100-80gb") is A100_80GB
    assert {"h100", "h100-pcie", "a100", "mk2"} <= set(target_names())
    assert target_names("gpu") == ["a100", "h100", "h100-pcie", "h200"]
    assert get_target("h200-sxm") is H200_SXM and H200_SXM.bf16_flops == H100_SXM.bf16_flops
    assert "h100" not in target_names("ipu")
    assert is_gpu(H100_SXM) and not is_gpu(get_target("mk2"))
    assert get_target("mk2").family == "ipu"
    with pytest.raises(ValueError, match="GPU"):
        make_target({"name": "mine", "base": "h100"})
    assert Options().set_target("h100").target == "h100"


@pytest.mark.parametrize("gpu", [H100_SXM, H100_PCIE, H200_SXM, A100_80GB])
def test_every_figure_names_its_source(gpu: GpuTarget) -> None:
    for key in FIGURES:
        assert key in gpu.sources, f"{gpu.name}.{key} has no source"
        assert gpu.sources[key].split(":")[0] in ("published", "derived", "assumed",
                                                   "measured", "NVIDIA H100 Tensor Core GPU "
                                                   "datasheet (nvidia.com, 2023)",
                                                   "NVIDIA A100 Tensor Core GPU datasheet "
                                                   "(nvidia.com, 2021)",
                                                   "NVIDIA H200 Tensor Core GPU datasheet "
                                                   "(nvidia.com, 2024)")
    # dense tensor-core rates are half the datasheets' sparse ones, bf16 twice tf32
    assert gpu.bf16_flops == pytest.approx(2 * gpu.tf32_flops, rel=0.01)
    assert gpu.usable_bytes < gpu.memory_bytes
    meta = gpu.to_meta(2)
    assert meta["family"] == "gpu" and meta["num_ipus"] == 2 and meta["tiles_per_ipu"] == 0


def test_datasheet_ordering() -> None:
    """SXM > PCIe > A100 on every compute rate the datasheets give; HBM: the A100 80GB
    SXM (2,039 GB/s) is a little faster than the H100 PCIe (2 TB/s)."""
    for key in ("tf32_flops", "bf16_flops", "fp32_flops"):
        assert getattr(H100_SXM, key) > getattr(H100_PCIE, key) > getattr(A100_80GB, key)
    assert H100_SXM.hbm_bytes_per_s > A100_80GB.hbm_bytes_per_s > H100_PCIE.hbm_bytes_per_s
    assert A100_80GB.fp8_flops == 0 and A100_80GB.peak_flops("float8_e4m3fn") == \
        A100_80GB.bf16_flops


def test_transfers_alpha_beta() -> None:
    gpu = H100_SXM
    assert gpu.p2p_ns(0) == 0
    small, big = gpu.p2p_ns(1), gpu.p2p_ns(450e6)
    assert small == pytest.approx(gpu.p2p_latency_s * 1e9, rel=1e-3)
    # 450 MB at 450 GB/s times the share NCCL p2p gets of it (Zero Bubble's Table 9)
    assert big == pytest.approx((gpu.p2p_latency_s + 1e-3 / gpu.cost.p2p_efficiency) * 1e9)
    assert 0.1 < gpu.cost.p2p_efficiency < 0.2
    assert gpu.p2p_ns(1e9, link=False) > gpu.p2p_ns(1e9)
    assert gpu.allreduce_ns(1e9, 1) == 0
    # a ring moves 2(n-1)/n of the bytes: 8 GPUs move 1.75x what 1 P2P of them moves
    ring = gpu.allreduce_ns(1e9, 8) - 14 * gpu.p2p_latency_s * 1e9
    assert ring == pytest.approx(1.75 * 1e9 / gpu.nvlink_bytes_per_s * 1e9)


def test_allocator_rounding_and_segments() -> None:
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(MIB) == SMALL_BUFFER
    assert segment_size(MIB + 512) == LARGE_BUFFER
    assert segment_size(10 * MIB - 512) == LARGE_BUFFER
    assert segment_size(10 * MIB) == 10 * MIB
    assert segment_size(11 * MIB) == 12 * MIB  # rounded to 2 MiB


def test_allocator_small_pool_packs_and_reuses() -> None:
    a = CachingAllocator()
    for h in range(4):
        assert a.malloc(h, 1000) == 1024
    assert a.allocated == 4096 and a.reserved == SMALL_BUFFER and a.segments == 1
    a.free(1)
    a.free(2)  # merges with block 1: one free 2 KiB block between live 0 and 3
    assert a.malloc(9, 2048) == 2048 and a.segments == 1
    # a large request never comes from the small pool: a new 20 MiB segment
    a.malloc(10, 2 * MIB)
    assert a.reserved == SMALL_BUFFER + LARGE_BUFFER and a.segments == 2


def test_allocator_large_pool_best_fit_split_and_peaks() -> None:
    a = CachingAllocator()
    a.malloc(1, 3 * MIB)  # a 20 MiB segment, split: 17 MiB stays free in it
    a.malloc(2, 5 * MIB)  # from the remainder (best fit), no new segment
    assert a.segments == 1 and a.allocated == 8 * MIB
    a.free(1)
    a.free(2)  # all merged back into one 20 MiB free block
    assert a.allocated == 0 and a.reserved == LARGE_BUFFER and a.peak_allocated == 8 * MIB
    a.malloc(3, 20 * MIB)  # fits the merged block exactly
    assert a.segments == 1
    a.malloc(4, 12 * MIB)  # no free block: a 12 MiB segment
    assert a.reserved == LARGE_BUFFER + 12 * MIB == a.peak_reserved
    with pytest.raises(ValueError):
        a.free(99)
    with pytest.raises(ValueError):
        a.malloc(3, 10)


def test_allocator_large_remainder_under_1mib_is_not_split() -> None:
    a = CachingAllocator()
    a.malloc(1, 19 * MIB + 512 * 1024)  # 20 MiB segment; 0.5 MiB left: kept whole
    assert a.allocated == LARGE_BUFFER


def _ops(rows: list[dict]) -> pd.DataFrame:
    base = {"op": "aten.add.Tensor", "op_class": "elementwise", "phase": "forward",
            "flops": 0, "bytes_read": 0, "bytes_written": 0, "dtype": "float32", "shapes": ""}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_roofline_per_op_class() -> None:
    gpu = H100_SXM
    ops = _ops([
        {"op": "aten.view.default", "op_class": "data_movement"},  # a view: no kernel
        {"bytes_read": 400e6, "bytes_written": 200e6, "flops": 100e6},
        {"op": "aten.mm.default", "op_class": "matmul", "flops": 2 * 8192 ** 3,
         "bytes_read": 2 * 8192 ** 2 * 4, "bytes_written": 8192 ** 2 * 4},
        {"op": "aten.mm.default", "op_class": "matmul", "flops": 2 * 8192 ** 3,
         "bytes_read": 2 * 8192 ** 2 * 2, "bytes_written": 8192 ** 2 * 2, "dtype": "bfloat16"},
        {"op": "aten.convolution.default", "op_class": "conv", "flops": 1e11,
         "bytes_read": 1e6, "bytes_written": 1e6},
        {"op": "aten.add_.Tensor", "phase": "optimiser", "bytes_read": 8, "bytes_written": 4},
    ])
    c = gpu_op_costs(ops, gpu)
    assert c["cycles"].iloc[0] == 0 and c["kernels"].iloc[0] == 0
    # memory-bound: bytes over the HBM rate, plus one kernel
    mem = 600e6 / (gpu.hbm_bytes_per_s * gpu.cost.memory_efficiency) * 1e9
    assert c["cycles"].iloc[1] == pytest.approx(mem + gpu.cost.kernel_ns, abs=1)
    # a big GEMM is compute-bound; bf16 on tensor cores beats fp32 on CUDA cores
    assert c["compute_ns"].iloc[2] > c["memory_ns"].iloc[2]
    assert c["cycles"].iloc[3] * 5 < c["cycles"].iloc[2]
    assert c["kernels"].iloc[4] == gpu.cost.conv_forward_kernels
    # a per-parameter optimiser op runs fused on CUDA: a share of a kernel
    assert 0 < c["kernels"].iloc[5] < 1
    # larger GEMMs get closer to peak (the efficiency curve)
    sizes = np.array([1e6, 1e8, 1e10, 1e12])
    curve = gpu_op_costs(_ops([{"op": "aten.mm.default", "op_class": "matmul", "flops": f,
                                "dtype": "bfloat16"} for f in sizes]), gpu)
    rate = sizes / (curve["compute_ns"].to_numpy() * 1e-9)
    assert np.all(np.diff(rate) > 0) and rate[-1] < gpu.bf16_flops
