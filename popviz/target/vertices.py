"""Vertex cycle estimates of one tile, after PopLibs' (lib/poplin/PerformanceEstimation.hpp,
lib/popops/PerformanceEstimation.cpp at graphcore/poplibs 7eac0f2), restated and simplified.

A tile runs six worker contexts in turn: a worker issues one instruction every six tile
cycles, so a vertex whose busiest worker needs X worker cycles takes 6 X tile cycles; a
supervisor vertex adds its own (tile) cycles. The load / store path is 64 bits: 4 halves or
2 floats per vector. Every function takes numpy arrays or plain numbers (the planner costs
thousands of candidate partitions at once; the tests work single cases by hand).

AMP (the accumulating matrix product units, poplin ConvPartialnx1 / ConvPartial1x1Out):
`units` conv units each take a chain of `weights_per_unit` weights (16 halves, 8 floats);
a weight block is `in_group` input channels x `height` kernel rows (in_group x height =
weights_per_unit) by `units` output channels. Each output position of a worklist costs a
worker `core` cycles per block (4 for half inputs, 8 for float): with all six workers busy
that is units x weights_per_unit / core MACs per tile cycle, the published peak (Mk2, half
partials: 16 x 16 / 4 = 64 MACs = 128 FLOPs per tile per cycle = 250 TFLOPS at 1.33 GHz).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WORKERS = 6  # worker contexts per tile (reference/ipu.md: 6 threads per tile)
DATA_PATH_BYTES = 8  # 64-bit load / store path
ArrayLike = np.ndarray | int | float


def ceil_div(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    return -(-np.asarray(a, dtype=np.int64) // np.asarray(b, dtype=np.int64))


@dataclass(frozen=True)
class TileArch:
    """What the planner needs of a tile, for one precision (see `tile_arch`)."""

    tiles: int
    bytes_per_tile: int
    units: int  # conv units in use: AMP output channels per block
    weights_per_unit: int  # 16 (half inputs), 8 (float)
    load_elems: int  # input elements a conv unit loads per cycle: 4 half, 2 float
    core: int  # worker cycles per output position per block: 4 half, 8 float
    elem_bytes: int
    partial_bytes: int
    out_bytes: int  # the conv's output element (partials are cast to it)
    exchange_bytes_per_cycle: float  # per tile, incoming
    slic: bool  # the SLIC vertex (IPU2 and later, half inputs)
    # each compute set's start-up on every tile beyond PopLibs' estimate (CostModel
    # plan_compute_set_cycles): the planner counts it, so a plan of fewer compute sets can win
    set_start_cycles: float = 0.0

    @property
    def in_groups(self) -> tuple[int, ...]:
        """AMP input-channel groupings: divisors of the chain, multiples of the load."""
        return tuple(g for g in (16, 8, 4, 2) if g <= self.weights_per_unit
                     and self.weights_per_unit % g == 0 and g % self.load_elems == 0)

    @property
    def vector_width(self) -> int:
        return DATA_PATH_BYTES // self.elem_bytes

    @property
    def amp_macs_per_cycle(self) -> float:
        return self.units * self.weights_per_unit / self.core


def amp_worker_cycles(arch: TileArch, rows: ArrayLike, positions: ArrayLike) -> np.ndarray:
    """The busiest worker of one AMP block: 17 set-up cycles, then per worklist entry (an
    output row) 3 + 34 - 9 - 3 x core, and `core` per position (PopLibs'
    getConvPartialnx1WorkerCycles for rows of 3 or more positions)."""
    entry = 3 + (34 if arch.core == 4 else 45) - 9 - 3 * arch.core
    return 17 + ceil_div(rows, WORKERS) * entry + ceil_div(positions, WORKERS) * arch.core


def amp_weight_load_cycles(arch: TileArch) -> int:
    """Loading one weight block into the conv units: units x chain x element bytes over an
    8-byte coefficient load path, plus the inner loop's fixed 15 + 3 cycles."""
    return arch.units * arch.weights_per_unit * arch.elem_bytes // DATA_PATH_BYTES + 18


def amp_cycles(arch: TileArch, groups: ArrayLike, in_blocks: ArrayLike,
               out_blocks: ArrayLike, kernel_blocks: ArrayLike, rows: ArrayLike,
               positions: ArrayLike) -> np.ndarray:
    """An AMP vertex on one tile: 109 fixed, 16 per group, 14 per input-channel block, 14
    per output block, and per weight block its load, 30 of loop control and six times the
    busiest worker (PopLibs' outer, inner and kernel loops, simplified)."""
    blocks = (np.asarray(groups) * np.asarray(in_blocks) * np.asarray(out_blocks)
              * np.asarray(kernel_blocks))
    per_block = amp_weight_load_cycles(arch) + 30 + WORKERS * amp_worker_cycles(
        arch, rows, positions)
    loops = np.asarray(groups) * (16 + np.asarray(in_blocks) * (14 + 14 * np.asarray(
        out_blocks)))
    return 109 + loops + blocks * per_block


