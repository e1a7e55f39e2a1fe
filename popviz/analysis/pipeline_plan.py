"""Where each pipeline split should move: per-segment costs of the recorded ops, a balanced
partition over them (smallest slowest stage, DP) that keeps nearly-full IPUs from taking
layers, the moves from the current splits to it, and what bounds a stage (compute,
IPU-to-IPU exchange or host I/O).

The one split planner: the summary's advice calls it on a stored profile (`segments`), the
tune search (popviz.advise) on a freshly compiled ops table (`segments_over`), so both cost
a layout the same way. Pure functions over DataFrames."""

from __future__ import annotations

import functools
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
    """The forward layer sequence cut at every usable split name.

    `names[i]` starts segment i + 1 (segment 0 is everything before the first name);
    `layers[i]` are segment i's layers; the cost arrays have one entry per segment, in
    cycles per micro-batch. Recompute copies the compiler adds for pipeline recomputation
    depend on the layout, so they are not in `recompute` (only a recorded
    torch.utils.checkpoint re-run is): `stage_cost` adds them for the layout asked."""

    names: list[str]
    layers: list[list[str]]
    forward: np.ndarray
    backward: np.ndarray
    recompute: np.ndarray
    update: np.ndarray  # weight update, spread over the micro-batches of a step

    @property
    def count(self) -> int:
        return len(self.forward)

    @property
    def cost(self) -> np.ndarray:
        """Each segment's cycles per micro-batch over every pass it runs itself."""
        return self.forward + self.backward + self.recompute + self.update

    @functools.cached_property
    def _prefix(self) -> tuple[np.ndarray, np.ndarray]:
        """Running sums of the forward and of all passes, so a stage costs O(1)."""
        zero = np.zeros(1)
        return np.concatenate([zero, np.cumsum(self.forward)]), \
            np.concatenate([zero, np.cumsum(self.cost)])

    def stage_cost(self, a: int, b: int, recompute: bool, last: bool) -> float:
        """Cycles per micro-batch of a stage made of segments a..b-1. With pipeline
        recomputation every stage but the last recomputes its forward before its
        backward (as the compiler schedules it)."""
        forward, total = self._prefix
        own = float(total[b] - total[a])
        return own + (float(forward[b] - forward[a]) if recompute and not last else 0.0)

    def splits(self, bounds: list[int]) -> list[str]:
        """Split names for segment boundaries (segment indices where a stage starts)."""
        return [self.names[b - 1] for b in bounds]

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
    out_names: list[str] = []
    out_pos: list[int] = []
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


def layer_positions(layers: list[str], ops: pd.DataFrame) -> np.ndarray:
    """Layer index of every op: its layer, else its module's (or a parent's) forward
    layer, else the previous op's in the same pass (as the compiler places them)."""
    index = {name: i for i, name in enumerate(layers)}
    layer = ops["layer"].astype(str).tolist()
    module = (ops["module"] if "module" in ops.columns
              else pd.Series("", index=ops.index)).astype(str).tolist()
    passes = (ops["pass"] if "pass" in ops.columns
              else pd.Series("F", index=ops.index)).astype(str).to_numpy()
    pos = np.array([index.get(x, -1) for x in layer], dtype=np.float64)
    fwd = passes == "F"
    fwd_pos = pd.Series(np.where(pos[fwd] < 0, np.nan, pos[fwd])).ffill().bfill().fillna(0)
    pos[fwd] = fwd_pos.to_numpy()
    module_pos: dict[str, float] = {}
    for m, p in zip(np.asarray(module, dtype=object)[fwd], pos[fwd], strict=True):
        module_pos.setdefault(m, p)
    for i in np.flatnonzero(~fwd & (pos < 0)):
        m = module[i]
        while m not in module_pos and "." in m:
            m = m.rsplit(".", 1)[0]
        pos[i] = module_pos.get(m, -1)
    out = pd.Series(np.where(pos < 0, np.nan, pos))
    filled = out.groupby(passes).transform(lambda s: s.ffill().bfill())
    return filled.fillna(len(layers) - 1 if layers else 0).to_numpy(np.int64)


