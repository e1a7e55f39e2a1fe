"""A job's ranks side by side: what share of the step each rank computes, communicates,
spends on the host and waits, and which ranks are the stragglers that the others wait
for. Pure functions over a measured profile's trace and stages (the metrics core's sweep,
`popviz.metrics.rank_time`: each instant of a rank counted once).

In a synchronous job every rank shares the step's window, so a slow rank does not show as
a longer step: it shows as less waiting than its peers, whose waiting is its extra work.
A straggler is a rank whose busy time (the step less its waiting and untraced time) is
more than `tolerance` above the median busy time of the other ranks of its stage (a job
without stages is one stage), and what made it so is the part that grew most over their
median.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.metrics import rank_time
from popviz.vocab import COMPUTE, WAITING

PARTS = ("compute", "exchange", "host_io", "waiting", "untraced")
BUSY = ("compute", "exchange", "host_io")
TOLERANCE = 0.05  # busy time this far above its stage's median makes a straggler


def rank_shares(trace: pd.DataFrame, stages: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank (index ipu): ns per step in each of PARTS, `busy`, `step` and each part's
    `share` of the step, and `stage` (the rank's first stage in `stages`; -1 unknown);
    ordered by stage, then rank."""
    times = rank_time(trace)
    out = pd.DataFrame(index=times.index)
    out["compute"] = times[[c for c in COMPUTE if c in times.columns]].sum(axis=1)
    out["exchange"] = times["exchange"]
    out["host_io"] = times["host_io"]
    out["waiting"] = times[list(WAITING)].sum(axis=1)
    out["untraced"] = times["untraced"].clip(lower=0.0)
    out["busy"] = out[list(BUSY)].sum(axis=1)
    out["step"] = times["step_time"]
    for part in PARTS:
        out[f"{part}_share"] = out[part] / out["step"].where(out["step"] > 0, np.nan)
    first = (stages.groupby("ipu")["stage"].min() if stages is not None and len(stages)
             and {"ipu", "stage"} <= set(stages.columns) else pd.Series(dtype=np.int64))
    out["stage"] = first.reindex(out.index).fillna(-1).astype(np.int64)
    out.index.name = "ipu"
    return out.sort_values(["stage"], kind="stable")


def stragglers(shares: pd.DataFrame, tolerance: float = TOLERANCE) -> pd.DataFrame:
    """The ranks whose busy time is more than `tolerance` above the median of the other
    ranks of their stage (a rank alone in its stage is not judged), slowest first:
    `busy`, `over` (the fraction above that median) and `cause`, the busy part that grew
    most over its peers' median."""
    columns = ["ipu", "stage", "busy", "over", "cause"]
    if len(shares) < 2:
        return pd.DataFrame(columns=columns)
    group = shares["stage"].to_numpy()
    busy = shares["busy"].to_numpy(np.float64)
    parts = shares[list(BUSY)].to_numpy(np.float64)
    # each rank against its peers, itself left out (with two ranks a stage, one 10% busier
    # than the other would sit only 5% over a median that holds itself); a rank alone in
    # its stage has no peers: a stage that does more by design is the stage load's
    # question (analysis.stage_balance), not a straggler
    peer_busy = np.full(len(shares), np.nan)
    peer_parts = np.full(parts.shape, np.nan)
    for members in pd.Series(np.arange(len(shares))).groupby(group).indices.values():
        if len(members) < 2:
            continue
        for i in members:
            others = members[members != i]
            peer_busy[i] = np.median(busy[others])
            peer_parts[i] = np.median(parts[others], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        over = pd.Series(busy / np.where(peer_busy > 0, peer_busy, np.nan) - 1.0,
                         index=shares.index)
    slow = over > tolerance
    if not slow.any():
        return pd.DataFrame(columns=columns)
    medians = pd.DataFrame(peer_parts, index=shares.index, columns=list(BUSY))
    grew = (shares[list(BUSY)] - medians)[slow]
    out = pd.DataFrame({"ipu": shares.index[slow].astype(np.int64),
                        "stage": shares.loc[slow, "stage"].to_numpy(),
                        "busy": shares.loc[slow, "busy"].to_numpy(),
                        "over": over[slow].to_numpy(),
                        "cause": grew.idxmax(axis=1).to_numpy()})
    return out.sort_values("over", ascending=False, kind="stable").reset_index(drop=True)


__all__ = ["PARTS", "TOLERANCE", "rank_shares", "stragglers"]
