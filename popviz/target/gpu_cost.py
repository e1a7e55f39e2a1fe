"""Per-op time on a GPU: a roofline per op class and shape plus a fixed cost per kernel.

    time = kernels * kernel_ns + max(compute, memory)
    compute = flops / (peak(dtype) * efficiency(op class)) + ramp_ns   (attention, grouped
            convolutions; a GEMM: its output tiles in waves over the SMs, gpu_gemm.py; a
            2-D convolution: cuDNN's GEMM with or without NHWC copies, gpu_conv.py)
            (element-wise ops off the vectorized kernel: elements * cycles(path) / (SMs * clock))
    memory = bytes moved / (HBM bandwidth * memory_efficiency)

Tensor-core ops (grouped convolutions, fused attention) are compute-bound when large and
pay a fixed `ramp_ns` (filling and draining the SMs, prologue and epilogue: a time, the
same whatever its rate), so its achieved rate rises with its size towards `efficiency` of
the peak: the efficiency curve. Elementwise, norm, reduction and copies are
memory-bound. Views and aliases launch nothing. The optimiser's per-parameter ops, recorded
one by one on the CPU, run fused on CUDA (PyTorch's foreach default: multi_tensor_apply),
so each costs a share of a kernel. The constants and their fit: `GpuCost`
(popviz/target/gpu.py) and bench/fit_gpu_cost.py; docs/cost-model.md, "GPU targets".
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from popviz.target.convparams import dims_of
from popviz.target.gpu import GpuCost, GpuTarget
from popviz.target.gpu_conv import conv_ns
from popviz.target.gpu_gemm import gemm_dims, gemm_ns
from popviz.target.gpu_norm import batch_norm_ns, batch_norm_rows

TENSOR_CLASSES = ("conv", "grouped_conv", "depthwise_conv", "matmul")
ATTENTION_MARKS = ("scaled_dot_product", "flash_attention", "efficient_attention",
                   "cudnn_attention")
FREE_OPS = ("aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
            "aten.lift_fresh", "aten.detach", "aten._to_copy.default#noop",
            "aten._unsafe_view")  # a view: the CPU recording counts a fresh tensor
OUT_COLUMNS = ("cycles", "kernels", "compute_ns", "memory_ns", "launch_ns")


def kernel_counts(ops: pd.DataFrame, cost: GpuCost) -> np.ndarray:
    """Kernels each op launches on CUDA (fractional for fused optimiser ops)."""
    name = ops["op"].astype(str)
    cls = ops["op_class"].to_numpy(str)
    moves = (ops["bytes_written"].to_numpy(np.int64) > 0) | \
        (ops["flops"].to_numpy(np.int64) > 0)
    free = name.str.startswith(FREE_OPS).to_numpy()
    kernels = np.where(moves & ~free, 1.0, 0.0)
    conv = np.isin(cls, TENSOR_CLASSES[:3])
    backward = name.str.contains("backward").to_numpy()
    kernels = np.where(conv & ~backward, cost.conv_forward_kernels, kernels)
    kernels = np.where(conv & backward, cost.conv_backward_kernels, kernels)
    if "conv_part" in ops:  # dgrad and wgrad as two calls (grad_parts.split_conv_backward)
        halved = ops["conv_part"].astype(str).isin(["input", "weight"]).to_numpy()
        kernels = np.where(conv & backward & halved, cost.conv_backward_kernels / 2, kernels)
    update = (ops["phase"].to_numpy(str) == "optimiser") & (kernels > 0)
    foreach = name.str.contains("_foreach_").to_numpy()
    # per-parameter update ops (a CPU recording) run fused on CUDA: a share of a kernel;
    # a recorded foreach op launches one kernel per `foreach_tensors` tensors of its lists
    n_tensors = ops["shapes"].astype(str).str.count(r"\[").to_numpy(np.float64)
    kernels = np.where(update & ~foreach, 1.0 / cost.foreach_tensors, kernels)
    kernels = np.where(foreach, np.maximum(1.0, np.ceil(n_tensors / cost.foreach_tensors)),
                       kernels)
    return kernels


def misaligned_gemm(shapes: pd.Series) -> np.ndarray:
    """True where a GEMM's operands (the last two shapes of `mm`, `addmm`, `bmm`) have a
    matrix dimension that is not a multiple of 8."""
    last_two = shapes.astype(str).str.extract(r"\[([\d,]*)\];\[([\d,]*)\]$")
    out = np.zeros(len(shapes), dtype=bool)
    for col in (0, 1):
        dims = last_two[col].fillna("").str.split(",")
        inner = dims.map(lambda d: [int(x) for x in d[-2:] if x.isdigit()])
        out |= inner.map(lambda d: any(x % 8 for x in d)).to_numpy(bool)
    return out


def path_cycles(path: str, itemsize: int, operands: int, cost: GpuCost) -> float:
    """SM cycles per element of one element-wise op on `path` (popviz/recorder/
    kernel_path.py: "", "cast", "strided:N", "strided-cast:N", "transpose:N", "cat:N";
    "dropout" from gpu_lowering.cuda_dropout),
    with `itemsize`-byte elements and `operands` tensors (inputs and output); 0 for the
    vectorized kernel, whose time is its bytes."""
    kind, _, dims_text = path.partition(":")
    dims = int(dims_text) if dims_text.isdigit() else 1
    if kind == "cast":
        return cost.unrolled_cycles + cost.unrolled_operand_cycles * operands
    if kind in ("strided", "strided-cast"):
        # PyTorch's legacy kernel takes 4 elements per thread in 2-byte dtypes (and in
        # every conversion), 2 in wider ones (CUDALoops.cuh: elementwise_kernel<128, 4 | 2>)
        per_thread = 4 if itemsize < 4 or kind == "strided-cast" else 2
        cycles = (cost.strided_thread_cycles / per_thread + cost.strided_element_cycles
                  + cost.strided_dim_cycles * dims)
        return cycles + (cost.strided_cast_cycles if kind == "strided-cast" else 0.0)
    if kind == "transpose":
        return cost.transpose_cycles
    if kind == "cat":
        return cost.cat_dim_cycles * dims
    if kind == "dropout":  # the Philox draw of each element's mask
        return cost.dropout_cycles
    return 0.0


ITEMSIZE = {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "float16": 2, "bfloat16": 2,
            "int16": 2, "bool": 1, "uint8": 1, "int8": 1}


def path_ns(ops: pd.DataFrame, target: GpuTarget, cost: GpuCost) -> np.ndarray:
    """ns each op's element-wise kernel takes by its instructions (0 on the vectorized
    path or without a recorded `kernel_path`), indexed like `ops`."""
    out = np.zeros(len(ops))
    if "kernel_path" not in ops:
        return out
    paths = ops["kernel_path"].astype(str).to_numpy()
    rows = np.flatnonzero(paths != "")
    if not len(rows):
        return out
    rate = target.sms * target.sm_clock_hz / 1e9  # SM cycles per ns
    for i in rows:
        row = ops.iloc[i]
        operands = 1 + sum(1 for dims in dims_of(row["shapes"]) if dims)  # not scalars
        cycles = path_cycles(paths[i], ITEMSIZE.get(str(row["dtype"]), 4), operands, cost)
        out[i] = math.prod(dims_of(row["out_shape"])[0]) * cycles / rate
    return out


GLOBAL_REDUCE_VALUES = 4096  # Reduce.cuh's setReduceConfig: 16 rows of threads x 256 values


def outer_reduction(ops: pd.DataFrame) -> np.ndarray:
    """True for a sum or mean over leading dimensions (its output is the input's trailing
    dimensions: a bias gradient) of at least GLOBAL_REDUCE_VALUES values per output, which
    PyTorch reduces across blocks in two passes (a thread that would take 256 values or
    more splits its output over several blocks); a shorter one is one block's work."""
    out = np.zeros(len(ops), dtype=bool)
    if "out_shape" not in ops or "shapes" not in ops:
        return out
    name = ops["op"].astype(str)
    candidates = np.flatnonzero(name.str.match(r"^aten\.(?:sum|mean)\.").to_numpy())
    shapes, outs = ops["shapes"].astype(str), ops["out_shape"].astype(str)
    for i in candidates:
        dims, kept = dims_of(shapes.iloc[i])[0], dims_of(outs.iloc[i])[0]
        if len(kept) == len(dims):  # keepdim: the reduced dimensions are 1s
            reduced = [d for d in range(len(dims)) if kept[d] == 1 and dims[d] > 1]
            out[i] = bool(reduced) and reduced == list(range(len(reduced))) and \
                len(reduced) < len(dims)
        else:
            out[i] = 0 < len(kept) < len(dims) and dims[len(dims) - len(kept):] == kept
        out[i] = out[i] and math.prod(dims) >= GLOBAL_REDUCE_VALUES * math.prod(kept)
    return out


