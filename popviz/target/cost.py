"""Per-op cost model: cycles and temporary memory from FLOPs and bytes (numpy-vectorised).

See docs/cost-model.md for the formulas, the constants and the calibration table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.target.machines import Target

# Fraction of the peak FLOP rate each class reaches (assumed, calibrated in cost-model.md).
FLOP_EFFICIENCY: dict[str, float] = {
    "conv": 0.36, "grouped_conv": 0.15, "depthwise_conv": 0.04, "matmul": 0.45,
    "elementwise": 0.35, "reduction": 0.3, "norm": 0.2, "data_movement": 1.0, "other": 0.2,
}
# Fraction of on-chip memory bandwidth each class reaches (assumed).
MEMORY_EFFICIENCY: dict[str, float] = {
    "conv": 0.5, "grouped_conv": 0.4, "depthwise_conv": 0.35, "matmul": 0.5,
    "elementwise": 0.35, "reduction": 0.3, "norm": 0.25, "data_movement": 0.5, "other": 0.2,
}
AMP_CLASSES = ("conv", "grouped_conv", "depthwise_conv", "matmul")
EXCHANGE_CLASSES = (*AMP_CLASSES, "data_movement")
FLOAT_PARTIALS_RATE = 0.75  # assumed: fp32 partials slow the AMP pipeline vs half partials
PASS_PENALTY = 0.12  # assumed: each extra serial pass re-exchanges operands
PASS_FIXED_CYCLES = 100  # assumed
GRAIN_BYTES = 128  # smallest slice of a tensor put on one tile
MIN_FLOPS_PER_TILE = 2048  # an op is not spread thinner than this
MAX_PASSES_CAP = 64

ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8,
                 "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
FLOATING = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Precision:
    """What '16.16' / '16.32' / '32.32' and half partials mean for bytes and rates."""

    compute_bytes: int  # activations, activation gradients
    weight_bytes: int  # parameters, optimiser state, gradient accumulators
    half_partials: bool

    @classmethod
    def parse(cls, precision: str, half_partials: bool) -> Precision:
        compute, weights = precision.split(".")
        return cls(2 if compute == "16" else 4, 2 if weights == "16" else 4,
                   bool(half_partials) and compute == "16")

    @property
    def fp16(self) -> bool:
        return self.compute_bytes == 2

    @property
    def partial_bytes(self) -> int:
        return 2 if self.half_partials else 4


def dtype_scale(dtypes: pd.Series, target_bytes: int) -> np.ndarray:
    """Factor from recorded bytes to bytes at the target precision (1 for non-floats)."""
    rec = dtypes.map(lambda d: ELEMENT_BYTES.get(str(d).replace("torch.", ""), 0)).to_numpy()
    is_float = dtypes.map(lambda d: str(d).replace("torch.", "") in FLOATING).to_numpy()
    scale = np.ones(len(dtypes))
    ok = is_float & (rec > 0)
    scale[ok] = target_bytes / rec[ok]
    return scale


def _channels(out_shape: pd.Series, op_class: np.ndarray) -> np.ndarray:
    """Dim that serial passes can split: channels (dim 1) for convs, last dim for matmuls."""
    dims = out_shape.str.strip("[]() ").str.split(",")
    second = dims.str.get(1).astype(object).fillna("").astype(str).str.strip()
    last = dims.str.get(-1).astype(object).fillna("").astype(str).str.strip()
    pick = np.where(op_class == "matmul", last.to_numpy(str), second.to_numpy(str))
    out = np.ones(len(pick), dtype=np.int64)
    digits = np.char.isdigit(pick.astype(str))
    out[digits] = pick[digits].astype(np.int64)
    return np.maximum(out, 1)


def _dims(shape: str) -> list[int]:
    parts = [p.strip() for p in shape.strip("[]() ").split(",")]
    return [int(p) for p in parts if p.isdigit()]


def depth_utilisation(ops: pd.DataFrame, lanes: int) -> np.ndarray:
    """Fraction of the AMP units' input-channel lanes an op fills: they reduce `lanes`
    channels at a time, so a conv over 3 input channels (a stem) wastes most of them. A
    conv's weight is its last 4-D input (forward reduces over its dim 1; the backward's
    data half over dim 0, its weight half over the batch); a matmul reduces over its last
    input's first dim."""
    out = np.ones(len(ops))
    cls = ops["op_class"].to_numpy(str)
    amp = np.flatnonzero(np.isin(cls, AMP_CLASSES) & (cls != "depthwise_conv"))
    shapes = ops["shapes"].to_numpy(str) if "shapes" in ops.columns else None
    if shapes is None:
        return out
    phase = ops["phase"].to_numpy(str) if "phase" in ops.columns else np.full(len(ops), "")
    for i in amp:
        dims = [_dims(x) for x in str(shapes[i]).split(";") if x.strip()]
        if cls[i] == "matmul":
            if dims and dims[-1]:
                out[i] = min(1.0, dims[-1][0] / lanes)
            continue
        weights = [d for d in dims if len(d) == 4]
        if not weights:
            continue
        w = weights[-1]
        if phase[i] == "backward":
            out[i] = 0.5 * min(1.0, w[0] / lanes) + 0.5
        else:
            out[i] = min(1.0, w[1] / lanes)
    return out


