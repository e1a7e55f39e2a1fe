"""A convolution / matmul planner in PopLibs' manner (poplin/ConvPlan.cpp, ConvModel.cpp).

For one pass of one convolution (`ConvParams`), search how to partition it over the
tiles of an IPU: splits of the batch, of the output field (height, width), of the conv
groups, of the input channels (each slice then holds partial sums that a reduction adds
across tiles) and of the output channels. Every candidate is costed per tile, the busiest
tile being the op's time (all tiles run the same vertex in one BSP compute phase):

    cycles = exchange of the tile's inputs and weights
           + zeroing its partials + the conv vertex (AMP, SLIC or HMAC: vertices.py)
           + (input channels split) exchange of the partials + their reduction

and its temporary memory per tile is what a plan adds while it runs: the exchanged input
and weight slices, the partials, and the incoming partials of the reduction. The plan kept
is the fastest whose temporary bytes per tile stay under availableMemoryProportion x tile
bytes, serial slices of the output or input channels (planned one after the other: less
memory, more cycles) searched with the parallel splits, as PopLibs does; when nothing fits,
the plan with the least temporary memory is taken and flagged (`ignored`). AMP's effect on
cycles therefore falls out of the search: a lower bound rules out the faster, more replicated plans.

The search tries the AMP vertex with each input-channel grouping (a small grouping packs
several kernel rows into one weight block, which is how a 3-channel stem keeps its conv
units busy), the operands swapped for matmul-shaped passes, and SLIC / HMAC for depthwise
convolutions. PopLibs' further transforms (expandDims, flattening, combining groups, kernel
splits) are left out; docs/cost-model.md says what that misses.
Plans are cached by their parameters (a tune search re-plans the same shapes often).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from popviz.target.convparams import WU, ConvParams
from popviz.target.vertices import (
    TileArch,
    amp_cycles,
    cast_cycles,
    ceil_div,
    copy_cycles,
    exchange_cycles,
    hmac_cycles,
    reduce_cycles,
    slic_cycles,
    zero_cycles,
)

SERIAL_SPLITS = (2, 4, 8, 16)
_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
          1472)
MIN_TILE_SHARE = 8  # partitions using under 1/8 of the tiles are not searched


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

    @property
    def cycles(self) -> float:
        return self.compute_cycles + self.exchange_cycles + self.reduce_cycles

    def describe(self) -> str:
        b, h, w, g, i, o = self.partition
        serial = f", {self.serial[1]} serial {self.serial[0]}-channel slices" \
            if self.serial[1] > 1 else ""
        return (f"{self.method}: batch/{b} height/{h} width/{w} groups/{g} in/{i} out/{o} "
                f"on {self.tiles} tiles{serial}")


@lru_cache(maxsize=4096)
def _steps(size: int, limit: int) -> tuple[int, ...]:
    """Split counts worth trying for a dimension of `size`: small counts, round numbers
    and the whole dimension (one element per tile)."""
    vals = {s for s in _STEPS if s <= size and s <= limit}
    if size <= limit:
        vals.add(size)
    return tuple(sorted(vals or {1}))


def _cands(size: int, limit: int) -> np.ndarray:
    return np.array(_steps(size, limit), dtype=np.int64)


@lru_cache(maxsize=4096)
def _partitions(axes: tuple[tuple[int, ...], ...], tiles: int) -> tuple[np.ndarray, ...]:
    """The partitions searched over `axes` (each a sorted tuple of split counts): indices
    into each axis and the tiles used, in the order a full meshgrid lists them (the first
    axis slowest), of those with floor <= used <= tiles. Products are pruned axis by axis
    (every count is >= 1, so a prefix over the bounds stays over), never building the whole
    grid; the floor is tiles / 8, or the largest product for a small op (its partitions
    under tiles / 8 are all it has). Shapes repeat across passes: cached per target."""
    tops = [a[-1] for a in axes]
    floor = min(tiles // MIN_TILE_SHARE, math.prod(tops))
    rest = [math.prod(tops[k:]) for k in range(1, len(axes) + 1)]  # largest of the axes after k
    used = np.ones(1, dtype=np.int64)
    index: list[np.ndarray] = []
    for k, axis in enumerate(axes):
        grown = used[:, None] * np.asarray(axis, dtype=np.int64)[None, :]
        rows, cols = np.nonzero((grown <= tiles) & (grown * rest[k] >= floor))
        index = [i[rows] for i in index] + [cols]
        used = grown[rows, cols]
    out = (*index, used)
    for a in out:
        a.flags.writeable = False  # shared by every cached grid
    return out


@lru_cache(maxsize=16384)
def _grid(p: ConvParams, arch: TileArch, in_group: int) -> dict[str, np.ndarray]:
    """Every candidate partition of `p` for the AMP vertex with `in_group` input channels
    per weight block, costed for its busiest tile. Per-tile sizes are computed once per
    split count of each axis and gathered (tests/convplan_reference.py is the plain
    meshgrid version it must match bit for bit)."""
    tiles = arch.tiles
    height = arch.weights_per_unit // in_group  # kernel rows one weight block holds
    icb = math.ceil(p.in_chans / in_group)
    ocb = math.ceil(p.out_chans / arch.units)
    # the width is split last (rows stay whole for the worklists): few counts suffice
    sizes = (p.batch, p.field[0], p.field[1], p.groups, icb, ocb)
    steps = (_steps(p.batch, tiles), _steps(p.field[0], tiles), _steps(p.field[1], 8),
             _steps(p.groups, tiles), _steps(icb, tiles), _steps(ocb, tiles))
    axes = [np.array(s, dtype=np.int64) for s in steps]
    # a partition on few tiles is never the fastest, and never the leanest per tile;
    # small ops (fewer partitions than tiles / 8) keep all of theirs
    *index, used = _partitions(steps, tiles)
    pb, ph, pw, pg, pi, po = (a[i] for a, i in zip(axes, index, strict=True))
    n_t, h_t, w_t, g_t, icb_t, ocb_t = (ceil_div(s, a)[i] for s, a, i in
                                        zip(sizes, axes, index, strict=True))
    kh, kw = p.kernel
    positions = n_t * h_t * w_t
    # worklist entries: one per output row; a 1 x 1 kernel at stride 1 reads its positions
    # contiguously (PopLibs flattens them), one entry per worker
    contiguous = kh == 1 and kw == 1 and p.stride == (1, 1)
    rows = np.minimum(n_t * h_t, 6) if contiguous else n_t * h_t
    kernel_blocks = math.ceil(kh / height) * kw
    conv = amp_cycles(arch, g_t, icb_t, ocb_t, kernel_blocks, rows, positions)
    partial_elems = positions * g_t * ocb_t * arch.units
    one_by_one = kh == 1 and kw == 1 and height == 1  # the 1x1 vertex zeroes as it goes
    zero = 0 if one_by_one else zero_cycles(arch, partial_elems, g_t * ocb_t)
    ci_t = np.minimum(icb_t * in_group, p.in_chans)
    co_t = np.minimum(ocb_t * arch.units, p.out_chans)
    hin = (h_t - 1) * p.stride[0] + kh
    win = (w_t - 1) * p.stride[1] + kw
    in_bytes = n_t * g_t * ci_t * hin * win * arch.elem_bytes
    w_bytes = g_t * ci_t * co_t * kh * kw * arch.elem_bytes
    partial_bytes = partial_elems * arch.partial_bytes
    # what is not already on the tile comes over the exchange: inputs are shared by the
    # output-channel split, weights by the batch and field splits; on IPU2 and later two
    # neighbouring tiles share an exchange bus, so inputs reach both of a pair at once when
    # the output-channel split pairs them (poplin's estimate)
    copies = in_bytes * (1 - 1 / po) + w_bytes * (1 - 1 / (pb * ph * pw))
    in_time = in_bytes * (1 - 1 / po)
    if arch.slic:
        in_time = np.where(po % 2 == 0, in_time / 2, in_time)
    exch = exchange_cycles(arch, in_time + w_bytes * (1 - 1 / (pb * ph * pw)))
    # a split of the input channels leaves `pi` partials of each output on different
    # tiles: they are exchanged and added, the outputs spread over all the tiles used
    outputs = p.positions * p.groups * p.out_chans
    r = ceil_div(outputs, used)
    split = pi > 1
    red = reduce_cycles(arch, r, pi) + exchange_cycles(arch, np.where(
        split, r * pi * arch.partial_bytes, 0))
    cast = np.where(arch.partial_bytes != arch.out_bytes,
                    cast_cycles(np.where(split, r, partial_elems), arch.vector_width), 0)
    # the weight update reads the activations transposed: a rearranging copy
    transform = 0.0
    if p.kind == WU:
        share = p.batch * p.in_chans * p.groups * arch.elem_bytes / used
        transform = copy_cycles(arch, share) + exchange_cycles(arch, share)
    # temporary memory: what the plan adds to a tile, the bytes AMP bounds. The input slice
    # already on a tile is no copy (the conv lays out its own input, as PopLibs' createInput
    # does); the copies that come over the exchange are, with the partials, or the incoming
    # partials of the reduction. (PopLibs' estimate counts every input and weight.)
    temp = np.maximum(copies + partial_bytes, np.where(split, r * pi * arch.partial_bytes, 0))
    grid = {"pb": pb, "ph": ph, "pw": pw, "pg": pg, "pi": pi, "po": po, "used": used,
            "compute": (conv + zero).astype(np.float64),
            "exchange": (exch + transform).astype(np.float64),
            "reduce": (red + cast).astype(np.float64), "temp": temp.astype(np.float64)}
    return _frontier(grid)


def _frontier(grid: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Only the partitions no other beats on both cycles and temporary memory: the
    fastest within any bound, and the leanest, are among them; a few dozen rows of the
    thousands searched, so a cached grid costs kilobytes.

    In (temp, index) order a row is kept when it is faster than every row before it. The
    fastest row (ties: the first in that order) is the last kept; the rest are the
    frontier of the rows before it. So the frontier is peeled from its fast end, one
    row per pass over the shrinking candidates: no sort of the whole grid."""
    total = grid["compute"] + grid["exchange"] + grid["reduce"]
    temp = grid["temp"]
    cand = np.arange(len(total))
    keep: list[int] = []
    while cand.size:
        t = total[cand]
        ties = cand[t == t.min()]
        k = int(ties[np.argmin(temp[ties])])  # argmin: the first of equal temps
        keep.append(k)
        c_temp = temp[cand]
        cand = cand[(c_temp < temp[k]) | ((c_temp == temp[k]) & (cand < k))]
    rows = np.array(keep[::-1], dtype=np.int64)
    return {k: v[rows] for k, v in grid.items()}