def gathered_bytes(shapes: pd.Series, rows: np.ndarray) -> np.ndarray:
    """For the NLL loss ops at `rows`: the bytes of its targets and the one value it takes
    per target (an int64 index and an fp32 log-probability each)."""
    out = np.zeros(len(shapes))
    for i in np.flatnonzero(rows):
        parts = [dims for dims in dims_of(shapes.iloc[i]) if dims]
        targets = math.prod(parts[-1]) if len(parts) >= 2 else 0
        out[i] = targets * (8 + 4)
    return out


def gpu_op_costs(ops: pd.DataFrame, target: GpuTarget, cost: GpuCost | None = None
                 ) -> pd.DataFrame:
    """ns per op (column `cycles`: one cycle is one ns on a GPU target) and its terms,
    indexed like `ops`. Deterministic and vectorised."""
    cost = cost or target.cost
    n = len(ops)
    if not n:
        return pd.DataFrame({c: pd.Series(dtype=np.float64) for c in OUT_COLUMNS})
    cls = ops["op_class"].to_numpy(str)
    flops = ops["flops"].to_numpy(np.float64)
    read = ops["bytes_read"].to_numpy(np.float64)
    written = ops["bytes_written"].to_numpy(np.float64)
    dtype = ops["dtype"].astype(str)
    name = ops["op"].astype(str)
    kernels = kernel_counts(ops, cost)
    casts = ops["cast_kernels"].to_numpy(np.float64) if "cast_kernels" in ops else \
        np.zeros(n)  # autocast's casts around a GEMM (gpu_lowering.autocast_casts)
    cast_bytes = ops["cast_bytes"].to_numpy(np.float64) if "cast_bytes" in ops else \
        np.zeros(n)

    half = dtype.isin(["float16", "bfloat16"]).to_numpy()
    attention = name.str.contains("|".join(ATTENTION_MARKS)).to_numpy()
    conv = np.isin(cls, TENSOR_CLASSES[:3])
    matmul = (cls == "matmul") & ~attention
    # PyTorch's defaults: cuDNN convolutions may use TF32, fp32 matmuls may not
    tensor_peak = np.where(half, target.bf16_flops, target.tf32_flops)
    fp32 = target.fp32_flops * cost.vector_efficiency  # CUDA cores (non-tensor fp32)
    # a half GEMM whose sizes are not multiples of 8 elements (16 B) cannot use the
    # aligned tensor-core kernels: cuBLAS falls back to align1 ones (GPT-2's vocabulary,
    # 50,257: `cutlass_75_tensorop_bf16_s1688gemm_bf16_*_align1` in the H200 trace)
    misaligned = half & matmul & misaligned_gemm(ops["shapes"])
    # the output's rows of such a size too (an LM head's forward): slower still
    out_odd = ops["out_shape"].astype(str).str.extract(r"(\d+)\]$")[0].fillna("8").astype(
        int).to_numpy() % 8 != 0 if "out_shape" in ops else np.zeros(n, dtype=bool)
    matmul_peak = np.where(half, target.bf16_flops * np.where(
        misaligned, np.where(out_odd, cost.misaligned_output_matmul_efficiency,
                             cost.misaligned_matmul_efficiency), cost.matmul_efficiency),
        target.fp32_flops * cost.fp32_matmul_efficiency)
    backward = name.str.contains("backward").to_numpy()
    # fused attention in fp32 is the memory-efficient kernel, which runs on CUDA cores
    # (FFMA: `fmha_cutlassF_f32_...` in a CUDA trace); half precision runs flash on the
    # tensor cores
    attention_peak = np.where(half, target.bf16_flops, target.fp32_flops)
    peak = np.select([conv & backward, conv, matmul, attention],
                     [tensor_peak * cost.conv_backward_efficiency,
                      tensor_peak * cost.conv_efficiency, matmul_peak,
                      attention_peak * cost.attention_efficiency], fp32)
    tensor = conv | matmul | attention
    compute = np.where(conv | attention, flops / peak * 1e9 + cost.ramp_ns, 0.0)
    if (cls == "conv").any():  # cuDNN: a GEMM, with NHWC copies or without (gpu_conv.py)
        modelled = conv_ns(ops, target, cost)
        compute = np.where(np.isnan(modelled), compute, modelled)
    if matmul.any():  # cuBLAS: output tiles in waves over the SMs (gpu_gemm.py)
        rows = np.flatnonzero(matmul)
        dims = gemm_dims(ops.iloc[rows])
        itemsize = np.where(half[rows], 2.0, 4.0)
        compute[rows] = gemm_ns(*dims, read[rows] + written[rows], itemsize, matmul_peak[rows],
                                half[rows], target, cost)
    # element-wise kernels off the vectorized path are bound by their per-element work
    compute = np.where(tensor, compute, path_ns(ops, target, cost))
    # a norm, and a softmax's forward, read their input once per statistic and once to
    # normalise (max, sum of exponentials, scale: the same `norm_reads`)
    softmax = name.str.contains(r"^aten\._(?:safe_)?(?:log_)?softmax\.", regex=True).to_numpy()
    moved = np.where((cls == "norm") | softmax, cost.norm_reads * read + written,
                     read + written)
    # the NLL loss gathers one log-probability per row: its forward reads the targets and
    # those, not the [rows, classes] input; its backward writes the zeroed gradient and
    # scatters into it, reading none of the log-probabilities
    nll = name.str.contains(r"^aten\.nll_loss2?d?_(?:forward|backward)\.", regex=True).to_numpy()
    if nll.any():
        moved = np.where(nll, written + gathered_bytes(ops["shapes"], nll), moved)
    bandwidth = target.hbm_bytes_per_s * cost.memory_efficiency
    memory = np.where(kernels > 0, moved / bandwidth * 1e9, 0.0)
    bn = batch_norm_rows(ops) & (kernels > 0)
    if bn.any():  # a block per channel (gpu_norm.py): its time is its memory term
        memory = np.where(bn, batch_norm_ns(ops, target, cost), memory)
    outer = (cls == "reduction") & outer_reduction(ops)
    memory = np.where(outer & (kernels > 0), memory + cost.global_reduce_ns, memory)
    # the casts are kernels of their own, run before (or after) the GEMM: their time adds
    memory = memory + cast_bytes / bandwidth * 1e9
    compute = compute + cast_bytes / bandwidth * 1e9
    kernels = kernels + casts
    if "widen_elements" in ops:  # autocast's half-to-fp32 casts: the unrolled kernel
        widen = ops["widen_elements"].to_numpy(np.float64)
        rate = target.sms * target.sm_clock_hz / 1e9
        widen_ns = np.maximum(widen * path_cycles("cast", 2, 2, cost) / rate,
                              widen * 6 / bandwidth * 1e9)
        memory, compute = memory + widen_ns, compute + widen_ns
        kernels = kernels + ops["widen_kernels"].to_numpy(np.float64)
    launch = kernels * cost.kernel_ns
    total = np.where(kernels > 0, launch + np.maximum(compute, memory), 0.0)
    out = pd.DataFrame({"cycles": np.ceil(total).astype(np.int64), "kernels": kernels,
                        "compute_ns": compute, "memory_ns": memory, "launch_ns": launch},
                       index=ops.index)
    return out


