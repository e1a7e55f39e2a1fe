"""A convolution's time as cuDNN runs it on NCHW tensors: a GEMM, with or without layout
copies.

cuDNN runs each pass of a convolution as one GEMM:
- a 1x1, stride-1 convolution whose image has at least `GEMM_PATH_MIN_PIXELS` pixels is a
  plain batched GEMM on the NCHW tensors (per image [out channels x in channels] x [in
  channels x pixels]: `cutlass_80_tensorop_*`, `nvjet_*`, `sm90_xmma_gemm_*` in a trace),
  one kernel; its pixel count is the GEMM's leading dimension, so a half one of a size that
  is no multiple of 8 (14 x 14 = 196) takes slower kernels aligned to 4 elements
  (`conv_align4_efficiency`);
- every other one is an implicit GEMM (`sm90_xmma_fprop / dgrad / wgrad_implicit_gemm_*`)
  on NHWC copies: `nchwToNhwc` / `nhwcToNchw` kernels copy what it reads and writes, each
  a read and a write over HBM, plus a fixed cost for the extra kernels.
The GEMM is timed by the wave model (gpu_gemm.py) at `conv_gemm_efficiency` of the tensor
cores' peak (TF32 for fp32: cuDNN's default), times `conv_weight_grad_efficiency` for a
weight gradient (a split-K GEMM over every output pixel), times
`conv_misaligned_efficiency` where the input has a channel count that is no multiple of 8
(ResNet's stem: 3). The dimensions: forward [N*P*Q x K] by C*R*S; input gradient [N*H*W x C]
by K*R*S / stride^2; weight gradient [K x C*R*S] by N*P*Q. Measured kernel by kernel on an
H200 over ResNet-50's 23 convolutions (bench/gpu_conv_shapes.py -> bench/data/
gpu_conv_shapes_h200.json; fit: bench/fit_gpu_conv.py). Grouped and depthwise convolutions
keep the roofline with `conv_efficiency`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.target.convparams import dims_of
from popviz.target.gpu import GpuCost, GpuTarget
from popviz.target.gpu_gemm import gemm_ns

GEMM_PATH_MIN_PIXELS = 14 * 14


@dataclass(frozen=True)
class ConvShape:
    """One 2-D convolution: batch, in / out channels, kernel, input and output pixels."""

    batch: int
    cin: int
    cout: int
    kernel: int  # R * S
    pixels: int  # H * W
    out_pixels: int  # P * Q
    stride: int
    one_by_one: bool

    @property
    def forward_flops(self) -> float:
        return 2.0 * self.batch * self.cout * self.cin * self.kernel * self.out_pixels


def conv_shape(op: str, shapes: str, out_shape: str = "") -> ConvShape | None:
    """The convolution's shape from a recorded `aten.convolution` (input; weight, and its
    output) or `aten.convolution_backward` (output gradient; input; weight) row; None for
    anything else (1-D, 3-D, a missing shape)."""
    parts = [d for d in dims_of(shapes) if d]
    if "backward" in op:
        if len(parts) < 3:
            return None
        grad, x, w = parts[0], parts[1], parts[2]
    else:
        if len(parts) < 2:
            return None
        x, w = parts[0], parts[1]
        outs = [d for d in dims_of(out_shape) if d]
        grad = outs[0] if outs else None
    if len(x) != 4 or len(w) != 4:
        return None
    n, cin, h, wd = x
    cout, _, r, s = w
    if grad is not None and len(grad) == 4:
        p, q = grad[2], grad[3]
    else:  # no output recorded: taken as stride 1
        p, q = h, wd
    stride = max(1, round(h / max(1, p)))
    return ConvShape(n, cin, cout, r * s, h * wd, p * q, stride, r * s == 1)


# one pass as a GEMM: (batch, rows, cols, inner, bytes moved, item size, FLOP/s) and the
# ns it takes besides (the NHWC copies of an implicit GEMM)
PassGemm = tuple[tuple[float, float, float, float, float, float, float], float]


def pass_gemm(shape: ConvShape, kind: str, half: bool, target: GpuTarget, cost: GpuCost
              ) -> PassGemm:
    """The GEMM one pass ("forward", "input", "weight") runs, and its other ns."""
    itemsize = 2.0 if half else 4.0
    peak = (target.bf16_flops if half else target.tf32_flops) * cost.conv_gemm_efficiency
    if shape.cin % 8:
        peak *= cost.conv_misaligned_efficiency
    x = shape.batch * shape.cin * shape.pixels * itemsize
    y = shape.batch * shape.cout * shape.out_pixels * itemsize
    w = shape.cout * shape.cin * shape.kernel * itemsize
    moved = x + y + w
    gemm_path = shape.one_by_one and shape.stride == 1 and \
        shape.pixels >= GEMM_PATH_MIN_PIXELS and (kind != "weight" or shape.pixels > 14 * 14)
    if kind == "weight":
        peak *= cost.conv_weight_grad_efficiency
    if gemm_path:  # per image: [out x in] x [in x pixels], pixels the leading dimension
        if half and shape.pixels % 8:  # 14 x 14 = 196: the 4-element-aligned kernels
            peak *= cost.conv_align4_efficiency
        if kind == "weight":
            return (1, shape.cout, shape.cin, shape.batch * shape.pixels, moved, itemsize,
                    peak), 0.0
        rows = shape.cout if kind == "forward" else shape.cin
        inner = shape.cin if kind == "forward" else shape.cout
        return (shape.batch, rows, shape.pixels, inner, moved, itemsize, peak), 0.0
    if kind == "forward":
        dims = (shape.batch * shape.out_pixels, shape.cout, shape.cin * shape.kernel)
    elif kind == "input":
        dims = (shape.batch * shape.pixels, shape.cin,
                max(1, shape.cout * shape.kernel // shape.stride ** 2))
    else:
        dims = (shape.cout, shape.cin * shape.kernel, shape.batch * shape.out_pixels)
    copies = 2 * (x + y) / (target.hbm_bytes_per_s * cost.memory_efficiency) * 1e9
    return (1, *dims, moved, itemsize, peak), \
        cost.conv_copy_passes * copies + cost.conv_copy_fixed_ns


def _gemms_ns(passes: list[PassGemm], target: GpuTarget, cost: GpuCost) -> np.ndarray:
    """ns of each pass: its GEMM on the wave model (all of them in one vectorised call)
    plus its other ns."""
    if not passes:
        return np.zeros(0)
    cols = np.array([gemm for gemm, _ in passes], dtype=np.float64).T
    batch, rows, width, inner, moved, itemsize, rate = cols
    gemms = gemm_ns(batch, rows, width, inner, moved, itemsize, rate,
                    np.ones(len(passes), dtype=bool), target, cost)
    return gemms + np.array([extra for _, extra in passes])


def pass_ns(shape: ConvShape, kind: str, half: bool, target: GpuTarget, cost: GpuCost
            ) -> float:
    """ns of one pass ("forward", "input", "weight") past its launches."""
    return float(_gemms_ns([pass_gemm(shape, kind, half, target, cost)], target, cost)[0])


def conv_ns(ops: pd.DataFrame, target: GpuTarget, cost: GpuCost) -> np.ndarray:
    """ns each 2-D convolution's passes run past their launches, indexed like `ops`; NaN
    for rows that are not one (grouped ones included: their `op_class` differs)."""
    out = np.full(len(ops), np.nan)
    name, cls = ops["op"].astype(str), ops["op_class"].astype(str).to_numpy()
    parts = ops["conv_part"].astype(str).to_numpy() if "conv_part" in ops else \
        np.full(len(ops), "")
    half = ops["dtype"].astype(str).isin(["float16", "bfloat16"]).to_numpy()
    flops = ops["flops"].to_numpy(np.float64)
    rows: list[int] = []  # the op of each pass
    passes: list[PassGemm] = []
    for i in np.flatnonzero(cls == "conv"):
        out_shape = str(ops["out_shape"].iloc[i]) if "out_shape" in ops else ""
        shape = conv_shape(name.iloc[i], str(ops["shapes"].iloc[i]), out_shape)
        if shape is None:
            continue
        if "backward" not in name.iloc[i]:
            kinds = ["forward"]
        elif parts[i] in ("input", "weight"):
            kinds = [parts[i]]
        else:  # both gradients, or the weight's alone where the input needs none
            both = flops[i] > 1.5 * shape.forward_flops
            kinds = ["input", "weight"] if both else ["weight"]
        for kind in kinds:
            rows.append(int(i))
            passes.append(pass_gemm(shape, kind, bool(half[i]), target, cost))
    if rows:
        index = np.array(rows)
        out[np.unique(index)] = 0.0
        np.add.at(out, index, _gemms_ns(passes, target, cost))
    return out