def uses_1x1_vertex(arch: TileArch, kernel: tuple[int, int], stride: tuple[int, int],
                    in_group: int) -> bool:
    """Whether PopLibs runs a pass on its 1x1 AMP vertex (ConvPartial1x1Out): a 1 x 1
    kernel at stride 1 with one kernel row per weight block (poplin ConvModel.cpp
    canUseConvPartial1x1Vertex). Costed here for half inputs on the 16-unit (hh16) or
    float-partials (hf8) vertices, PopLibs' common code path; other cases keep the nx1
    formula."""
    return (kernel == (1, 1) and stride == (1, 1) and in_group == arch.weights_per_unit
            and arch.core == 4 and (arch.units == 16 or arch.partial_bytes == 4))


def amp_1x1_inner_cycles(positions: ArrayLike) -> np.ndarray:
    """The 1x1 vertex's run of its workers over one weight block, without zeroing: each
    worker one contiguous slice of the positions (n = 0, 1, 2: 22, 33, 42; else 38 +
    4 (n - 3); less 7 retained), the slowest x 6, or the fastest x 6 + 14 (poplin
    getConvPartial1x1SupervisorInnerLoopCycleEstimateHalfFloat)."""
    pos = np.asarray(positions, dtype=np.int64)

    def worker(n: np.ndarray) -> np.ndarray:
        base = np.where(n == 0, 22, np.where(n == 1, 33, np.where(
            n == 2, 42, 38 + 4 * (n - 3))))
        return base - 7

    most, least = ceil_div(pos, WORKERS), pos // WORKERS
    fastest = np.where(pos < WORKERS, 0, WORKERS * worker(least))
    return np.maximum(WORKERS * worker(most), fastest + 14)


def amp_1x1_block_cycles(arch: TileArch, positions: ArrayLike) -> np.ndarray:
    """One weight block of the 1x1 vertex: 25 supervisor cycles (19 + 6), the weight load
    (units x chain bytes / 8) and the workers' run."""
    load = arch.units * arch.weights_per_unit * arch.elem_bytes // DATA_PATH_BYTES
    return 25 + load + amp_1x1_inner_cycles(positions)


def amp_1x1_loop_cycles(groups: ArrayLike, in_blocks: ArrayLike, out_blocks: ArrayLike
                        ) -> np.ndarray:
    """The 1x1 vertex's cycles outside its weight blocks (poplin
    getConvPartial1x1SupervisorOuterLoopCycleEstimateHalfFloat, common path): 50 + 6 x (7
    + 3 x (in x groups - 1)) retained-state set-up, per group 13 + 11 + 15 per further
    input block, less 6 per output block of the first input block (its zeroing workers
    run 1 cycle shorter)."""
    g, i, o = (np.asarray(x, dtype=np.int64) for x in (groups, in_blocks, out_blocks))
    return 50 + WORKERS * (7 + 3 * (i * g - 1)) + g * (24 + 15 * (i - 1)) - WORKERS * g * o


def amp_1x1_cycles(arch: TileArch, groups: ArrayLike, in_blocks: ArrayLike,
                   out_blocks: ArrayLike, positions: ArrayLike) -> np.ndarray:
    """The 1x1 AMP vertex on one tile (poplin getConvPartial1x1SupervisorCycleEstimate):
    its loops and one block per (group, input block, output block)."""
    blocks = (np.asarray(groups, dtype=np.int64) * np.asarray(in_blocks, dtype=np.int64)
              * np.asarray(out_blocks, dtype=np.int64))
    return amp_1x1_loop_cycles(groups, in_blocks, out_blocks) \
        + blocks * amp_1x1_block_cycles(arch, positions)


def zero_cycles(arch: TileArch, partial_elems: ArrayLike, blocks: ArrayLike) -> np.ndarray:
    """Zeroing the partials before an nx1 AMP vertex (the 1x1 vertex zeroes as it goes):
    per output block, (elements per worker / 2 + 5) worker cycles (poplin
    estimateZeroSupervisorCycles, float partials: 2 per 64 bits)."""
    per_block = ceil_div(np.maximum(partial_elems, 0), np.maximum(blocks, 1))
    return WORKERS * (ceil_div(ceil_div(per_block, WORKERS), 2) + 5) * np.asarray(blocks)


def exchange_cycles(arch: TileArch, nbytes: ArrayLike) -> np.ndarray:
    """Receiving `nbytes` on a tile (poplin's exchange estimate: bytes / bytes per cycle)."""
    return np.ceil(np.asarray(nbytes, dtype=np.float64) / arch.exchange_bytes_per_cycle)


def reduce_cycles(arch: TileArch, outputs: ArrayLike, depth: ArrayLike) -> np.ndarray:
    """Adding `depth` partials of `outputs` values on one tile (poplin getReduceCycleEstimate,
    fast path): accumulators of 4 floats (8 halves), 2 cycles per partial vector and 8 per
    loop, 20 per worker and 33 for the supervisor; nothing when depth is 1."""
    acc = 4 if arch.partial_bytes == 4 else 8
    loops = ceil_div(ceil_div(outputs, acc), WORKERS)
    d = np.asarray(depth)
    cycles = WORKERS * (20 + (2 * (d - 1) + 8) * loops) + 33
    return np.where(d > 1, cycles, 0)


