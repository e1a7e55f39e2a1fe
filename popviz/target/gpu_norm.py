"""Batch norm's time on a GPU as its CUDA kernels run it: one block per channel.

Training-mode batch norm reduces each channel over the batch and the image (N x H x W
values) before it can normalise, and both libraries give a channel to one thread block:

- fp32 / fp16 run cuDNN's kernels (`bn_fw_tr_1C11_*`, `bn_bw_1C11_*`), which stream each
  channel's values through its block at `cudnn_bn_*_block_bytes_per_cycle`, so a layer of
  few channels (ResNet's stem and first stage: 64) cannot fill the GPU's bandwidth. The
  forward: passes x bytes / (min(channels, SMs) x block rate), at least one read and the
  write over HBM (an H100 and an H200 run the 256-channel layers alike, so the SMs, not
  HBM, set their pace); the backward: passes x bytes / min(HBM share, channels x block
  rate).
- bf16 runs PyTorch's native kernels (cuDNN's are not used for bf16):
  `batch_norm_collect_statistics_kernel` takes a channel per block, serially (Welford) at
  `native_bn_*_values_per_cycle` per block, `native_bn_blocks_per_sm` blocks to an SM, in
  waves over the channels; then an element-wise pass (`batch_norm_transform_input_kernel`,
  or the backward's `batch_norm_backward_elemt`) over every value with a cost per
  (image, channel) plane.

Measured kernel by kernel on an H200 over ResNet-50's shapes (bench/gpu_norm_kernels.py ->
bench/data/gpu_norm_kernels_h200.json); rates per SM cycle, so another GPU follows its SMs
and clock. Other norms (layer norm: a row per warp, thousands of rows) keep the roofline.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from popviz.target.convparams import dims_of
from popviz.target.gpu import GpuCost, GpuTarget

BATCH_NORM = r"^aten\.(?:native_batch_norm|cudnn_batch_norm|_native_batch_norm_legit(?!_no_))"
BACKWARD = "backward"


def batch_norm_rows(ops: pd.DataFrame) -> np.ndarray:
    """True for a training-mode batch norm's forward or backward (not running statistics)."""
    name = ops["op"].astype(str)
    return name.str.contains(BATCH_NORM, regex=True).to_numpy() & \
        (ops["op_class"].astype(str) == "norm").to_numpy()


def batch_norm_ns(ops: pd.DataFrame, target: GpuTarget, cost: GpuCost) -> np.ndarray:
    """ns each batch norm's kernels run past their launches (`kernel_ns`), indexed like
    `ops`; 0 where an op is no training-mode batch norm or its input has no channels."""
    out = np.zeros(len(ops))
    rows = np.flatnonzero(batch_norm_rows(ops))
    clock, sms = target.sm_clock_hz, target.sms
    for i in rows:
        row = ops.iloc[i]
        parts = [d for d in dims_of(row["shapes"]) if d]
        if not parts or len(parts[0]) < 2:
            continue
        dims = parts[0]  # the input (forward) or the output's gradient (backward): N, C, ...
        channels, values = dims[1], math.prod(dims)
        per_channel, planes = values // channels, values // max(1, math.prod(dims[2:]))
        backward = BACKWARD in str(row["op"])
        if str(row["dtype"]) == "bfloat16":
            rate = cost.native_bn_backward_values_per_cycle if backward else \
                cost.native_bn_forward_values_per_cycle
            waves = math.ceil(channels / (cost.native_bn_blocks_per_sm * sms))
            moved = values * (cost.native_bn_backward_bytes if backward
                              else cost.native_bn_forward_bytes)
            plane_ns = 0.0 if backward else cost.native_bn_plane_ns
            ns = (waves * per_channel / (rate * clock) * 1e9
                  + moved / (target.hbm_bytes_per_s * cost.memory_efficiency) * 1e9
                  + planes * plane_ns / sms + cost.native_bn_fixed_ns)
        else:
            itemsize = 2 if str(row["dtype"]) == "float16" else 4
            hbm = target.hbm_bytes_per_s * cost.cudnn_bn_memory_efficiency
            if backward:
                bandwidth = min(hbm, channels * cost.cudnn_bn_backward_block_bytes_per_cycle
                                * clock)
                ns = values * itemsize * cost.cudnn_bn_backward_reads / bandwidth * 1e9
            else:  # HBM carries one read and the write; the SMs stream every pass
                blocks = min(channels, sms) * cost.cudnn_bn_forward_block_bytes_per_cycle
                ns = max(values * itemsize * cost.cudnn_bn_forward_reads / (blocks * clock),
                         values * itemsize * 2 / hbm) * 1e9
            ns += cost.cudnn_bn_fixed_ns
        out[i] = ns
    return out
