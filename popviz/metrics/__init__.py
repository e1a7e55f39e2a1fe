"""The metrics core: every figure two layers would otherwise each compute, in one place.

A leaf (numpy, pandas and popviz.vocab only) that compile, measure, analysis, the CLI and
the app all call: time attribution and idle (the timeline sweep below), peak liveness per
device, fit (tiles against their capacity; an imported GPU's peak against its device
memory) and out-of-memory tiles.

Where each instant of a device's (IPU's or rank's) timeline goes, counted once.

Trace events on one device may overlap (a measured async send runs under compute), so
summing durations counts those instants twice. `rank_time` sweeps the timeline instead:
every instant of a step window goes to exactly one category, the first of `CATEGORIES`
active then (compute, by pass, beats exchange beats host_io beats sync beats idle);
instants no event covers are "untraced". The parts of a device therefore add up to the
step time. A modelled trace never overlaps and fills its span, so there the sweep gives
the plain sums of durations, unchanged.

Idle, the one definition every view uses: time attributed to idle or sync events over
rank-time (the step time, per device; overall, the sum over devices of idle + sync over
devices x step time).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.metrics.timeline import TimelineTally, sweep
from popviz.vocab import CATEGORIES, COMPUTE, WAITING

__all__ = ["CATEGORIES", "COMPUTE", "STAGE_TIME_COLUMNS", "device_capacities", "device_fit",
           "device_fits", "fit_verdict", "fits", "fits_or_stored", "idle_fraction",
           "idle_fractions", "oom_tiles", "peak_liveness", "peak_rows", "rank_time",
           "retime_stages", "stage_columns", "stage_idle_fraction", "stage_table_times",
           "stage_time", "stash", "stash_per_ipu", "step_time", "sweep"]

# stage-table time columns and the timeline categories each one sums (compute a measured
# run could not attribute to a pass, and time no event covers, are other_cycles)
STAGE_TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "forward_cycles": ("forward",), "backward_cycles": ("backward",),
    "recompute_cycles": ("recompute",), "optimiser_cycles": ("weight_update",),
    "other_cycles": ("compute", "untraced"), "exchange_cycles": ("exchange", "host_io"),
    "idle_cycles": WAITING, "sync_cycles": ("sync",)}


def rank_time(trace: pd.DataFrame) -> pd.DataFrame:
    """Per device (index ipu): mean time per step in each of CATEGORIES + "untraced",
    summing to the step time (column step_time) in the trace's unit. A step's window runs
    from its first start to its last end over all devices (a trace without a step column
    is one step), so every device shares the same rank-time."""
    return TimelineTally.of(trace).rank_time()


def idle_fractions(times: pd.DataFrame) -> tuple[pd.Series, float]:
    """Idle (idle + sync) over rank-time: per device, and overall."""
    if times.empty:
        return pd.Series(dtype=float), 0.0
    idle = times[list(WAITING)].sum(axis=1)
    rank = times["step_time"].replace(0, np.nan)
    overall = float(idle.sum() / rank.sum()) if rank.sum() else 0.0
    return (idle / rank).fillna(0.0), overall


def idle_fraction(trace: pd.DataFrame, num_devices: int | None = None) -> float:
    """Overall idle over rank-time (`idle_fractions`) straight from a trace. With
    `num_devices`, devices without a single event count as all idle-free rank-time too
    (a compiled step spans every IPU of the target)."""
    times = rank_time(trace)
    if times.empty:
        return 0.0
    if num_devices is None or num_devices == len(times):
        return idle_fractions(times)[1]
    rank = float(times["step_time"].iloc[0]) * num_devices
    return float(times[list(WAITING)].to_numpy().sum() / rank) if rank else 0.0


def step_time(trace: pd.DataFrame) -> float:
    """Mean step window over all devices: first start to last end of each step."""
    times = rank_time(trace)
    return float(times["step_time"].iloc[0]) if len(times) else 0.0


def stage_time(trace: pd.DataFrame, n_stages: int) -> pd.DataFrame:
    """Per stage (index 0..n_stages-1): total time over the trace in each of CATEGORIES,
    each instant of a device counted once (the sweep per (device, stage)); events with
    stage < 0 are left out. A modelled trace never overlaps, so these are plain sums."""
    return TimelineTally.of(trace).stage_time(n_stages)


def stage_columns(times: pd.DataFrame) -> pd.DataFrame:
    """Category times (stage_time or rank_time rows) as the stage table's time columns."""
    return pd.DataFrame({col: times[[c for c in cats if c in times.columns]].sum(axis=1)
                         for col, cats in STAGE_TIME_COLUMNS.items()}, index=times.index)


