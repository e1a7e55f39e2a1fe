"""The partition grid of one convolution pass (convplan.py's search space), costed fast.

For one pass and one AMP input-channel grouping, every partition of the batch, the output
field (height, width), the groups and the input- and output-channel blocks over the tiles,
costed for its busiest tile (the formulas: docs/cost-model.md section 2, convplan.py's
docstring), and only the partitions no other beats on both cycles and temporary memory
kept. A full compile of ResNet-50 costs about 600 such grids of thousands of partitions, so
the search is written for speed, and must match the plain version
(tests/convplan_reference.py: a meshgrid of every partition, then the formulas row by row)
bit for bit:

- the partitions within the tile bounds are read off the outer product of the (batch,
  height, width) and (groups, in, out) splits' tile counts (`_partitions`), never from a
  six-axis meshgrid;
- every term is a product of a factor of the (batch, height, width) split, one of the
  (groups, in, out) split and one of the tiles used: each factor is tabled over the few
  hundred combinations of its side (cached per shape and target: the serial slices of a
  pass, and passes of the same field, share them) and gathered for the partitions, in the
  same integer arithmetic and the same order of float operations;
- the frontier is peeled from its fast end without sorting the grid (`_frontier`).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from popviz.target.convparams import WU, ConvParams
from popviz.target.vertices import (
    WORKERS,
    TileArch,
    amp_1x1_block_cycles,
    amp_1x1_loop_cycles,
    amp_weight_load_cycles,
    amp_worker_cycles,
    cast_cycles,
    ceil_div,
    copy_cycles,
    exchange_cycles,
    uses_1x1_vertex,
    zero_cycles,
)

_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
          1472)
MIN_TILE_SHARE = 8  # partitions using under 1/8 of the tiles are not searched
WIDTH_LIMIT = 8  # the width is split last (rows stay whole for the worklists): few counts


# poplin ConvReducePlan.cpp getNumReduceStages: partials per output from which one, two or
# three compute sets reduce them (none for one partial; one under 16, two under 125)
REDUCE_STAGE_DEPTHS = (2, 16, 125)


def reduce_stages(depth: int | np.ndarray) -> np.ndarray:
    """Compute sets PopLibs reduces a conv's partials in, `depth` partials per output
    (elementwise for an array of depths)."""
    return np.searchsorted(REDUCE_STAGE_DEPTHS, depth, side="right")


@lru_cache(maxsize=4096)
def _steps(size: int, limit: int) -> tuple[int, ...]:
    """Split counts worth trying for a dimension of `size`: small counts, round numbers
    and the whole dimension (one element per tile)."""
    vals = {s for s in _STEPS if s <= size and s <= limit}
    if size <= limit:
        vals.add(size)
    return tuple(sorted(vals or {1}))


def cands(size: int, limit: int) -> np.ndarray:
    return np.array(_steps(size, limit), dtype=np.int64)


def _frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for a in arrays:
        a.flags.writeable = False  # shared by every cached grid
    return arrays


@lru_cache(maxsize=4096)
def _products(axes: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Tiles used by each combination of three axes' split counts, in meshgrid order."""
    a, b, c = (np.array(x, dtype=np.int64) for x in axes)
    return _frozen((a[:, None, None] * b[None, :, None] * c[None, None, :]).reshape(-1))[0]


