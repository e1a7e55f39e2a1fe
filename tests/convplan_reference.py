"""The planner's partition grid written plainly (a full meshgrid, then filtered): the
reference popviz/target/convgrid.py's pruned, tabled `grid` must match bit for bit
(tests/test_convplan_fast.py). Kept as the pre-optimisation code was, formulas unchanged."""

from __future__ import annotations

import math

import numpy as np

from popviz.target.convgrid import MIN_TILE_SHARE
from popviz.target.convgrid import cands as _cands
from popviz.target.convparams import WU, ConvParams
from popviz.target.vertices import (
    TileArch,
    amp_1x1_cycles,
    amp_cycles,
    cast_cycles,
    ceil_div,
    copy_cycles,
    exchange_cycles,
    reduce_cycles,
    uses_1x1_vertex,
    zero_cycles,
)


def reference_grid(p: ConvParams, arch: TileArch, in_group: int) -> dict[str, np.ndarray]:
    """Every candidate partition of `p` for the AMP vertex with `in_group` input channels
    per weight block, costed for its busiest tile."""
    tiles = arch.tiles
    height = arch.weights_per_unit // in_group  # kernel rows one weight block holds
    icb = math.ceil(p.in_chans / in_group)
    ocb = math.ceil(p.out_chans / arch.units)
    # the width is split last (rows stay whole for the worklists): few counts suffice
    axes = [_cands(p.batch, tiles), _cands(p.field[0], tiles), _cands(p.field[1], 8),
            _cands(p.groups, tiles), _cands(icb, tiles), _cands(ocb, tiles)]
    flat = [m.reshape(-1) for m in np.meshgrid(*axes, indexing="ij")]
    used = flat[0] * flat[1] * flat[2] * flat[3] * flat[4] * flat[5]
    # a partition on few tiles is never the fastest, and never the leanest per tile;
    # small ops (fewer partitions than tiles / 8) keep all of theirs
    floor = min(tiles // MIN_TILE_SHARE, int(used.max()))
    ok = (used <= tiles) & (used >= floor)
    pb, ph, pw, pg, pi, po = (f[ok] for f in flat)
    used = used[ok]
    n_t, h_t, w_t = ceil_div(p.batch, pb), ceil_div(p.field[0], ph), ceil_div(p.field[1], pw)
    g_t, icb_t, ocb_t = ceil_div(p.groups, pg), ceil_div(icb, pi), ceil_div(ocb, po)
    kh, kw = p.kernel
    positions = n_t * h_t * w_t
    # worklist entries: one per output row; a 1 x 1 kernel at stride 1 reads its positions
    # contiguously (PopLibs flattens them), one entry per worker
    contiguous = kh == 1 and kw == 1 and p.stride == (1, 1)
    rows = np.minimum(n_t * h_t, 6) if contiguous else n_t * h_t
    kernel_blocks = math.ceil(kh / height) * kw
    conv = amp_1x1_cycles(arch, g_t, icb_t, ocb_t, positions) \
        if uses_1x1_vertex(arch, p.kernel, p.stride, in_group) \
        else amp_cycles(arch, g_t, icb_t, ocb_t, kernel_blocks, rows, positions)
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
    # rearranging copies: the weight update's operands (read transposed), another pass's
    # input and weights when its channels are padded to the grouping, its weights and
    # output when its output channels are padded to the units
    rearranged = 0
    if p.kind == WU:
        rearranged = (p.batch + p.out_chans) * p.in_chans * p.groups * arch.elem_bytes
    elif p.expanded:  # expandDims: the gathered input and the weights
        rearranged = (p.expanded + p.in_chans * p.out_chans * p.kernel[0] * p.kernel[1]
                      * p.groups) * arch.elem_bytes
    else:
        kernel = p.kernel[0] * p.kernel[1]
        if p.in_chans % in_group:
            rearranged += (p.batch * p.field[0] * p.field[1] * p.stride[0] * p.stride[1]
                           + p.out_chans * kernel) * p.in_chans
        if p.out_chans % arch.units:
            rearranged += (p.in_chans * kernel + p.batch * p.field[0] * p.field[1]) \
                * p.out_chans
        rearranged = rearranged * p.groups * arch.elem_bytes
    transform = 0.0
    if rearranged:
        share = rearranged / used
        transform = copy_cycles(arch, share) + exchange_cycles(arch, share)
    # temporary memory: what the plan adds to a tile, the bytes AMP bounds. The input slice
    # already on a tile is no copy (the conv lays out its own input, as PopLibs' createInput
    # does); the copies that come over the exchange are, with the partials, or the incoming
    # partials of the reduction. (PopLibs' estimate counts every input and weight.)
    temp = np.maximum(copies + partial_bytes, np.where(split, r * pi * arch.partial_bytes, 0))
    # each compute set's start-up: the partials', then one per reduction stage (poplin
    # getNumReduceStages: 1 under 16 partials, 2 under 125, else 3) or the partials' cast
    stages = np.where(pi <= 1, 0, np.where(pi < 16, 1, np.where(pi < 125, 2, 3)))
    later = stages + ((stages == 0) & (arch.partial_bytes != arch.out_bytes))
    start = (arch.set_start_cycles * (1 + later)).astype(np.float64)
    grid = {"pb": pb, "ph": ph, "pw": pw, "pg": pg, "pi": pi, "po": po, "used": used,
            "compute": (conv + zero).astype(np.float64),
            "exchange": (exch + transform).astype(np.float64),
            "reduce": (red + cast).astype(np.float64), "start": start,
            "temp": temp.astype(np.float64)}
    return reference_frontier(grid)


def reference_frontier(grid: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The rows no other beats on both cycles and temporary memory, by a stable sort on
    temp and a running minimum of the cycles."""
    total = grid["compute"] + grid["exchange"] + grid["reduce"] + grid["start"]
    order = np.argsort(grid["temp"], kind="stable")  # leanest first
    ranked = total[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], ranked[:-1])))
    keep = order[ranked < best_before]
    return {k: v[keep] for k, v in grid.items()}