def stage_table_times(trace: pd.DataFrame | TimelineTally, stages: pd.DataFrame,
                      steps: int = 1) -> pd.DataFrame:
    """The stage table's time columns (STAGE_TIME_COLUMNS) for each (stage, ipu) row of
    `stages` (same index), mean per step. Each column is the stage's `stage_time`;
    other_cycles is the rest of its device's step (rank_time's window, shared by every
    device) that no other column covers: compute without a known pass, host time between
    traced events, events of no stage. A device holding several stages shares it equally,
    so a device's columns (sync_cycles is part of idle_cycles) add up to the step time."""
    tally = trace if isinstance(trace, TimelineTally) else TimelineTally.of(trace)
    steps = max(1, int(steps))
    cols = list(STAGE_TIME_COLUMNS)
    if stages.empty:
        return pd.DataFrame(columns=cols, index=stages.index, dtype=float)
    stage = stages["stage"].astype(int).to_numpy()
    n = int(stage.max()) + 1 if len(stage) else 0
    out = stage_columns(tally.stage_time(n)).reindex(stage).fillna(0.0) / steps
    out.index = stages.index
    ipu = stages["ipu"].astype(int)
    busy = out[[c for c in cols if c not in ("other_cycles", "sync_cycles")]].sum(axis=1)
    per_device = busy.groupby(ipu).transform("sum")
    count = ipu.groupby(ipu).transform("size").astype(float)
    times = tally.rank_time()
    step = float(times["step_time"].iloc[0]) if len(times) else 0.0
    out["other_cycles"] = np.maximum(0.0, step - per_device) / count
    return out[cols]


def retime_stages(stages: pd.DataFrame, trace: pd.DataFrame) -> pd.DataFrame:
    """The stage table with its time columns (STAGE_TIME_COLUMNS; sync_cycles only where
    present) taken from each device's `rank_time`: per step, each instant once, adding up
    to the step time. On a device holding several stages (an interleaved schedule) each
    stage's busy columns are its own events' (`stage_time`); the device's idle and sync
    are shared equally, and other_cycles is each stage's share of the rest of the step.
    Time no event covers (rank_time's "untraced": host Python between ops) is split out of
    other_cycles into untraced_cycles, so it is not read as compute: /trace and /compare
    call it untraced. The columns with untraced_cycles add up to the step time."""
    if trace.empty or stages.empty:
        return stages
    times = rank_time(trace)
    per_rank = stage_columns(times)
    out = stages.copy()
    ipu = out["ipu"].astype(int)
    share = ipu.groupby(ipu).transform("size").astype(float).to_numpy()
    cols = [c for c in STAGE_TIME_COLUMNS if c != "sync_cycles" or c in out.columns]
    for col in cols:
        out[col] = per_rank[col].reindex(ipu).fillna(0.0).to_numpy() / share
    shared = share > 1
    if shared.any():
        own = stage_table_times(trace, out.loc[shared, ["stage", "ipu"]],
                                int(times["steps"].iloc[0]))
        busy = [c for c in cols if c not in ("idle_cycles", "sync_cycles", "other_cycles")]
        out.loc[shared, busy] = own[busy].to_numpy()
        step = float(times["step_time"].iloc[0])
        sub = out.loc[shared]
        used = sub[busy].sum(axis=1).groupby(sub["ipu"].astype(int)).transform("sum")
        rest = np.maximum(0.0, step - used - per_rank["idle_cycles"].reindex(
            sub["ipu"].astype(int)).fillna(0.0).to_numpy())
        out.loc[shared, "other_cycles"] = rest / share[shared]
    untraced = times["untraced"].clip(lower=0.0).reindex(ipu).fillna(0.0).to_numpy() / share
    out["untraced_cycles"] = untraced
    out["other_cycles"] = np.maximum(0.0, out["other_cycles"].to_numpy(np.float64) - untraced)
    return out