def _best(grid: dict[str, np.ndarray], bound: float | None) -> int | None:
    total = grid["compute"] + grid["exchange"] + grid["reduce"]
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
                float(grid["reduce"][i]) * s, float(grid["temp"][i]), ignored)


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
    return out


def _vector_plan(p: ConvParams, arch: TileArch) -> Plan | None:
    """SLIC (IPU2 on, half inputs) or HMAC for one-channel groups (depthwise): a split of
    the groups and of the output positions over the tiles, the fastest of them (no
    input-channel split: one channel per group has nothing to split)."""
    if p.in_chans > 2 or p.groups < 4:
        return None
    tiles = arch.tiles
    pg = _cands(p.groups, tiles)
    pp = np.maximum(1, np.minimum(tiles // pg, p.positions))
    g_t, pos_t = ceil_div(p.groups, pg), ceil_div(p.positions, pp)
    rows = ceil_div(pos_t, max(1, p.field[1]))
    kh, kw = p.kernel
    if arch.slic:
        block = np.where(g_t >= 16, 16, np.where(g_t >= 8, 8, 4))
        conv = slic_cycles(arch, ceil_div(g_t, block), block, kh * math.ceil(kw / 4),
                           rows, pos_t)
        method = "slic"
    else:
        conv = hmac_cycles(arch, g_t * pos_t * p.in_chans * p.out_chans * kh * kw, rows)
        method = "hmac"
    w_bytes = g_t * p.in_chans * p.out_chans * kh * kw * arch.elem_bytes
    partials = g_t * pos_t * p.out_chans
    exch = exchange_cycles(arch, w_bytes * (1 - 1 / pp))
    cast = cast_cycles(partials, arch.vector_width) if arch.partial_bytes != arch.out_bytes \
        else np.zeros(len(pg))
    total = conv + exch + cast
    i = int(np.argmin(total))
    return Plan(method, (1, int(pp[i]), 1, int(pg[i]), 1, 1), ("", 1), int(pg[i] * pp[i]),
                float(conv[i]), float(exch[i]), float(cast[i]),
                float((w_bytes * (1 - 1 / pp))[i] + partials[i] * arch.partial_bytes),
                False)


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
            total = grid["compute"] + grid["exchange"] + grid["reduce"]
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