@lru_cache(maxsize=4096)
def _partitions(axes: tuple[tuple[int, ...], ...], tiles: int) -> tuple[np.ndarray, ...]:
    """The partitions searched over `axes` (each a sorted tuple of split counts), of those
    with floor <= used <= tiles, in the order a full meshgrid lists them (the first axis
    slowest): the tiles used, and the flat indices of each row's (batch, height, width)
    and (groups, in, out) counts. The grid is the outer product of those two sides (a few
    hundred combinations each), so it is never built six axes wide; the floor is tiles / 8,
    or the largest product for a small op (its partitions under tiles / 8 are all it has):
    a partition on few tiles is never the fastest, and never the leanest per tile."""
    field, chans = _products(axes[:3]), _products(axes[3:])
    floor = min(tiles // MIN_TILE_SHARE, math.prod(a[-1] for a in axes))
    used = field[:, None] * chans[None, :]
    fi, ci = np.nonzero((used <= tiles) & (used >= floor))  # row-major: meshgrid order
    return _frozen(used[fi, ci], fi, ci)


def _outer(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[np.ndarray]:
    """Three per-axis columns over their (a, b, c) product, flattened in meshgrid order."""
    return [np.repeat(a, len(b) * len(c)), np.tile(np.repeat(b, len(c)), len(a)),
            np.tile(c, len(a) * len(b))]


@lru_cache(maxsize=4096)
def _field_tables(batch: int, field: tuple[int, int], kernel: tuple[int, int],
                  stride: tuple[int, int], arch: TileArch, height: int
                  ) -> tuple[np.ndarray, ...]:
    """Per (batch, height, width) split: the AMP cycles per weight block, the zeroing cycles
    per output block, output positions, input positions (with the halo) and the share of
    the weights that comes over the exchange."""
    axes = [cands(batch, arch.tiles), cands(field[0], arch.tiles),
            cands(field[1], WIDTH_LIMIT)]
    n_t, h_t, w_t = _outer(*(ceil_div(s, a) for s, a in zip((batch, *field), axes,
                                                             strict=True)))
    pb, ph, pw = _outer(*axes)
    kh, kw = kernel
    positions = n_t * h_t * w_t
    # worklist entries: one per output row; a 1 x 1 kernel at stride 1 reads its positions
    # contiguously (PopLibs flattens them), one entry per worker
    contiguous = kh == 1 and kw == 1 and stride == (1, 1)
    rows = np.minimum(n_t * h_t, 6) if contiguous else n_t * h_t
    if uses_1x1_vertex(arch, kernel, stride, arch.weights_per_unit // height):
        per_block = amp_1x1_block_cycles(arch, positions)  # PopLibs' 1x1 vertex
    else:
        per_block = amp_weight_load_cycles(arch) + 30 + WORKERS * amp_worker_cycles(
            arch, rows, positions)
    # zeroing, per output block (partials / blocks = positions x units); the 1x1 vertex
    # zeroes as it goes
    one_by_one = kh == 1 and kw == 1 and height == 1
    zero = np.zeros_like(positions) if one_by_one else zero_cycles(
        arch, positions * arch.units, 1)
    in_field = n_t * ((h_t - 1) * stride[0] + kh) * ((w_t - 1) * stride[1] + kw)
    w_share = 1 - 1 / (pb * ph * pw)
    return _frozen(per_block, zero, positions, in_field, w_share)


@lru_cache(maxsize=4096)
def _chan_tables(groups: int, in_chans: int, out_chans: int, kernel: tuple[int, int],
                 stride: tuple[int, int], arch: TileArch, in_group: int
                 ) -> tuple[np.ndarray, ...]:
    """Per (groups, in, out) split: the AMP vertex's loop cycles and weight blocks, output
    blocks, input and weight bytes, the share of the inputs that comes over the exchange and
    its rate, the reduction's incoming bytes per output and its depth term, and the
    compute sets after the partials' (the reduction's stages, else a cast of the partials
    when they are not the output's type)."""
    height = arch.weights_per_unit // in_group
    icb, ocb = math.ceil(in_chans / in_group), math.ceil(out_chans / arch.units)
    axes = [cands(groups, arch.tiles), cands(icb, arch.tiles), cands(ocb, arch.tiles)]
    g_t, icb_t, ocb_t = _outer(*(ceil_div(s, a) for s, a in zip((groups, icb, ocb), axes,
                                                                 strict=True)))
    _, pi, po = _outer(*axes)
    kh, kw = kernel
    eb = arch.elem_bytes
    if uses_1x1_vertex(arch, kernel, stride, in_group):
        loops = amp_1x1_loop_cycles(g_t, icb_t, ocb_t)
    else:
        loops = 109 + g_t * (16 + icb_t * (14 + 14 * ocb_t))
    blocks = g_t * icb_t * ocb_t * (math.ceil(kh / height) * kw)
    out_blocks = g_t * ocb_t
    ci_t = np.minimum(icb_t * in_group, in_chans)
    co_t = np.minimum(ocb_t * arch.units, out_chans)
    in_bytes = g_t * ci_t * eb  # x input positions
    w_bytes = g_t * ci_t * co_t * kh * kw * eb
    in_share = 1 - 1 / po
    # on IPU2 and later two neighbouring tiles share an exchange bus: inputs reach both of a
    # pair at once when the output-channel split pairs them (poplin's estimate)
    in_rate = np.where(po % 2 == 0, 0.5, 1.0) if arch.slic else np.ones(len(po))
    split = pi > 1
    incoming = np.where(split, pi * arch.partial_bytes, 0)  # x outputs per tile
    depth = np.where(split, 2 * (pi - 1) + 8, 0)
    stages = reduce_stages(pi)
    later_sets = stages + ((stages == 0) & (arch.partial_bytes != arch.out_bytes))
    return _frozen(loops, blocks, out_blocks, in_bytes, w_bytes, in_share, in_rate, split,
                   incoming, depth, later_sets)


def rearranged_bytes(p: ConvParams, arch: TileArch, in_group: int) -> int:
    """Bytes a pass rearranges before it runs (poplin addTransformCycleEstimate): a weight
    update both its operands (rearrangeInput and rearrangeWeights are set for every WU
    pass: the activations expanded over the kernel, batch = Ci x Kh x Kw rows, and the
    output gradient); any other pass its input and weights when its input channels do not
    fill the grouping (padInChannels), its weights and output when its output channels do
    not fill the conv units (padPartialChannels); an expanded pass (expandDims) the input
    it gathers and its weights (the expanded channels are padded in that copy)."""
    if p.kind == WU:
        return (p.batch + p.out_chans) * p.in_chans * p.groups * arch.elem_bytes
    weights = p.in_chans * p.out_chans * p.kernel[0] * p.kernel[1]
    inputs = p.positions * p.stride[0] * p.stride[1] * p.in_chans
    if p.expanded:  # expandDims rearranges the gathered input and the weights
        return (p.expanded + weights * p.groups) * arch.elem_bytes
    elements = 0
    if p.in_chans % in_group:
        elements += inputs + weights
    if p.out_chans % arch.units:
        elements += weights + p.positions * p.out_chans
    return elements * p.groups * arch.elem_bytes


@lru_cache(maxsize=4096)
def _used_tables(outputs: int, rearranged: int, arch: TileArch) -> tuple[np.ndarray, ...]:
    """Per number of tiles used (1 .. tiles): outputs per tile, the reduction's loops per
    worker, and the pass's rearranging copies (`rearranged_bytes` spread over the tiles:
    copy and exchange; 0 where it rearranges nothing)."""
    used = np.arange(1, arch.tiles + 1)
    per_used = ceil_div(outputs, used)
    acc = 4 if arch.partial_bytes == 4 else 8
    loops = ceil_div(ceil_div(per_used, acc), WORKERS)
    transform = np.zeros(len(used))
    if rearranged:
        share = rearranged / used
        transform = copy_cycles(arch, share) + exchange_cycles(arch, share)
    return _frozen(per_used, loops, transform)


@lru_cache(maxsize=16384)
def grid(p: ConvParams, arch: TileArch, in_group: int) -> dict[str, np.ndarray]:
    """Every candidate partition of `p` for the AMP vertex with `in_group` input channels
    per weight block, costed for its busiest tile; the frontier of them (`_frontier`)."""
    tiles = arch.tiles
    icb = math.ceil(p.in_chans / in_group)
    ocb = math.ceil(p.out_chans / arch.units)
    steps = (_steps(p.batch, tiles), _steps(p.field[0], tiles),
             _steps(p.field[1], WIDTH_LIMIT), _steps(p.groups, tiles), _steps(icb, tiles),
             _steps(ocb, tiles))
    used, fi, ci = _partitions(steps, tiles)
    per_block, zero_per_block, positions, in_field, w_share = _field_tables(
        p.batch, p.field, p.kernel, p.stride, arch, arch.weights_per_unit // in_group)
    loops, blocks, out_blocks, in_bytes_c, w_bytes, in_share, in_rate, split, incoming, \
        depth, later_sets = _chan_tables(p.groups, p.in_chans, p.out_chans, p.kernel,
                                         p.stride, arch, in_group)
    per_used, loops_used, transform = _used_tables(
        p.positions * p.groups * p.out_chans, rearranged_bytes(p, arch, in_group), arch)
    # the partitions: gathers and the few operations that mix the three sides
    u = used - 1
    split_r, depth_r, out_blocks_r = split[ci], depth[ci], out_blocks[ci]
    conv = loops[ci] + blocks[ci] * per_block[fi]
    zero = zero_per_block[fi] * out_blocks_r
    partial_elems = positions[fi] * out_blocks_r * arch.units
    in_bytes = in_field[fi] * in_bytes_c[ci]
    # what is not already on the tile comes over the exchange: inputs are shared by the
    # output-channel split, weights by the batch and field splits
    in_copy = in_bytes * in_share[ci]
    w_copy = w_bytes[ci] * w_share[fi]
    exch = exchange_cycles(arch, in_copy * in_rate[ci] + w_copy)
    # a split of the input channels leaves `pi` partials of each output on different
    # tiles: they are exchanged and added, the outputs spread over all the tiles used
    r = per_used[u]
    partials_in = r * incoming[ci]
    red = np.where(split_r, WORKERS * (20 + depth_r * loops_used[u]) + 33, 0) \
        + exchange_cycles(arch, partials_in)
    if arch.partial_bytes != arch.out_bytes:
        red = red + cast_cycles(np.where(split_r, r, partial_elems), arch.vector_width)
    # temporary memory: what the plan adds to a tile, the bytes AMP bounds. The input slice
    # already on a tile is no copy (the conv lays out its own input, as PopLibs' createInput
    # does); the copies that come over the exchange are, with the partials, or the incoming
    # partials of the reduction. (PopLibs' estimate counts every input and weight.)
    temp = np.maximum(in_copy + w_copy + partial_elems * arch.partial_bytes, partials_in)
    # each compute set's start-up on every tile (CostModel plan_compute_set_cycles): the
    # partials', then the reduction's stages or the partials' cast
    start = (arch.set_start_cycles * (1 + later_sets[ci])).astype(np.float64)
    costs = {"compute": (conv + zero).astype(np.float64),
             "exchange": exch + transform[u],
             "reduce": red.astype(np.float64), "start": start,
             "temp": temp.astype(np.float64)}
    rows = _frontier(costs)
    front = {k: v[rows] for k, v in costs.items()}
    index = (*np.unravel_index(fi[rows], [len(a) for a in steps[:3]]),
             *np.unravel_index(ci[rows], [len(a) for a in steps[3:]]))
    for name, s, i in zip(("pb", "ph", "pw", "pg", "pi", "po"), steps, index, strict=True):
        front[name] = np.array(s, dtype=np.int64)[i]
    front["used"] = used[rows]
    return front


def _frontier(costs: dict[str, np.ndarray]) -> np.ndarray:
    """The rows no other beats on both cycles and temporary memory, leanest first: the
    fastest within any bound, and the leanest, are among them (a few dozen of thousands).

    In (temp, index) order a row is kept when it is faster than every row before it. The
    fastest row (ties: the first in that order) is the last kept; the rest are the
    frontier of the rows before it. So the frontier is peeled from its fast end, one
    row per pass over the shrinking candidates: no sort of the whole grid."""
    total = costs["compute"] + costs["exchange"] + costs["reduce"] + costs["start"]
    temp = costs["temp"]
    cand = np.arange(len(total))
    keep: list[int] = []
    while cand.size:
        t = total[cand]
        ties = cand[t == t.min()]
        k = int(ties[np.argmin(temp[ties])])  # argmin: the first of equal temps
        keep.append(k)
        c_temp = temp[cand]
        cand = cand[(c_temp < temp[k]) | ((c_temp == temp[k]) & (cand < k))]
    return np.array(keep[::-1], dtype=np.int64)
