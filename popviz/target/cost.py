"""Per-op cost model: cycles and temporary memory from FLOPs and bytes (numpy-vectorised).

See docs/cost-model.md for the formulas, the constants and the calibration table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from popviz.target.convparams import WU, ConvParams, op_passes
from popviz.target.convplan import compute_sets, plan_conv
from popviz.target.costmodel import CostModel
from popviz.target.machines import Target
from popviz.target.popops import kind_of, vector_cycles
from popviz.target.vertices import TileArch

if TYPE_CHECKING:
    from popviz.options import Options

AMP_CLASSES = ("conv", "grouped_conv", "depthwise_conv", "matmul")
NORM_PASSES = 2.0  # passes a norm makes over its input (statistics, then normalising)

ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8,
                 "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
FLOATING = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Precision:
    """What '16.16' / '16.32' / '32.32' and half partials mean for bytes and rates."""

    compute_bytes: int  # activations, activation gradients
    weight_bytes: int  # parameters, optimiser state, gradient accumulators
    half_partials: bool
    # norms' statistics computed the numerically stable way (the mean first): TensorFlow's
    # IPUConfig norms.use_stable_statistics, as Graphcore's CNN applications set it
    stable_norm_statistics: bool = False

    @classmethod
    def parse(cls, precision: str, half_partials: bool,
              stable_norm_statistics: bool = False) -> Precision:
        compute, weights = precision.split(".")
        return cls(2 if compute == "16" else 4, 2 if weights == "16" else 4,
                   bool(half_partials) and compute == "16", bool(stable_norm_statistics))

    @classmethod
    def of(cls, options: Options) -> Precision:
        """What `options` ask for: their precision, half partials and norm statistics."""
        return cls.parse(options.precision, options.half_partials,
                         options.stable_norm_statistics)

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


def element_bytes(dtypes: pd.Series) -> np.ndarray:
    """Bytes of one recorded element per op (1 where the dtype is unknown)."""
    codes, uniques = pd.factorize(dtypes, use_na_sentinel=False)
    size = [ELEMENT_BYTES.get(str(d).replace("torch.", ""), 1) for d in uniques]
    return np.maximum(np.array(size, dtype=np.float64)[codes], 1.0)


def tile_arch(target: Target, precision: Precision, cost: CostModel | None = None
              ) -> TileArch:
    """The tile's convolution figures for a precision, from the target's published peaks
    (vertices.py: MACs per tile cycle = units x chain / core cycles), and each planned
    compute set's start-up from `cost` (default: the target's cost model):

    - half inputs: a chain of 16 weights, 4 worker cycles a position, so units = peak
      fp16 MACs per tile cycle x 4 / 16 (Mk2, Bow: 16; Mk1: 8); with float partials at
      most 8 units (PopLibs' 'hf8' vertices; Mk2's half-partial vertices are 'hh16');
    - float inputs: a chain of 8, 8 cycles a position: units = peak fp32 MACs x 8 / 8.
    SLIC is an IPU2 vertex: only where 16 half-partial units exist."""
    if precision.fp16:
        units16 = _units(target.flops_per_tile_cycle_fp16 / 2 * 4 / 16)
        units = units16 if precision.half_partials else min(units16, 8)
        wpu, load, core, slic = 16, 4, 4, units16 >= 16
    else:
        units = _units(target.flops_per_tile_cycle_fp32 / 2 * 8 / 8)
        wpu, load, core, slic = 8, 2, 8, False
    return TileArch(tiles=target.tiles_per_ipu, bytes_per_tile=target.bytes_per_tile,
                    units=units, weights_per_unit=wpu, load_elems=load, core=core,
                    elem_bytes=precision.compute_bytes, partial_bytes=precision.partial_bytes,
                    out_bytes=precision.compute_bytes,
                    exchange_bytes_per_cycle=target.exchange_bytes_per_tile_cycle, slic=slic,
                    set_start_cycles=float((cost or target.cost).plan_compute_set_cycles))


def _units(derived: float) -> int:
    """Conv units a tile has: a power of two, at most 16 (the IPU's vertices come in 8- and
    16-unit forms), nearest the published peak's figure. A user target that changes the
    tile count but keeps an IPU's peak would otherwise get hundreds of units per tile."""
    return int(min(16, 2 ** max(0, round(math.log2(max(derived, 1.0))))))


@dataclass(frozen=True)
class OpFeatures:
    """Shape facts of each op, parsed once (a fit re-costs the same ops many times): the
    convolution passes (convparams.py) of every conv / matmul, batch-scaled to its FLOPs."""

    is_amp: np.ndarray
    is_conv: np.ndarray  # convolutions (amp_efficiency scales the matmuls)
    passes: tuple[tuple[ConvParams, ...], ...]  # per op; () for vector ops