def host_bound(ops: pd.DataFrame, cost: GpuCost) -> np.ndarray:
    """ns each op's kernels wait for the host to issue them, indexed like `ops` (in program
    order, with `ipu`, `phase` and `kernels`). Eager PyTorch issues kernels from one CPU
    thread (dispatch, autograd, the launch: `host_launch_ns` per kernel); the GPU runs
    them in order, so op i starts at max(end of op i-1, host issue of op i). Per pass
    (ipu, phase), from the pass's start: g_i = D_i + max_{j<=i}(H_j - D_{j-1}), with D the
    cumulative GPU time and H the cumulative host time, so the wait is what the GPU idles
    before op i. Small batches are host-bound (zero wait once the GPU is the slower)."""
    out = np.zeros(len(ops))
    if not len(ops) or cost.host_launch_ns <= 0:
        return out
    gpu = ops["cycles"].to_numpy(np.float64)
    host = ops["kernels"].to_numpy(np.float64) * cost.host_launch_ns
    keys = ops["ipu"].astype(str) + "/" + ops["phase"].astype(str)
    for idx in pd.Series(np.arange(len(ops))).groupby(keys.to_numpy(), sort=False).indices.values():
        d, h = gpu[idx], host[idx]
        d_cum = np.cumsum(d)
        d_before = d_cum - d
        end = d_cum + np.maximum.accumulate(np.maximum(np.cumsum(h) - d_before, 0.0))
        start = end - d
        prev_end = np.concatenate(([0.0], end[:-1]))
        out[idx] = start - prev_end
    return out
