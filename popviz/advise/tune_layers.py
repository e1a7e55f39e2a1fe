"""The advisor's view of a program's layer sequence: where split names cut it, how many
cycles each segment between two split names costs, and a balanced partition (DP).

Pure numpy / pandas over a compiled `ops` table; the search in `tune.py` uses it to seed
split points before compiling candidates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.analysis.pipeline_plan import split_positions_in
from popviz.recorder.program import Program


@dataclass(frozen=True)
class Segments:
    """The layer sequence cut at every usable split name.

    `names[i]` starts segment i + 1 (segment 0 is everything before the first name); the
    cost arrays have one entry per segment, in cycles per micro-batch."""

    names: list[str]
    forward: np.ndarray
    backward: np.ndarray
    recompute: np.ndarray  # recorded recompute (torch.utils.checkpoint) only
    update: np.ndarray  # weight update, spread over the micro-batches of a step

    @property
    def count(self) -> int:
        return len(self.forward)

    def stage_cost(self, a: int, b: int, recompute: bool, last: bool) -> float:
        """Cycles per micro-batch of a stage made of segments a..b-1. With recomputation
        every stage but the last recomputes its forward before its backward."""
        own = self.forward[a:b].sum() + self.backward[a:b].sum() + \
            self.recompute[a:b].sum() + self.update[a:b].sum()
        return float(own + (self.forward[a:b].sum() if recompute and not last else 0.0))

    def splits(self, bounds: list[int]) -> list[str]:
        """Split names for segment boundaries (segment indices where a stage starts)."""
        return [self.names[b - 1] for b in bounds]

    def bounds(self, splits: list[str]) -> list[int] | None:
        """Segment boundaries of split names, or None when a name is not a usable cut."""
        index = {n: i + 1 for i, n in enumerate(self.names)}
        out = [index.get(s) for s in splits]
        if any(b is None for b in out):
            return None
        return [int(b) for b in out if b is not None]


def split_positions(program: Program) -> tuple[list[str], list[int]]:
    """Usable split names and the layer index each starts, in forward order.

    A name is the first layer of the next stage (as the compiler reads it: the layer
    itself, or the first layer under a parent name). Names at the first layer (an empty
    first stage) and names repeating an earlier position are dropped."""
    layers = [str(layer) for layer in program.layers]
    return split_positions_in(layers, [str(n) for n in
                                       program.model.get("split_names") or layers])


def _op_positions(program: Program, ops: pd.DataFrame) -> np.ndarray:
    """Layer index of every op: its layer, else its module's (or a parent's) forward
    layer, else the previous op's in the same phase (as the compiler places them)."""
    layers = program.layers
    index = {name: i for i, name in enumerate(layers)}
    layer = ops["layer"].astype(str).tolist()
    module = ops["module"].astype(str).tolist()
    phase = ops["phase"].astype(str).to_numpy()
    pos = np.array([index.get(x, -1) for x in layer], dtype=np.float64)
    fwd = phase == "forward"
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
    filled = out.groupby(phase).transform(lambda s: s.ffill().bfill())
    return filled.fillna(len(layers) - 1 if layers else 0).to_numpy(np.int64)


def segments(program: Program, ops: pd.DataFrame, microbatches: int) -> Segments:
    """Per-segment cycles from a compiled `ops` table (its recorded ops only: synthesized
    recompute copies depend on the layout and are added back by `stage_cost`)."""
    names, positions = split_positions(program)
    real = ops[ops["source_op"] < 0].reset_index(drop=True)
    seg = np.searchsorted(np.asarray(positions, dtype=np.int64),
                          _op_positions(program, real), side="right")
    cycles = real["cycles"].to_numpy(np.float64)
    passes = real["pass"].astype(str).to_numpy()
    n = len(names) + 1

    def per(p: str) -> np.ndarray:
        m = passes == p
        return np.bincount(seg[m], weights=cycles[m], minlength=n)[:n]

    return Segments(names, per("F"), per("B"), per("R"), per("WU") / max(microbatches, 1))


def balanced_bounds(segs: Segments, stages: int, recompute: bool) -> list[int]:
    """Boundaries (stages - 1 segment indices) minimising the largest stage cost (DP over
    the segment sequence; ties go to the earliest boundary, so the result is stable)."""
    n = segs.count
    if stages <= 1:
        return []
    if stages > n:
        raise ValueError(f"{stages} stages need {stages - 1} split names; "
                         f"only {n - 1} are usable")
    inf = float("inf")
    # best[k][j]: smallest max cost of splitting segments 0..j-1 into k stages
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
                cost = max(best[k - 1][i], segs.stage_cost(i, j, recompute, last))
                if cost < best[k][j] - 1e-9:
                    best[k][j], arg[k][j] = cost, i
    bounds, j = [], n
    for k in range(stages, 1, -1):
        j = int(arg[k][j])
        bounds.append(j)
    return sorted(bounds)