def stage_idle_fraction(stages: pd.DataFrame) -> float:
    """Idle over rank-time from a stage table whose time columns partition each device's
    step (compile's, measure's, or timed_stages'): sum of idle_cycles over the sum of all
    time columns (untraced_cycles too, where retime_stages split it out)."""
    if stages.empty:
        return 0.0
    cols = [c for c in (*STAGE_TIME_COLUMNS, "untraced_cycles")
            if c != "sync_cycles" and c in stages.columns]
    total = float(stages[cols].apply(pd.to_numeric, errors="coerce").fillna(0).to_numpy().sum())
    idle = float(pd.to_numeric(stages["idle_cycles"], errors="coerce").fillna(0).sum())
    return idle / total if total else 0.0


# --- memory ----------------------------------------------------------------------------

def peak_rows(liveness: pd.DataFrame) -> pd.Series:
    """Per device (index ipu): the liveness row label of its peak total (always-live +
    not-always-live), the first such step."""
    if liveness.empty:
        return pd.Series(dtype="int64", index=pd.Index([], name="ipu"))
    total = liveness["always_live_bytes"] + liveness["not_always_live_bytes"]
    out = total.groupby(liveness["ipu"].astype(int)).idxmax()
    out.index.name = "ipu"
    return out


# --- stash ----------------------------------------------------------------------------

STASH_COLUMNS = ["stage", "ipu", "depth", "per_microbatch_bytes", "stash_bytes"]


def stash(stages: pd.DataFrame) -> pd.DataFrame:
    """The activation stash per stage, the one definition every view uses: `depth`
    micro-batches held between their forward and backward (the one being computed
    included) x `per_microbatch_bytes` each = `stash_bytes`. /liveness lists the stash
    beyond the current micro-batch (depth - 1 copies) as its own variable; the total is
    this. A stage table without depth columns (an older file) keeps its stash_bytes."""
    if stages.empty or "stash_bytes" not in stages.columns:
        return pd.DataFrame(columns=STASH_COLUMNS)
    total = pd.to_numeric(stages["stash_bytes"], errors="coerce").fillna(0).astype(np.int64)
    if "stash_depth" in stages.columns and "stash_bytes_per_microbatch" in stages.columns:
        depth = pd.to_numeric(stages["stash_depth"], errors="coerce").fillna(0).astype(np.int64)
        per = pd.to_numeric(stages["stash_bytes_per_microbatch"],
                            errors="coerce").fillna(0).astype(np.int64)
        total = (depth * per).where(depth > 0, 0)
        per = per.where(depth > 0, 0)  # no stash: nothing held per micro-batch either
    else:
        depth = pd.Series(-1, index=stages.index, dtype=np.int64)  # unknown
        per = pd.Series(0, index=stages.index, dtype=np.int64)
    return pd.DataFrame({"stage": stages["stage"].astype(int).to_numpy(),
                         "ipu": stages["ipu"].astype(int).to_numpy(),
                         "depth": depth.to_numpy(), "per_microbatch_bytes": per.to_numpy(),
                         "stash_bytes": total.to_numpy()})


def stash_per_ipu(stages: pd.DataFrame) -> pd.Series:
    """Stash bytes per device (index ipu, sorted): the sum of its stages' `stash`."""
    table = stash(stages)
    out = table.groupby("ipu", sort=True)["stash_bytes"].sum().astype(np.int64)
    out.index.name = "ipu"
    return out


def peak_liveness(liveness: pd.DataFrame) -> pd.Series:
    """Per device (index ipu, sorted): peak always-live + not-always-live bytes."""
    if liveness.empty:
        return pd.Series(dtype="int64", index=pd.Index([], name="ipu"))
    total = (pd.to_numeric(liveness["always_live_bytes"]).astype(np.int64)
             + pd.to_numeric(liveness["not_always_live_bytes"]).astype(np.int64))
    out = total.groupby(liveness["ipu"].astype(int)).max()
    out.index.name = "ipu"
    return out