def cast_cycles(elements: ArrayLike, width: int) -> np.ndarray:
    """A cast of `elements` on one tile (popops estimateCastCycles): (per worker / width + 26)
    worker cycles."""
    return WORKERS * (ceil_div(ceil_div(elements, WORKERS), width) + 26)


def copy_cycles(arch: TileArch, nbytes: ArrayLike) -> np.ndarray:
    """Rearranging `nbytes` on a tile before a pass (poplin addTransformCycleEstimate):
    5 cycles per 4 elements' bytes."""
    return np.ceil(np.asarray(nbytes, dtype=np.float64) * 5 / (arch.elem_bytes * 4))


def hmac_cycles(arch: TileArch, macs: ArrayLike, rows: ArrayLike) -> np.ndarray:
    """A horizontal-MAC vertex: vector dot products, `vector_width` MACs a worker cycle,
    65 fixed and about 19 per row of output (getConvPartialHorizontalMacCycleEstimate)."""
    per_worker = ceil_div(macs, WORKERS * arch.vector_width) + 19 * ceil_div(rows, WORKERS)
    return 65 + WORKERS * (16 + per_worker)


def slic_cycles(arch: TileArch, group_blocks: ArrayLike, block: ArrayLike,
                windows: ArrayLike, rows: ArrayLike, positions: ArrayLike,
                chans: int = 1) -> np.ndarray:
    """A SLIC vertex on one tile, as PopLibs estimates it (half inputs, half partials, four
    conv chains: graphcore/poplibs 7eac0f2, lib/poplin/PerformanceEstimation.hpp,
    getConvPartialSlicSupervisor{WeightLoad,OuterLoop,InnerLoop}CycleEstimate*):
    `group_blocks` blocks of `block` one-channel conv groups (4, 8 or 16), `windows`
    1 x 4 kernel windows (sub-kernels), `rows` worklist rows of `positions` / `rows`
    outputs, shared by the six workers. `chans` in and out channels a group: 1 (blocks of
    4 / 8 / 16 groups), 2 (blocks of 2) or 4 (one group a block: ResNeXt's 32 x 4d).

    Per worker: 17 cycles of preamble (+4 for 8 and 16 groups), per row 10 (+1 when it
    zeroes its partials) and 15 + (n - 5) for n >= 5 outputs (a short-row table below 5);
    a block of 8 or 16 groups runs that once per 4 groups. The supervisor: 28, per group
    block 15 (+8), per window its weight load (37 + 6 x 10, +6 x 1 for 8 / 16 groups)
    and ~20 of control (~21 per 4 groups, +15, for 8 / 16). So a window costs about one
    tile cycle per output position per 4 groups: 16 MACs a cycle at 4 taps, 12 at a
    3-wide kernel (the sort heuristic's getMaxMACsPerCyclePerTile says 32: it orders
    the search, the estimate decides)."""
    g = np.asarray(block, dtype=np.int64)
    cgg = np.asarray(group_blocks, dtype=np.int64)
    subs = np.maximum(np.asarray(windows, dtype=np.int64), 1)
    rows = np.maximum(np.asarray(rows, dtype=np.int64), 1)
    n = np.maximum(ceil_div(positions, rows), 1)  # outputs per row
    per_worker_rows = ceil_div(rows, WORKERS)
    wide = g > 4

    def row_cycles(zeroing: bool) -> np.ndarray:
        long = 15 + (n - 5)
        if zeroing:
            short = 10 + np.where(n > 1, n, 0) + 3
        else:
            short = 7 + np.where(n == 1, 6, 1 + (n - 1) + 2 + (4 - n) + 2 + (3 - (4 - n)) + 3)
        return np.where(n >= 5, long, short)

    preamble = 17 + np.where(wide, 4, 0)

    def inner(zeroing: bool) -> np.ndarray:
        worker = preamble + per_worker_rows * (10 + int(zeroing) + row_cycles(zeroing))
        return worker * WORKERS

    strides = np.maximum(g // 4, 1)
    if chans == 4:  # the supervisor loads the weights itself
        weight_load = np.full(g.shape, 6 + 6 + 6 + 16)
    else:  # the workers rearrange them: 12 cycles for 2 groups, 10 (+1 over 4) for more
        worker_load = np.where(g == 2, 12, 10) + np.where(wide, 1, 0)
        weight_load = 9 + 6 + worker_load * WORKERS + 6 + 16

    def brnzdec(k: np.ndarray) -> np.ndarray:
        return 6 * (k - 1) + 1

    sub_body = np.where(wide, (weight_load + 21) * strides + brnzdec(strides) + 15,
                        weight_load + 20)
    cgg_body = 15 + np.where(wide, 8, 0)
    # as PopLibs: only the non-zeroing passes run once per 4 groups
    iz, rest = inner(True), inner(False) * strides
    return (28 + cgg_body * cgg + brnzdec(cgg) + sub_body * subs + brnzdec(subs)
            + cgg * iz + cgg * (subs - 1) * rest)
