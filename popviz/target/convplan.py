"""A convolution / matmul planner in PopLibs' manner (poplin/ConvPlan.cpp, ConvModel.cpp).

For one pass of one convolution (`ConvParams`), search how to partition it over the
tiles of an IPU: splits of the batch, of the output field (height, width), of the conv
groups, of the input channels (each slice then holds partial sums that a reduction adds
across tiles) and of the output channels. Every candidate is costed per tile, the busiest
tile being the op's time (all tiles run the same vertex in one BSP compute phase):

    cycles = exchange of the tile's inputs and weights
           + zeroing its partials + the conv vertex (AMP, SLIC or HMAC: vertices.py)
           + (input channels split) exchange of the partials + their reduction
           + each compute set's start-up (TileArch.set_start_cycles: what PopLibs'
             simulation counts beyond its planner's estimate, `Plan.estimate`)

and its temporary memory per tile is what a plan adds while it runs: the exchanged input
and weight slices, the partials, and the incoming partials of the reduction. The plan kept
is the fastest whose temporary bytes per tile stay under availableMemoryProportion x tile
bytes, serial slices of the output or input channels (planned one after the other: less
memory, more cycles) searched with the parallel splits, as PopLibs does; when nothing fits,
the plan with the least temporary memory is taken and flagged (`ignored`). AMP's effect on
cycles therefore falls out of the search: a lower bound rules out the faster, more replicated plans.

The search tries the AMP vertex with each input-channel grouping (a small grouping packs
several kernel rows into one weight block, which is how a 3-channel stem keeps its conv
units busy), the operands swapped for matmul-shaped passes, expandDims (a kernel dimension
folded into few input channels, its input gathered first) and SLIC / HMAC for depthwise
convolutions. PopLibs' further transforms (flattening output dimensions into channels,
combining groups, kernel splits) and its VMAC vertex are left out; docs/cost-model.md says
what that misses, and bench/bench_poplibs_layers.py measures it against PopLibs' own
estimates of whole layers. The grid of partitions of
one variant, costed, and its frontier are convgrid.py's; this module picks among them.
Plans and grids are cached by their parameters (ResNet repeats its conv shapes, and a tune
search re-plans the same shapes often); `clear_caches` empties them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from popviz.target.convgrid import cands as _cands
from popviz.target.convgrid import grid as _grid
from popviz.target.convgrid import reduce_stages
from popviz.target.convparams import WU, ConvParams
from popviz.target.vertices import (
    TileArch,
    cast_cycles,
    ceil_div,
    exchange_cycles,
    hmac_cycles,
    slic_cycles,
)

SERIAL_SPLITS = (2, 4, 8, 16)


@dataclass(frozen=True)
class Plan:
    """How one pass is laid out over the tiles, and what it costs."""

    method: str  # 'amp16', 'amp4', 'amp8-swapped', 'slic', 'hmac'
    partition: tuple[int, int, int, int, int, int]  # batch, height, width, groups, in, out
    serial: tuple[str, int]  # ('out', S) / ('in', S) / ('', 1)
    tiles: int
    compute_cycles: float  # conv vertex + zeroing
    exchange_cycles: float  # inputs and weights in, partials between tiles
    reduce_cycles: float
    temp_bytes: float  # per tile, the busiest
    ignored: bool  # no plan within the AMP bound: the bound was ignored
    start_cycles: float = 0.0  # its compute sets' start-up (TileArch.set_start_cycles)

    @property
    def estimate(self) -> float:
        """PopLibs' planner estimate of the pass: its vertices, exchange and reduction."""
        return self.compute_cycles + self.exchange_cycles + self.reduce_cycles

    @property
    def cycles(self) -> float:
        """What the search minimises: the estimate and its compute sets' start-up."""
        return self.estimate + self.start_cycles

    def describe(self) -> str:
        b, h, w, g, i, o = self.partition
        serial = f", {self.serial[1]} serial {self.serial[0]}-channel slices" \
            if self.serial[1] > 1 else ""
        return (f"{self.method}: batch/{b} height/{h} width/{w} groups/{g} in/{i} out/{o} "
                f"on {self.tiles} tiles{serial}")


def compute_sets(plan: Plan, arch: TileArch) -> tuple[int, int]:
    """(compute sets, those that exchange) of one planned pass, per serial slice summed:
    the partials' compute set after its exchange of inputs and weights, the reduction's
    stages, and a cast of the partials when nothing reduces them (the reduction casts as
    it writes)."""
    stages = int(reduce_stages(plan.partition[4]))
    cast = int(stages == 0 and arch.partial_bytes != arch.out_bytes)
    slices = plan.serial[1]
    exchanging = int(plan.exchange_cycles > 0) + stages
    return slices * (1 + stages + cast), slices * exchanging


