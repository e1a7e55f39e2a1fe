"""Where each pipeline split should move: per-segment costs from the stored ops table, a
balanced partition over them (smallest slowest stage, DP) that keeps nearly-full IPUs from
taking layers, the moves from the current splits to it, and what bounds a stage (compute,
IPU-to-IPU exchange or host I/O).

Pure functions over a profile's DataFrames and meta. A plan from the tune search
(popviz.advise, which compiles) can be passed to `plan_moves` instead of the DP's."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from popviz.vocab import TILE_AMBER

COMPUTE_COLUMNS = ("forward_cycles", "backward_cycles", "recompute_cycles", "optimiser_cycles",
                   "other_cycles")


@dataclass(frozen=True)
class Segments:
    """The forward layer sequence cut at every usable split name: `names[i]` starts
    segment i + 1; `cost[i]` is segment i's cycles per micro-batch (all passes, the weight
    update spread over the micro-batches of a step)."""

    names: list[str]
    layers: list[list[str]]
    cost: np.ndarray

    @property
    def count(self) -> int:
        return len(self.cost)

    def bounds(self, first_layers: list[str]) -> list[int] | None:
        """Segment indices where stages 1.. start, from their split names (None when one
        is not a usable cut)."""
        index = {n: i + 1 for i, n in enumerate(self.names)}
        out = [index.get(str(s)) for s in first_layers]
        return None if any(b is None for b in out) else [int(b) for b in out if b is not None]


def split_positions_in(layers: list[str], names: list[str]) -> tuple[list[str], list[int]]:
    """Usable split names and the layer index each starts (exact layer, or the first
    layer under it), strictly increasing, never at layer 0."""
    index = {n: i for i, n in enumerate(layers)}
    out_names, out_pos = [], []
    for name in names:
        pos = index.get(name)
        if pos is None:
            under = [i for i, la in enumerate(layers) if la.startswith((name + "/", name + "."))]
            pos = under[0] if under else None
        if pos is None or pos == 0 or (out_pos and pos <= out_pos[-1]):
            continue
        out_names.append(name)
        out_pos.append(pos)
    return out_names, out_pos


def segments(ops: pd.DataFrame, meta: dict[str, Any]) -> Segments | None:
    """Per-segment costs of a modelled profile, or None when the profile does not say
    its layer order (a measured run, a synthetic one) or has no ops."""
    model = meta.get("model") or {}
    layers = [str(x) for x in model.get("layers") or []]
    if ops is None or ops.empty or not layers or not {"layer", "cycles"} <= set(ops.columns):
        return None
    names, pos = split_positions_in(layers, [str(x) for x in model.get("split_names") or layers])
    where = {la: i for i, la in enumerate(layers)}
    layer_pos = ops["layer"].astype(str).map(where)
    # ops of no listed layer (a loss, an optimiser helper) go with the previous op of
    # their stage, as the compiler places them
    keys = ops["stage"] if "stage" in ops.columns else pd.Series(0, index=ops.index)
    layer_pos = layer_pos.groupby(keys).transform(lambda s: s.ffill().bfill()).fillna(0)
    seg = np.searchsorted(np.asarray(pos), layer_pos.to_numpy(), side="right")
    cycles = pd.to_numeric(ops["cycles"], errors="coerce").fillna(0).to_numpy(float)
    if "pass" in ops.columns:
        accumulation = max(1, int((meta.get("options") or {}).get("gradient_accumulation")
                                  or 1))
        cycles = np.where(ops["pass"].astype(str) == "WU", cycles / accumulation, cycles)
    cost = np.bincount(seg, weights=cycles, minlength=len(names) + 1)
    bounds = [0, *pos, len(layers)]
    return Segments(names, [layers[a:b] for a, b in itertools.pairwise(bounds)], cost)


def stage_costs(segs: Segments, bounds: list[int]) -> list[float]:
    edges = [0, *bounds, segs.count]
    return [float(segs.cost[a:b].sum()) for a, b in itertools.pairwise(edges)]


def balanced_bounds(segs: Segments, stages: int, current: list[int] | None = None,
                    frozen: set[int] | frozenset[int] = frozenset()) -> list[int] | None:
    """Stage boundaries minimising the slowest stage. A stage in `frozen` (its IPU has no
    memory headroom) may not grow past its `current` range. None when no partition fits."""
    n = segs.count
    if stages <= 1 or stages > n:
        return None
    edges = [0, *(current or []), n]
    prefix = np.concatenate([[0.0], np.cumsum(segs.cost)])
    inf = float("inf")
    best = np.full((stages + 1, n + 1), inf)
    arg = np.zeros((stages + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n + 1):
            if k == stages and j != n:
                continue
            for i in range(k - 1, j):
                if best[k - 1][i] == inf:
                    continue
                if k - 1 in frozen and current is not None and \
                        (i < edges[k - 1] or j > edges[k]):
                    continue
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost < best[k][j] - 1e-9:
                    best[k][j], arg[k][j] = cost, i
    if best[stages][n] == inf:
        return None
    out, j = [], n
    for k in range(stages, 1, -1):
        j = int(arg[k][j])
        out.append(j)
    return sorted(out)


@dataclass(frozen=True)
class SplitMove:
    """Split `index` (the boundary before stage index + 1) moves from `old` to `new`."""

    index: int
    old: str
    new: str
    earlier: bool
    layers: list[str]  # the layers that change stage


def plan_moves(segs: Segments, current: list[int], proposed: list[int]) -> list[SplitMove]:
    """One move per split that changes, in pipeline order."""
    out = []
    for i, (c, p) in enumerate(zip(current, proposed)):
        if c == p:
            continue
        lo, hi = min(c, p), max(c, p)
        moved = [la for seg in segs.layers[lo:hi] for la in seg]
        out.append(SplitMove(i, segs.names[c - 1], segs.names[p - 1], p < c, moved))
    return out


def frozen_stages(stages: pd.DataFrame, tile_use: dict[int, float]) -> set[int]:
    """Stages whose IPU's fullest tile is at or past TILE_AMBER: they should not take
    layers (memory headroom first)."""
    out = set()
    for row in stages.itertuples():
        if tile_use.get(int(row.ipu), 0.0) >= TILE_AMBER:
            out.add(int(row.stage))
    return out


def host_io_by_ipu(exchange: pd.DataFrame | None) -> dict[int, float]:
    """Cycles of host transfers per IPU from the exchange table (src or dst 'host')."""
    if exchange is None or exchange.empty or not {"src", "dst", "start", "end"} <= set(
            exchange.columns):
        return {}
    src, dst = exchange["src"].astype(str), exchange["dst"].astype(str)
    dur = (pd.to_numeric(exchange["end"], errors="coerce")
           - pd.to_numeric(exchange["start"], errors="coerce")).fillna(0)
    out: dict[int, float] = {}
    for side, other in ((src, dst), (dst, src)):
        mask = (other == "host") & side.str.isdigit()
        for ipu, total in dur[mask].groupby(side[mask].astype(int)).sum().items():
            out[int(ipu)] = out.get(int(ipu), 0.0) + float(total)
    return out


def bound_by(row: Any, host_io: float) -> tuple[str, dict[str, float]]:
    """What bounds a stage's busy time: 'compute', 'exchange' (IPU to IPU) or 'host I/O',
    with each one's share. The stage table's exchange column includes host transfers."""
    compute = sum(float(getattr(row, c, 0) or 0) for c in COMPUTE_COLUMNS)
    exchange_all = float(getattr(row, "exchange_cycles", 0) or 0)
    host = min(host_io, exchange_all)
    parts = {"compute": compute, "exchange": exchange_all - host, "host I/O": host}
    total = sum(parts.values()) or 1.0
    shares = {k: v / total for k, v in parts.items()}
    return max(shares, key=lambda k: shares[k]), shares
