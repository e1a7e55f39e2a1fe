"""Per-op cost model: cycles and temporary memory from FLOPs and bytes (numpy-vectorised).

See docs/cost-model.md for the formulas, the constants and the calibration table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.target.costmodel import CostModel
from popviz.target.machines import Target

AMP_CLASSES = ("conv", "grouped_conv", "depthwise_conv", "matmul")
EXCHANGE_CLASSES = (*AMP_CLASSES, "data_movement")

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
    # once per distinct dtype (a program has a handful), then spread by code
    codes, uniques = pd.factorize(dtypes, use_na_sentinel=False)
    names = [str(d).replace("torch.", "") for d in uniques]
    rec = np.array([ELEMENT_BYTES.get(n, 0) for n in names], dtype=np.int64)[codes]
    is_float = np.array([n in FLOATING for n in names], dtype=bool)[codes]
    scale = np.ones(len(dtypes))
    ok = is_float & (rec > 0)
    scale[ok] = target_bytes / rec[ok]
    return scale


def _channels(out_shape: pd.Series, op_class: np.ndarray) -> np.ndarray:
    """Dim that serial passes can split: channels (dim 1) for convs, last dim for matmuls
    (1 where it is not a number). Only that dim is cut out of the text: an optimiser's
    foreach op lists hundreds of shapes."""
    out = np.ones(len(op_class), dtype=np.int64)
    for i, (shape, cls) in enumerate(zip(out_shape.tolist(), op_class.tolist(), strict=True)):
        if not isinstance(shape, str):
            continue
        body = shape.strip("[]() ")
        if cls == "matmul":
            dim = body.rsplit(",", 1)[-1]
        else:
            parts = body.split(",", 2)
            if len(parts) < 2:
                continue
            dim = parts[1]
        dim = dim.strip()
        if dim.isdigit():
            out[i] = int(dim)
    return np.maximum(out, 1)


def _dims(shape: str) -> list[int]:
    parts = [p.strip() for p in shape.strip("[]() ").split(",")]
    return [int(p) for p in parts if p.isdigit()]


@dataclass(frozen=True)
class OpFeatures:
    """Shape facts of each op the cost model needs, parsed once (a fit re-costs the same
    ops many times). An AMP op's work is split into two halves (a conv backward: data and
    weight gradient; otherwise all in half a); each half has the fraction of the AMP lanes
    it fills and its reduction depth."""

    is_amp: np.ndarray
    share_a: np.ndarray
    fill_a: np.ndarray
    depth_a: np.ndarray
    fill_b: np.ndarray
    depth_b: np.ndarray
    channels: np.ndarray  # dim a serial pass splits: conv output channels, matmul columns
    is_matmul: np.ndarray  # matmuls take CostModel.matmul_efficiency on top


def op_features(ops: pd.DataFrame, lanes: int) -> OpFeatures:
    """Lane fill and reduction depth of every conv / matmul from its recorded shapes.

    A conv's weight is its last 4-D input [out, in / groups, kh, kw]: the forward reduces
    over in / groups x kh x kw, filling min(1, (in / groups) / lanes) of the lanes (a stem
    over 3 channels, a grouped conv over 4 and a depthwise conv over 1 leave most idle).
    Its backward is half data gradient (reduces out / groups x kh x kw) and half weight
    gradient (reduces over batch x positions: full lanes, deep). A matmul reduces over its
    last input's first dim."""
    n = len(ops)
    cls = ops["op_class"].to_numpy(str) if n else np.zeros(0, dtype=str)
    is_amp = np.isin(cls, AMP_CLASSES)
    share = np.ones(n)
    fill_a, fill_b = np.ones(n), np.ones(n)
    depth_a, depth_b = np.full(n, 1e9), np.full(n, 1e9)
    shapes = ops["shapes"].to_numpy(str) if "shapes" in ops.columns else np.full(n, "")
    phase = ops["phase"].to_numpy(str) if "phase" in ops.columns else np.full(n, "")
    for i in np.flatnonzero(is_amp):
        dims = [_dims(x) for x in str(shapes[i]).split(";") if x.strip()]
        if cls[i] == "matmul":
            if dims and dims[-1]:
                k = dims[-1][0]
                fill_a[i], depth_a[i] = min(1.0, k / lanes), k
            continue
        weights = [d for d in dims if len(d) == 4]
        if not weights:
            continue
        w = weights[-1]
        area = w[2] * w[3]
        if phase[i] == "backward":
            groups = max(1, dims[1][1] // max(w[1], 1)) if len(dims) > 1 and \
                len(dims[1]) > 1 else 1
            per_group = max(1, w[0] // groups)
            share[i] = 0.5
            fill_a[i], depth_a[i] = min(1.0, per_group / lanes), per_group * area
        else:
            fill_a[i], depth_a[i] = min(1.0, w[1] / lanes), w[1] * area
    return OpFeatures(is_amp, share, fill_a, depth_a, fill_b, depth_b,
                      _channels(ops["out_shape"], cls) if n else np.ones(0, dtype=np.int64),
                      cls == "matmul")


def amp_efficiency(features: OpFeatures, cost: CostModel) -> np.ndarray:
    """Fraction of the AMP peak each op reaches: the fitted full-lane efficiency, times
    lane fill and reduction depth / (depth + depth_half), combined over the op's halves
    by time, times matmul_efficiency for a matmul (1 for non-AMP ops)."""
    def half(fill: np.ndarray, depth: np.ndarray) -> np.ndarray:
        return cost.amp_efficiency * fill * depth / (depth + cost.depth_half)

    f = features
    inv = f.share_a / half(f.fill_a, f.depth_a) + (1 - f.share_a) / half(f.fill_b, f.depth_b)
    eff = np.where(f.is_matmul, cost.matmul_efficiency / inv, 1.0 / inv)
    return np.where(f.is_amp, eff, 1.0)


@dataclass(frozen=True)
class CostTerms:
    """What an op costs before the efficiencies: everything that depends only on its shape,
    the target, the precision, AMP and the cost model's non-efficiency constants (so a fit
    of the efficiencies computes these once)."""

    flops: np.ndarray
    tiles: np.ndarray  # before views are zeroed
    amp_rate: float
    vec_rate: float
    traffic: np.ndarray  # bytes read + written at the precision
    exchange: np.ndarray
    passes: np.ndarray
    temp: np.ndarray
    ignored: np.ndarray
    zero: np.ndarray
    amp: np.ndarray


def cost_terms(ops: pd.DataFrame, target: Target, precision: Precision, amp: np.ndarray,
               cost: CostModel, features: OpFeatures) -> CostTerms:
    cls = ops["op_class"].to_numpy(str)
    flops = ops["flops"].to_numpy(np.float64)
    scale = dtype_scale(ops["dtype"], precision.compute_bytes)
    read = ops["bytes_read"].to_numpy(np.float64) * scale
    written = ops["bytes_written"].to_numpy(np.float64) * scale
    tiles = np.maximum(np.ceil(written / cost.grain_bytes),
                       np.ceil(flops / cost.min_flops_per_tile))
    tiles = np.clip(tiles, 1, target.tiles_per_ipu).astype(np.int64)

    is_amp = features.is_amp
    amp_rate = target.flops_per_tile_cycle_fp16 if precision.fp16 else \
        target.flops_per_tile_cycle_fp32
    if precision.fp16 and not precision.half_partials:
        amp_rate *= cost.float_partials_rate
    vec_rate = cost.vector_flops_per_tile_cycle_fp16 if precision.fp16 else \
        cost.vector_flops_per_tile_cycle_fp32
    exchange = np.where(np.isin(cls, EXCHANGE_CLASSES),
                        read / (tiles * target.exchange_bytes_per_tile_cycle), 0.0)

    # AMP: the unconstrained plan keeps rearranged operands plus double-buffered partials
    # per tile; a lower bound forces more serial passes (fewer temporaries, more cycles).
    elem_rec = np.where(scale > 0, precision.compute_bytes / np.maximum(scale, 1e-12), 4.0)
    out_elems = ops["bytes_written"].to_numpy(np.float64) / np.maximum(elem_rec, 1.0)
    unbounded = np.where(is_amp, (read + 2.0 * out_elems * precision.partial_bytes) / tiles, 0.0)
    max_passes = np.clip(features.channels // int(cost.channels_per_pass), 1,
                         int(cost.max_passes))
    amp = np.asarray(amp, dtype=np.float64)
    bound = amp * target.bytes_per_tile
    needed = np.maximum(np.ceil(unbounded / np.maximum(bound, 1.0)), 1)
    ignored = is_amp & (needed > max_passes)
    passes = np.where(is_amp, np.minimum(needed, max_passes), 1).astype(np.int64)
    temp = np.where(is_amp, unbounded / passes, 0.0)
    zero = flops + read + written <= 0
    return CostTerms(flops, tiles, float(amp_rate), float(vec_rate), read + written, exchange,
                     passes, temp, ignored, zero, amp)


def cost_cycles(terms: CostTerms, features: OpFeatures, target: Target, cost: CostModel
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute, memory, cycles) of each op: the efficiencies applied to its terms."""
    t = terms
    rate = np.where(features.is_amp, t.amp_rate * amp_efficiency(features, cost), t.vec_rate)
    compute = t.flops / (t.tiles * rate)
    memory = t.traffic / (t.tiles * target.memory_bytes_per_tile_cycle * cost.vector_efficiency)
    base = np.maximum(compute, memory)
    cycles = (base * (1.0 + cost.pass_penalty * (t.passes - 1)) + t.exchange
              + cost.pass_fixed_cycles * (t.passes - 1) + cost.op_overhead_cycles)
    # views, aliases and allocations do no work on an IPU: no cycles, no tiles, no code
    return compute, memory, np.where(t.zero, 0.0, cycles)


def op_costs(ops: pd.DataFrame, target: Target, precision: Precision,
             amp: np.ndarray, cost: CostModel | None = None,
             features: OpFeatures | None = None) -> pd.DataFrame:
    """Cycles, tiles used and conv/matmul temporary memory for every op.

    `amp` is the availableMemoryProportion that applies to each op (from its IPU and kind);
    `cost` defaults to the target's cost model; `features` (from `op_features`) may be
    passed in when the same ops are costed many times. Returns columns: tiles_used,
    compute_cycles, memory_cycles, exchange_cycles, passes, cycles, temp_bytes (per tile),
    temp_total_bytes, amp_used, amp_ignored."""
    cost = cost or target.cost
    lanes = cost.amp_lanes_fp16 if precision.fp16 else cost.amp_lanes_fp32
    features = features or op_features(ops, int(lanes))
    t = cost_terms(ops, target, precision, amp, cost, features)
    compute, memory, cycles = cost_cycles(t, features, target, cost)
    tiles = np.where(t.zero, 0, t.tiles)
    return pd.DataFrame({
        "tiles_used": tiles,
        "compute_cycles": np.ceil(compute).astype(np.int64),
        "memory_cycles": np.ceil(memory).astype(np.int64),
        "exchange_cycles_internal": np.ceil(t.exchange).astype(np.int64),
        "passes": t.passes,
        "cycles": np.ceil(cycles).astype(np.int64),
        "temp_bytes": np.ceil(t.temp).astype(np.int64),
        "temp_total_bytes": np.ceil(t.temp * tiles).astype(np.int64),
        "amp_used": np.where(features.is_amp, t.amp, np.nan),
        "amp_ignored": t.ignored,
    }, index=ops.index)