def _scaled(passes: list[ConvParams], flops: float) -> tuple[ConvParams, ...]:
    """Passes whose MACs match the op's recorded FLOPs: a program rescaled to another
    micro-batch keeps its recorded shapes, so the batch-like dimension follows the FLOPs."""
    macs = sum(p.macs for p in passes)
    if not passes or macs <= 0 or flops <= 0:
        return tuple(passes)
    ratio = flops / (2.0 * macs)
    if abs(ratio - 1.0) < 0.01:
        return tuple(passes)
    out = []
    for p in passes:
        if p.kind == WU:
            out.append(replace(p, in_chans=max(1, round(p.in_chans * ratio))))
        else:
            out.append(replace(p, batch=max(1, round(p.batch * ratio))))
    return tuple(out)


def op_features(ops: pd.DataFrame) -> OpFeatures:
    """The convolution passes of every conv / matmul (one parse per distinct op)."""
    n = len(ops)
    cls = ops["op_class"].to_numpy(str) if n else np.zeros(0, dtype=str)
    is_amp = np.isin(cls, AMP_CLASSES)
    passes: list[tuple[ConvParams, ...]] = [()] * n
    cols = [ops[c].astype(str).to_numpy() if c in ops.columns else np.full(n, "")
            for c in ("op", "shapes", "out_shape")]
    flops = ops["flops"].to_numpy(np.float64) if n else np.zeros(0)
    seen: dict[tuple[str, str, str, str, float], tuple[ConvParams, ...]] = {}
    for i in np.flatnonzero(is_amp):
        key = (cols[0][i], cls[i], cols[1][i], cols[2][i], float(flops[i]))
        if key not in seen:
            seen[key] = _scaled(op_passes(key[0], key[1], key[2], key[3], key[4]), key[4])
        passes[i] = seen[key]
    return OpFeatures(is_amp, is_amp & (cls != "matmul"), tuple(passes))


def planned_op_cycles(plans: list, arch: TileArch, cost: CostModel, is_conv: bool) -> float:
    """One conv / matmul op's cycles from its passes' plans: the plans' cycles (exchange
    included) over the fitted factor of its class, plus each compute set's sync and each
    exchange's fixed cost (what `cost_cycles` computes for a table of ops)."""
    reach = cost.conv_efficiency if is_conv else cost.amp_efficiency
    counted = [compute_sets(p, arch) for p in plans]
    return (sum(p.cycles for p in plans) / reach
            + sum(c[0] for c in counted) * cost.sync_cycles_internal
            + sum(c[1] for c in counted) * cost.exchange_fixed_cycles)