def oom_tiles(tile_memory: pd.DataFrame) -> pd.DataFrame:
    """Tiles whose total exceeds their capacity, worst first, with `bytes_over` (the oom
    table's name) and `utilisation` (total over capacity) added."""
    tm = tile_memory.copy()
    cap = tm["capacity_bytes"].astype(float)
    tm["utilisation"] = (tm["total_bytes"] / cap.where(cap > 0)).fillna(0.0)
    tm["bytes_over"] = (tm["total_bytes"] - tm["capacity_bytes"]).clip(lower=0)
    over = tm[tm["bytes_over"] > 0]
    return over.sort_values(["bytes_over", "ipu", "tile"], ascending=[False, True, True],
                            kind="stable").reset_index(drop=True)


def fits(tile_memory: pd.DataFrame) -> bool | None:
    """True when no tile is over its capacity, False when one is, None (unknown) when
    there is no per-tile data or no capacity to hold it against (a measured run)."""
    if tile_memory.empty or not (tile_memory["capacity_bytes"] > 0).any():
        return None
    return bool(oom_tiles(tile_memory).empty)


def fits_or_stored(tile_memory: pd.DataFrame, summary: dict) -> bool | None:
    """`fits` from the tiles; without tile data, what the stored summary says (a file
    written before the tiles were kept, or None: unknown)."""
    known = fits(tile_memory)
    if known is not None:
        return known
    stored = summary.get("fits")
    return None if stored is None else bool(stored)


def device_capacities(meta: dict) -> dict[int, int]:
    """Device memory per rank of a measured profile (`meta.measure.device_memory_bytes`,
    written by `popviz import` from the trace's deviceProperties), or per GPU of a modelled
    GPU target (`meta.target.usable_bytes`); {} when unknown. The
    meta comes from an untrusted file: anything but a positive whole number of bytes (no
    bool, no infinity) under an integer rank is dropped."""
    measure = meta.get("measure") if isinstance(meta, dict) else None
    stored = measure.get("device_memory_bytes") if isinstance(measure, dict) else None
    target = meta.get("target") if isinstance(meta, dict) else None
    if stored is None and isinstance(target, dict) and target.get("family") == "gpu":
        # a modelled GPU: each GPU's memory less the CUDA context (what PyTorch may hold)
        count = target.get("num_ipus")
        usable = target.get("usable_bytes")
        if isinstance(count, int) and not isinstance(count, bool) and 0 < count <= 1 << 16:
            stored = {str(i): usable for i in range(count)}
    if not isinstance(stored, dict):
        return {}
    out = {}
    for rank, value in stored.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        try:
            rank, whole = int(rank), int(value)
        except (TypeError, ValueError, OverflowError):
            continue
        if whole == value and whole > 0:
            out[rank] = whole
    return out


def device_fit(liveness: pd.DataFrame | pd.Series, capacity: dict[int, int]) -> pd.DataFrame:
    """Per device with a known capacity and a liveness curve: its peak liveness
    (`peak_liveness`, or the peaks given as a Series by device), capacity and utilisation
    (peak over capacity). A device without liveness is left out: nothing says how full it
    was."""
    peaks = liveness if isinstance(liveness, pd.Series) else peak_liveness(liveness)
    rows = [(rank, int(peaks[rank]), cap) for rank, cap in sorted(capacity.items())
            if rank in peaks.index]
    frame = pd.DataFrame(rows, columns=["ipu", "peak_bytes", "capacity_bytes"])
    frame["utilisation"] = frame["peak_bytes"] / frame["capacity_bytes"].astype(float)
    return frame.astype({"ipu": "int64", "peak_bytes": "int64", "capacity_bytes": "int64"})


def device_fits(liveness: pd.DataFrame | pd.Series, capacity: dict[int, int]) -> bool | None:
    """True when every device's peak is within its memory; None when no device has both
    a capacity and a liveness curve."""
    rows = device_fit(liveness, capacity)
    return bool((rows["utilisation"] <= 1.0).all()) if len(rows) else None


def fit_verdict(tile_memory: pd.DataFrame, liveness: pd.DataFrame | pd.Series,
                meta: dict) -> bool | None:
    """Does the profile fit: its tiles against their capacity when it has tiles, else an
    imported GPU's peak liveness (a liveness table, or its peaks by device) against its
    device memory; None when neither is known."""
    known = fits(tile_memory)
    return known if known is not None else device_fits(liveness, device_capacities(meta))
