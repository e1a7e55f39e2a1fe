"""Stage and IPU balance: compute / exchange / idle, bubble fraction, the bottleneck."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from popviz.metrics import idle_fractions, rank_time, retime_stages
from popviz.vocab import COMPUTE, naming_for

if TYPE_CHECKING:  # the type only: importing popviz.format loads h5py
    from popviz.format.profile import Profile

# other_cycles: compute a measured run could not attribute to a pass (docs/measure.md)
COMPUTE_COLUMNS = ("forward_cycles", "backward_cycles", "recompute_cycles", "optimiser_cycles",
                   "other_cycles")
# what no event covers (metrics' "untraced", split out by timed_stages): neither busy nor
# idle, as /trace, /compare and the ranks heat map count it; part of the step all the same
UNTRACED = "untraced_cycles"


def _num(frame: pd.DataFrame, column: str) -> pd.Series:
    """A numeric column, or zeros when an optional column is absent."""
    if column in frame.columns:
        return pd.to_numeric(frame[column], errors="coerce").fillna(0).astype(float)
    return pd.Series(0.0, index=frame.index)


def _derive(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out["compute_cycles"] = sum(_num(frame, c) for c in COMPUTE_COLUMNS)
    out["busy_cycles"] = out["compute_cycles"] + _num(frame, "exchange_cycles")
    out["total_cycles"] = (out["busy_cycles"] + _num(frame, "idle_cycles")
                           + _num(frame, UNTRACED))
    total = out["total_cycles"].replace(0, np.nan)
    out["busy_fraction"] = (out["busy_cycles"] / total).fillna(0.0)
    out["bubble_fraction"] = (_num(frame, "idle_cycles") / total).fillna(0.0)
    mean = out["busy_cycles"].mean() if len(out) else 0.0
    out["relative_load"] = out["busy_cycles"] / mean if mean else 0.0
    return out


def timed_stages(stages: pd.DataFrame, trace: pd.DataFrame | None,
                 measured: bool) -> pd.DataFrame:
    """The stage table with a measured run's time columns re-derived from its trace by the
    metrics core (popviz.metrics.retime_stages): overlapping events count once, each
    rank's columns add up to the step time, idle_cycles is idle + sync over that
    rank-time, compute of no known pass is other_cycles and time no event covers (host
    Python) is untraced_cycles. A modelled stage table is returned as is (its columns
    already partition the step)."""
    if not measured or trace is None or trace.empty or stages.empty:
        return stages
    return retime_stages(stages, trace)


def profile_stages(profile: Profile) -> pd.DataFrame:
    """A profile's stage table as every view should read it (`timed_stages`)."""
    measured = naming_for(profile).measured
    return timed_stages(profile.stages, profile.trace if measured else None, measured)


def stage_balance(stages: pd.DataFrame) -> pd.DataFrame:
    """One row per stage with compute/busy/total cycles, bubble fraction and load vs mean."""
    return _derive(stages.sort_values("stage").reset_index(drop=True))


def is_sharded(meta: Any) -> bool:
    """A sharded run (meta, or anything with its "options"): one IPU runs at a time, so
    none waits for the heaviest stage and its idle is no pipeline's bubble."""
    return ((meta or {}).get("options") or {}).get("strategy") == "sharded"


def stages_take_turns(bal: pd.DataFrame) -> bool:
    """Fewer than two stages, or all on one device: they run in turn, none waits for
    another, so there is no balance between them to judge."""
    return len(bal) < 2 or bal["ipu"].nunique() < 2


def ipu_balance(stages: pd.DataFrame) -> pd.DataFrame:
    """The same per IPU (several stages may share one IPU, e.g. recomputation on one IPU)."""
    if stages.empty:
        return _derive(stages.assign(ipu=pd.Series(dtype="int64")))
    cols = [c for c in (*COMPUTE_COLUMNS, "exchange_cycles", "idle_cycles", UNTRACED,
                        "stash_bytes") if c in stages.columns]
    grouped = stages.groupby("ipu", sort=True)[cols].sum().reset_index()
    if "peak_bytes" in stages.columns:
        grouped["peak_bytes"] = stages.groupby("ipu", sort=True)["peak_bytes"].max().to_numpy()
    return _derive(grouped)


def imbalance(stages: pd.DataFrame) -> float:
    """Busiest stage's busy cycles over the mean (1.0 = perfectly balanced)."""
    bal = stage_balance(stages)
    mean = bal["busy_cycles"].mean() if len(bal) else 0.0
    return float(bal["busy_cycles"].max() / mean) if mean else 1.0


def returns_to_an_ipu(stages: pd.DataFrame) -> bool:
    """Whether a later stage comes back to an earlier stage's IPU (PopART BERT's heads as
    the last stage on IPU 0): that IPU runs both in turn, so balance is judged per IPU."""
    ipus = stages.sort_values("stage")["ipu"].astype(int).tolist()
    return any(b < a for a, b in itertools.pairwise(ipus))


def ipu_imbalance(stages: pd.DataFrame) -> tuple[int, float]:
    """(busiest IPU, its busy cycles over the mean per IPU), its stages' cycles summed."""
    per = ipu_balance(stages).set_index("ipu")["busy_cycles"]
    if per.empty or per.mean() <= 0:
        return 0, 1.0
    return int(per.index[int(per.to_numpy().argmax())]), float(per.max() / per.mean())


def bottleneck_stage(stages: pd.DataFrame) -> dict[str, Any] | None:
    """The stage with the most busy cycles: it sets the pipeline's pace."""
    bal = stage_balance(stages)
    if bal.empty or bal["busy_cycles"].max() <= 0:
        return None
    row = bal.loc[bal["busy_cycles"].idxmax()]  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
    # its own idle share: not the pipeline's bubble fraction (metrics.stage_idle_fraction)
    return {"stage": int(row["stage"]), "ipu": int(row["ipu"]),
            "busy_cycles": float(row["busy_cycles"]),
            "relative_load": float(row["relative_load"]),
            "idle_fraction": float(row["bubble_fraction"])}


def time_by_kind(trace: pd.DataFrame) -> pd.DataFrame:
    """Time per IPU per event kind from the trace, each instant counted once (the metrics
    core's sweep; compute summed over its passes), plus span (the step window) and
    bubble_fraction = idle + sync over it."""
    times = rank_time(trace)
    if times.empty:
        return pd.DataFrame(columns=["ipu", "span", "bubble_fraction"])
    table = pd.DataFrame({"compute": times[list(COMPUTE)].sum(axis=1)})
    for kind in ("exchange", "host_io", "sync", "idle"):
        table[kind] = times[kind]
    table = table.loc[:, (table != 0).any(axis=0) | (table.columns == "compute")]
    table["span"] = times["step_time"]
    table["bubble_fraction"] = idle_fractions(times)[0]
    return table.reset_index()