def _best(grid: dict[str, np.ndarray], bound: float | None) -> int | None:
    total = grid["compute"] + grid["exchange"] + grid["reduce"] + grid["start"]
    if bound is not None:
        total = np.where(grid["temp"] <= bound, total, np.inf)
    if not len(total) or not np.isfinite(total.min()):
        return None
    # ties: fewer tiles, then the first in a fixed order (deterministic)
    best = np.flatnonzero(total == total.min())
    return int(best[np.argmin(grid["used"][best])])


def _plan_from(grid: dict[str, np.ndarray], i: int, method: str, serial: tuple[str, int],
               ignored: bool) -> Plan:
    s = serial[1]
    part = tuple(int(grid[k][i]) for k in ("pb", "ph", "pw", "pg", "pi", "po"))
    return Plan(method, part, serial, int(grid["used"][i]),  # type: ignore[arg-type]
                float(grid["compute"][i]) * s, float(grid["exchange"][i]) * s,
                float(grid["reduce"][i]) * s, float(grid["temp"][i]), ignored,
                float(grid["start"][i]) * s)


def _variants(p: ConvParams, arch: TileArch) -> list[tuple[str, ConvParams, int]]:
    """(method, params, input-channel grouping) the search tries: the AMP vertex with each
    grouping (a small one packs several kernel rows into a weight block: a 3-channel stem
    uses 4 channels x 4 rows), and for a matmul-shaped pass the operands swapped (PopLibs'
    swapOperands: rows and output channels change places)."""
    # smaller groupings only pay where the channels would not fill the widest one
    widest = arch.in_groups[0]
    groupings = arch.in_groups if p.in_chans < widest else (widest,)
    out = [(f"amp{g}", p, g) for g in groupings]
    if p.kernel == (1, 1) and p.field == (1, 1) and p.batch != p.out_chans:
        swapped = replace(p, batch=p.out_chans, out_chans=p.batch)
        out += [(f"amp{g}-swapped", swapped, g) for g in groupings]
    for name, expanded in _expansions(p, widest):
        grouped = arch.in_groups if expanded.in_chans < widest else (widest,)
        out += [(f"amp{g}-{name}", expanded, g) for g in grouped]
    return out


def _expansions(p: ConvParams, widest: int) -> list[tuple[str, ConvParams]]:
    """PopLibs' expandDims (poplin ConvPlan.cpp getExpandDimsCandidates, ConvUtil
    expandDim): a kernel dimension folded into the input channels, so a pass of few
    channels and a wide kernel (a stem, a 1-channel 5 x 200 filter) fills the conv units'
    chain; its input is gathered over that kernel dimension first (a copy of kernel x the
    input's elements along it, which the grid charges as a rearrangement). Tried for
    forward and input-gradient passes whose channels do not fill the widest grouping, each
    subset of the dimensions whose input is at least as long as the kernel."""
    if p.kind == WU or p.in_chans >= widest or p.expanded:
        return []
    dims = [d for d in (0, 1) if p.kernel[d] > 1
            and p.field[d] * p.stride[d] + p.kernel[d] - 1 >= p.kernel[d]]
    out = []
    for subset in ((0,), (1,), (0, 1)):
        if not set(subset) <= set(dims):
            continue
        kernel, stride, chans = list(p.kernel), list(p.stride), p.in_chans
        for d in subset:
            chans, kernel[d], stride[d] = chans * kernel[d], 1, 1
        # the gathered input: its expanded dimensions at the output's length, the others
        # as the input's (the output's strided length plus the kernel's halo)
        along = [p.field[d] if d in subset else p.field[d] * p.stride[d] + p.kernel[d] - 1
                 for d in (0, 1)]
        gathered = p.batch * p.groups * chans * along[0] * along[1]
        name = "expand" + "".join("hw"[d] for d in subset)
        out.append((name, replace(p, in_chans=chans, kernel=(kernel[0], kernel[1]),
                                  stride=(stride[0], stride[1]), expanded=gathered)))
    return out


SLIC_BLOCKS = {1: (4, 8, 16), 2: (2,), 4: (1,)}  # chans a group -> groups a block


