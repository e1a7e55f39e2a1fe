"""The OOM table: tiles over capacity, each with the variables that fill it most.

Split from memory.py (its caller), which models the tile liveness these come from.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.target.mapping import grain_split

OOM_CANDIDATES = 200  # the largest variables per tile looked at per IPU


def oom_table(total: np.ndarray, runs: list[tuple[np.ndarray, np.ndarray]],
              tile_peak: np.ndarray, al: pd.DataFrame, nal: pd.DataFrame, width: np.ndarray,
              capacity: int, grain: int = 128) -> pd.DataFrame:
    """Tiles over capacity, each with its largest variables (always-live, plus the
    not-always-live ones alive at that tile's peak step). `runs`: per IPU, the tile
    liveness of each run of equal steps (runs x tiles) and the first step of each. Each
    variable's bytes on a tile are its grains there (mapping.grain_split), as the tile
    liveness counts them."""
    over = total - capacity
    parts = []
    for i, tiles in enumerate(over):
        bad = np.flatnonzero(tiles > 0)
        if not len(bad):
            continue
        # each tile's first step at its peak: the first run at it (rows of a run are equal)
        live, starts = runs[i]  # one entry per IPU (compiler/memory.py)
        peak_row = starts[(live == tile_peak[i]).argmax(axis=0)[bad]] \
            if live.shape[0] else np.zeros(len(bad), dtype=np.int64)
        cand = pd.concat([al[al["ipu"] == i].assign(s0=-1, s1=np.iinfo(np.int64).max // 2),
                          nal[nal["ipu"] == i]], ignore_index=True)
        mid, high, low, _ = grain_split(cand["t0"].to_numpy(), cand["t1"].to_numpy(),
                                        cand["bytes"].to_numpy(), grain)
        cand = cand.assign(mid=mid, high=high, low=low)
        cand = cand.nlargest(OOM_CANDIDATES, "high", keep="first")
        t0, t1 = cand["t0"].to_numpy()[:, None], cand["t1"].to_numpy()[:, None]
        mid = cand["mid"].to_numpy()[:, None]
        high, low = cand["high"].to_numpy()[:, None], cand["low"].to_numpy()[:, None]
        r0 = cand["s0"].to_numpy()[:, None] // width[i]
        r1 = cand["s1"].to_numpy()[:, None] // width[i]
        names = cand["name"].astype(str).tolist()
        texts: list[str] = []
        for lo in range(0, len(bad), 512):
            b, pr = bad[lo:lo + 512][None, :], peak_row[lo:lo + 512][None, :]
            live = (r0 < 0) | ((r0 <= pr) & (pr <= r1))
            score = np.where(live & (t0 <= b) & (b < mid), high,
                             np.where(live & (mid <= b) & (b < t1), low, 0.0))
            top = np.argsort(-score.T, axis=1, kind="stable")[:, :3].T  # rows: faster
            size = np.take_along_axis(score, top, axis=0)
            texts.extend("; ".join([f"{names[v]} ({s / 1024:.1f} KiB)"
                                    for v, s in zip(vs, ss, strict=True) if s > 0])
                         for vs, ss in zip(top.T.tolist(), size.T.tolist(), strict=True))
        parts.append(pd.DataFrame({"ipu": np.full(len(bad), i, dtype=np.int64),
                                   "tile": bad.astype(np.int64),
                                   "bytes_over": tiles[bad].astype(np.int64),
                                   "variables": np.array(texts, dtype=object)}))
    table = pd.concat(parts, ignore_index=True) if parts else \
        pd.DataFrame(columns=["ipu", "tile", "bytes_over", "variables"])
    return table.astype({"ipu": np.int64, "tile": np.int64, "bytes_over": np.int64,
                         "variables": str})