@dataclass(frozen=True)
class CostTerms:
    """What an op costs before the fitted efficiencies: everything that depends only on its
    shape, the target, the precision and AMP (a fit computes these once)."""

    flops: np.ndarray
    tiles: np.ndarray  # before views are zeroed
    traffic: np.ndarray  # bytes read + written at the precision
    vector: np.ndarray  # vector ops: popops vertex cycles on the busiest tile (popops.py)
    fixed: np.ndarray  # every op: its compute sets' syncs and exchange fixed costs, and
    # (vector ops) the bytes they exchange; not scaled by the fitted efficiencies
    plan_cycles: np.ndarray  # conv / matmul: the planned passes' cycles (0 for vector ops)
    plan_exchange: np.ndarray
    passes: np.ndarray  # serial slices of the slowest pass (1: none)
    temp: np.ndarray  # per tile, the largest pass: what its plan adds to a tile
    ignored: np.ndarray
    zero: np.ndarray
    amp: np.ndarray
    plans: tuple[str, ...]


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
    amp = np.asarray(amp, dtype=np.float64)
    n = len(ops)
    plan_cycles, plan_exchange = np.zeros(n), np.zeros(n)
    passes, temp = np.ones(n, dtype=np.int64), np.zeros(n)
    ignored = np.zeros(n, dtype=bool)
    plans = [""] * n
    sets, exchanging, moved = np.zeros(n), np.zeros(n), np.zeros(n)
    arch = tile_arch(target, precision, cost)
    for i in np.flatnonzero(features.is_amp):
        chosen = [plan_conv(p, arch, round(float(amp[i]), 6)) for p in features.passes[i]]
        if not chosen:
            continue
        plan_cycles[i] = sum(c.cycles for c in chosen)
        plan_exchange[i] = sum(c.exchange_cycles for c in chosen)
        tiles[i] = max(c.tiles for c in chosen)
        temp[i] = max(c.temp_bytes for c in chosen)
        passes[i] = max(c.serial[1] for c in chosen)
        ignored[i] = any(c.ignored for c in chosen)
        counted = [compute_sets(c, arch) for c in chosen]
        sets[i] = sum(c[0] for c in counted)
        exchanging[i] = sum(c[1] for c in counted)
        plans[i] = "; ".join(f"{p.kind}: {c.describe()}, {c.estimate:,.0f} cycles planned "
                             f"+ {c.start_cycles:,.0f} start-up, "
                             f"{c.temp_bytes:,.0f} B temporary per tile"
                             + (" (over the AMP bound: the leanest plan)" if c.ignored else "")
                             for p, c in zip(features.passes[i], chosen, strict=True))
    zero = flops + read + written <= 0
    # a norm streams its input more than once: statistics (a reduction per channel), then
    # the normalising pass; its backward two reductions, then the elementwise gradient
    traffic = (read + written) * np.where(cls == "norm", NORM_PASSES, 1.0)
    vector = np.zeros(n)
    rest = np.flatnonzero(~features.is_amp & ~zero)
    if len(rest):
        names = ops["op"].astype(str).to_numpy() if "op" in ops.columns else np.full(n, "")
        recorded = element_bytes(ops["dtype"].iloc[rest])
        shapes = [ops[c].astype(str).to_numpy() if c in ops.columns else np.full(n, "")
                  for c in ("shapes", "out_shape")]
        got = vector_cycles(
            [kind_of(names[i], cls[i]) for i in rest],
            ops["bytes_read"].to_numpy(np.float64)[rest] / recorded,
            ops["bytes_written"].to_numpy(np.float64)[rest] / recorded,
            written[rest], tiles[rest], precision.fp16,
            names=[names[i] for i in rest],
            in_shapes=[shapes[0][i].split(";")[0] for i in rest],
            out_shapes=[shapes[1][i] for i in rest],
            exchange_rate=float(target.exchange_bytes_per_tile_cycle),
            stable_statistics=precision.stable_norm_statistics)
        vector[rest] = got.vertex
        moved[rest] = got.exchange
        sets[rest] = got.sets
        exchanging[rest] = got.exchanging
    fixed = sets * cost.sync_cycles_internal + exchanging * cost.exchange_fixed_cycles + moved
    return CostTerms(flops, tiles, traffic, vector, fixed, plan_cycles,
                     plan_exchange, passes, temp, ignored, zero, amp, tuple(plans))


def cost_cycles(terms: CostTerms, features: OpFeatures, target: Target, cost: CostModel
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute, memory, cycles) of each op: a conv / matmul's planned cycles (exchange
    included) over the fitted amp_efficiency; a vector op its popops vertex cycles over
    the fitted vector_efficiency (memory: the time its traffic alone would take at the
    tile's memory bandwidth, for the ops table; the vertex loops are already load/store
    bound); every op plus its compute sets' fixed costs. One factor over the whole plan
    keeps the planner's choice (fastest plan within the AMP bound) the fastest after
    scaling, so a lower AMP never models faster."""
    t = terms
    planned = ~t.zero & features.is_amp & (t.plan_cycles > 0)
    reach = np.where(features.is_conv, cost.conv_efficiency, cost.amp_efficiency)
    compute = np.where(planned, (t.plan_cycles - t.plan_exchange) / reach,
                       t.vector / cost.vector_efficiency)
    memory = np.where(planned, 0.0, t.traffic / (
        t.tiles * target.memory_bytes_per_tile_cycle))
    cycles = np.where(planned, t.plan_cycles / reach, compute) + t.fixed
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
    features = features or op_features(ops)
    t = cost_terms(ops, target, precision, amp, cost, features)
    compute, memory, cycles = cost_cycles(t, features, target, cost)
    tiles = np.where(t.zero, 0, t.tiles)
    return pd.DataFrame({
        "tiles_used": tiles,
        "compute_cycles": np.ceil(compute).astype(np.int64),
        "memory_cycles": np.ceil(memory).astype(np.int64),
        "exchange_cycles_internal": np.ceil(t.plan_exchange / np.where(
            features.is_conv, cost.conv_efficiency, cost.amp_efficiency)
                                            ).astype(np.int64),
        "passes": t.passes,
        "cycles": np.ceil(cycles).astype(np.int64),
        "temp_bytes": np.ceil(t.temp).astype(np.int64),
        "temp_total_bytes": np.ceil(t.temp * tiles).astype(np.int64),
        "amp_used": np.where(features.is_amp, t.amp, np.nan),
        "amp_ignored": t.ignored,
        "plan": list(t.plans),
    }, index=ops.index)