def _vector_plan(p: ConvParams, arch: TileArch) -> Plan | None:
    """SLIC (IPU2, half inputs) for groups of 1, 2 or 4 channels in and out (depthwise,
    ResNeXt's 4-channel groups; PopLibs' ConvVertexType.cpp candidates), HMAC for 1- or
    2-channel groups elsewhere: a split of the groups and of the output positions over
    the tiles, the fastest of them (no input-channel split: the channels of a group stay
    on its tile)."""
    chans = p.in_chans if p.in_chans == p.out_chans else 0
    slic = arch.slic and chans in SLIC_BLOCKS and p.groups >= 2
    if not slic and (p.in_chans > 2 or p.groups < 4):
        return None
    tiles = arch.tiles
    pg = _cands(p.groups, tiles)
    pp = np.maximum(1, np.minimum(tiles // pg, p.positions))
    g_t, pos_t = ceil_div(p.groups, pg), ceil_div(p.positions, pp)
    rows = ceil_div(pos_t, max(1, p.field[1]))
    kh, kw = p.kernel
    if slic:
        # PopLibs tries each block size its channels allow and keeps the fastest estimate
        conv = np.min([slic_cycles(arch, ceil_div(g_t, b), b, kh * math.ceil(kw / 4), rows,
                                   pos_t, chans) for b in SLIC_BLOCKS[chans]], axis=0)
        method = "slic"
    else:
        conv = hmac_cycles(arch, g_t * pos_t * p.in_chans * p.out_chans * kh * kw, rows)
        method = "hmac"
    w_bytes = g_t * p.in_chans * p.out_chans * kh * kw * arch.elem_bytes
    partials = g_t * pos_t * p.out_chans
    exch = exchange_cycles(arch, w_bytes * (1 - 1 / pp))
    casts = arch.partial_bytes != arch.out_bytes
    cast = cast_cycles(partials, arch.vector_width) if casts else np.zeros(len(pg))
    start = float(arch.set_start_cycles * (1 + casts))  # the conv's and the cast's sets
    total = conv + exch + cast + start
    i = int(np.argmin(total))
    return Plan(method, (1, int(pp[i]), 1, int(pg[i]), 1, 1), ("", 1), int(pg[i] * pp[i]),
                float(conv[i]), float(exch[i]), float(cast[i]),
                float((w_bytes * (1 - 1 / pp))[i] + partials[i] * arch.partial_bytes),
                False, start)


@lru_cache(maxsize=65536)
def plan_conv(p: ConvParams, arch: TileArch, amp: float) -> Plan:
    """The plan PopLibs' search would pick for `p` with availableMemoryProportion `amp`:
    the fastest within the bound, serial slices included; when nothing fits, the plan
    with the least temporary memory (PopLibs' "optimising for minimum memory"), flagged
    `ignored`. That keeps AMP monotone: a lower AMP never plans faster nor fatter
    (PopLibs' own fallback relaxes the bound in steps from the AMP given, which can make
    a lower AMP plan faster)."""
    variants = _variants(p, arch)
    grids = [(m, v, g, _grid(v, arch, g)) for m, v, g in variants]
    options = [(m, g, grid, ("", 1)) for m, _v, g, grid in grids]
    options += _serial_grids(arch, grids, SERIAL_SPLITS)
    vec = _vector_plan(p, arch)
    bound = max(0.0, float(amp)) * arch.bytes_per_tile
    plan = _within(options, vec, bound)
    return plan if plan is not None else _leanest(options, vec)


def _order(plan: Plan) -> tuple[float, int, str]:
    return plan.cycles, plan.tiles, plan.method


def _within(options: list, vec: Plan | None, bound: float) -> Plan | None:
    """The fastest plan within `bound`; PopLibs searches serial splits with the parallel
    ones, so a lower bound never finds a faster plan than a higher one."""
    found = [vec] if vec is not None and vec.temp_bytes <= bound else []
    for method, _g, grid, serial in options:
        i = _best(grid, bound)
        if i is not None:
            found.append(_plan_from(grid, i, method, serial, False))
    return min(found, key=_order) if found else None


def _leanest(options: list, vec: Plan | None) -> Plan:
    """The plan with the least temporary memory per tile, serial slices included (ties:
    the fastest), flagged `ignored`."""
    found = [replace(vec, ignored=True)] if vec is not None else []
    for method, _g, grid, serial in options:
        if len(grid["temp"]):
            total = grid["compute"] + grid["exchange"] + grid["reduce"] + grid["start"]
            i = int(np.lexsort((total, grid["temp"]))[0])
            found.append(_plan_from(grid, i, method, serial, True))
    return min(found, key=lambda c: (c.temp_bytes, c.cycles, c.tiles, c.method))


def _serial_grids(arch: TileArch, grids: list, splits: tuple[int, ...]
                  ) -> list[tuple[str, int, dict[str, np.ndarray], tuple[str, int]]]:
    """(method, grouping, grid, serial) of each variant cut into `s` serial slices of its
    output or input channels, for each s of `splits` the channels allow."""
    out = []
    for kind in ("out", "in"):
        for s in splits:
            for method, v, g, _grid_unused in grids:
                chans = v.out_chans if kind == "out" else v.in_chans
                if chans < s:
                    continue
                sliced = replace(v, out_chans=math.ceil(chans / s)) if kind == "out" \
                    else replace(v, in_chans=math.ceil(chans / s))
                out.append((method, g, _grid(sliced, arch, g), (kind, s)))
    return out


def clear_caches() -> None:
    """Forget every cached plan, grid and table (a cold start: bench/bench_compile.py)."""
    from popviz.target import convgrid

    plan_conv.cache_clear()
    for f in (convgrid.grid, convgrid._partitions, convgrid._products, convgrid._field_tables,
              convgrid._chan_tables, convgrid._used_tables, convgrid._steps):
        f.cache_clear()