def op_costs(ops: pd.DataFrame, target: Target, precision: Precision,
             amp: np.ndarray) -> pd.DataFrame:
    """Cycles, tiles used and conv/matmul temporary memory for every op.

    `amp` is the availableMemoryProportion that applies to each op (from its IPU and kind).
    Returns columns: tiles_used, compute_cycles, memory_cycles, exchange_cycles, passes,
    cycles, temp_bytes (per tile), temp_total_bytes, amp_used, amp_ignored."""
    n = len(ops)
    cls = ops["op_class"].to_numpy(str)
    flops = ops["flops"].to_numpy(np.float64)
    scale = dtype_scale(ops["dtype"], precision.compute_bytes)
    read = ops["bytes_read"].to_numpy(np.float64) * scale
    written = ops["bytes_written"].to_numpy(np.float64) * scale
    tiles_total = target.tiles_per_ipu

    tiles = np.maximum(np.ceil(written / GRAIN_BYTES), np.ceil(flops / MIN_FLOPS_PER_TILE))
    tiles = np.clip(tiles, 1, tiles_total).astype(np.int64)

    is_amp = np.isin(cls, AMP_CLASSES)
    amp_rate = target.flops_per_tile_cycle_fp16 if precision.fp16 else \
        target.flops_per_tile_cycle_fp32
    if precision.fp16 and not precision.half_partials:
        amp_rate *= FLOAT_PARTIALS_RATE
    vec_rate = target.vector_flops_per_tile_cycle_fp16 if precision.fp16 else \
        target.vector_flops_per_tile_cycle_fp32
    rate = np.where(is_amp, amp_rate, vec_rate)
    f_eff = np.array([FLOP_EFFICIENCY.get(c, FLOP_EFFICIENCY["other"]) for c in cls]) if n \
        else np.zeros(0)
    m_eff = np.array([MEMORY_EFFICIENCY.get(c, MEMORY_EFFICIENCY["other"]) for c in cls]) if n \
        else np.zeros(0)
    lanes = 16 if precision.fp16 else 8
    compute = flops / (tiles * rate * f_eff * depth_utilisation(ops, lanes))
    memory = (read + written) / (tiles * target.memory_bytes_per_tile_cycle * m_eff)
    exchange = np.where(np.isin(cls, EXCHANGE_CLASSES),
                        read / (tiles * target.exchange_bytes_per_tile_cycle), 0.0)

    # AMP: the unconstrained plan keeps rearranged operands plus double-buffered partials
    # per tile; a lower bound forces more serial passes (fewer temporaries, more cycles).
    elem_rec = np.where(scale > 0, precision.compute_bytes / np.maximum(scale, 1e-12), 4.0)
    out_elems = ops["bytes_written"].to_numpy(np.float64) / np.maximum(elem_rec, 1.0)
    unbounded = np.where(is_amp, (read + 2.0 * out_elems * precision.partial_bytes) / tiles, 0.0)
    max_passes = np.clip(_channels(ops["out_shape"], cls) // 8, 1, MAX_PASSES_CAP)
    amp = np.asarray(amp, dtype=np.float64)
    bound = amp * target.bytes_per_tile
    needed = np.maximum(np.ceil(unbounded / np.maximum(bound, 1.0)), 1)
    ignored = is_amp & (needed > max_passes)
    passes = np.where(is_amp, np.minimum(needed, max_passes), 1).astype(np.int64)
    temp = np.where(is_amp, unbounded / passes, 0.0)

    base = np.maximum(compute, memory)
    cycles = (base * (1.0 + PASS_PENALTY * (passes - 1)) + exchange
              + PASS_FIXED_CYCLES * (passes - 1) + target.op_overhead_cycles)
    # views, aliases and allocations do no work on an IPU: no cycles, no tiles, no code
    zero = flops + read + written <= 0
    cycles = np.where(zero, 0.0, cycles)
    tiles = np.where(zero, 0, tiles)
    return pd.DataFrame({
        "tiles_used": tiles,
        "compute_cycles": np.ceil(compute).astype(np.int64),
        "memory_cycles": np.ceil(memory).astype(np.int64),
        "exchange_cycles_internal": np.ceil(exchange).astype(np.int64),
        "passes": passes,
        "cycles": np.ceil(cycles).astype(np.int64),
        "temp_bytes": np.ceil(temp).astype(np.int64),
        "temp_total_bytes": np.ceil(temp * tiles).astype(np.int64),
        "amp_used": np.where(is_amp, amp, np.nan),
        "amp_ignored": ignored,
    }, index=ops.index)