def segments_over(layers: list[str], split_names: list[str], ops: pd.DataFrame,
                  microbatches: int) -> Segments:
    """Per-segment cycles of `ops` (a compiled ops table: layer, module, pass, cycles and,
    when present, source_op: the compiler's own recompute copies are left out) over the
    layer sequence cut at `split_names`; the weight update is spread over `microbatches`."""
    names, positions = split_positions_in(layers, split_names)
    real = ops
    if "source_op" in ops.columns:
        real = ops[pd.to_numeric(ops["source_op"], errors="coerce").fillna(-1) < 0]
    real = real.reset_index(drop=True)
    seg = np.searchsorted(np.asarray(positions, dtype=np.int64),
                          layer_positions(layers, real), side="right")
    cycles = pd.to_numeric(real["cycles"], errors="coerce").fillna(0).to_numpy(np.float64)
    passes = (real["pass"] if "pass" in real.columns
              else pd.Series("F", index=real.index)).astype(str).to_numpy()
    n = len(names) + 1

    def per(p: str) -> np.ndarray:
        m = passes == p
        return np.bincount(seg[m], weights=cycles[m], minlength=n)[:n]

    edges = [0, *positions, len(layers)]
    return Segments(names, [layers[a:b] for a, b in itertools.pairwise(edges)], per("F"),
                    per("B"), per("R"), per("WU") / max(int(microbatches), 1))


def profile_recomputes(meta: dict[str, Any]) -> bool:
    """Whether a stored profile's pipeline recomputes each stage's forward (training with
    recomputation on: what `stage_cost` adds for every stage but the last)."""
    options = meta.get("options") or {}
    return bool(options.get("recomputation")) and bool(options.get("training", True))


def segments(ops: pd.DataFrame, meta: dict[str, Any]) -> Segments | None:
    """Per-segment costs of a modelled profile, or None when the profile does not say
    its layer order (a measured run, a synthetic one) or has no ops."""
    model = meta.get("model") or {}
    layers = [str(x) for x in model.get("layers") or []]
    if ops is None or ops.empty or not layers or not {"layer", "cycles"} <= set(ops.columns):
        return None
    accumulation = max(1, int((meta.get("options") or {}).get("gradient_accumulation") or 1))
    return segments_over(layers, [str(x) for x in model.get("split_names") or layers], ops,
                         accumulation)


def stage_costs(segs: Segments, bounds: list[int], recompute: bool = False) -> list[float]:
    """Cycles per micro-batch of each stage of the layout `bounds`."""
    edges = [0, *bounds, segs.count]
    last = len(edges) - 2
    return [segs.stage_cost(a, b, recompute, k == last)
            for k, (a, b) in enumerate(itertools.pairwise(edges))]


def balanced_bounds(segs: Segments, stages: int, current: list[int] | None = None,
                    frozen: set[int] | frozenset[int] = frozenset(), *,
                    recompute: bool = False) -> list[int] | None:
    """Stage boundaries (stages - 1 segment indices) minimising the slowest stage (DP over
    the segment sequence; ties go to the earliest boundary, so the result is stable). A
    stage in `frozen` (its IPU has no memory headroom) may not grow past its `current`
    range. None when no partition exists (one stage, more stages than segments, or the
    frozen stages leave none)."""
    n = segs.count
    if stages <= 1 or stages > n:
        return None
    edges = [0, *(current or []), n]
    inf = float("inf")
    # best[k][j]: smallest slowest stage of segments 0..j-1 cut into k stages
    best = np.full((stages + 1, n + 1), inf)
    arg = np.zeros((stages + 1, n + 1), dtype=np.int64)
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        last = k == stages
        for j in range(k, n + 1):
            if last and j != n:
                continue
            for i in range(k - 1, j):
                if best[k - 1][i] == inf:
                    continue
                if k - 1 in frozen and current is not None and \
                        (i < edges[k - 1] or j > edges[k]):
                    continue
                cost = max(best[k - 1][i], segs.stage_cost(i, j, recompute, last))
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
        if tile_use.get(int(row.ipu), 0.0) >= TILE_AMBER:  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
            out.add(int(row.stage))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
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
            out[int(ipu)] = out.get(int(ipu), 0.0) + float(total)  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
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
