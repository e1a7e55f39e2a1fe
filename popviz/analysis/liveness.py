"""Liveness: peaks, bumps (local maxima ranked by prominence) and what is live at a step."""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.metrics import peak_rows


def _base_mins(values: np.ndarray) -> np.ndarray:
    """For each i, the minimum strictly between i and the nearest earlier value >= values[i]
    (or the start); +inf when they are adjacent. One pass with a monotonic stack."""
    n = len(values)
    out = np.full(n, np.inf)
    stack_vals: list[float] = []
    stack_gap: list[float] = []  # min between the entry below and this one
    for i in range(n):
        v = float(values[i])
        m = np.inf
        while stack_vals and stack_vals[-1] < v:
            m = min(m, stack_vals.pop(), stack_gap.pop())
        out[i] = m
        stack_vals.append(v)
        stack_gap.append(m)
    return out


def find_bumps(values: np.ndarray, min_prominence: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Indices and prominences of local maxima (first index of a plateau) whose prominence
    (height above the higher of the two bases, as in scipy.signal.peak_prominences) is at
    least `min_prominence`."""
    v = np.asarray(values, dtype=float)
    if len(v) < 3:
        return np.array([], dtype=np.int64), np.array([], dtype=float)
    # local maxima: rises into i, then does not rise until it falls (plateaus count once)
    change = np.flatnonzero(np.diff(v) != 0) + 1
    keep = np.r_[0, change]  # first index of each run of equal values
    runs = v[keep]
    if len(runs) < 3:
        return np.array([], dtype=np.int64), np.array([], dtype=float)
    is_max = np.r_[False, (runs[1:-1] > runs[:-2]) & (runs[1:-1] > runs[2:]), False]
    peaks_run = np.flatnonzero(is_max)
    left = _base_mins(runs)
    right = _base_mins(runs[::-1])[::-1]
    lb = np.where(np.isinf(left), runs, left)[peaks_run]
    rb = np.where(np.isinf(right), runs, right)[peaks_run]
    prom = runs[peaks_run] - np.maximum(lb, rb)
    sel = prom >= min_prominence
    return keep[peaks_run[sel]].astype(np.int64), prom[sel]


def liveness_peaks(liveness: pd.DataFrame) -> pd.DataFrame:
    """Per IPU: the step of peak total liveness (always-live + not-always-live)."""
    cols = ["ipu", "peak_step", "peak_bytes", "always_live_bytes", "not_always_live_bytes",
            "phase", "label"]
    if liveness.empty:
        return pd.DataFrame(columns=cols)
    idx = peak_rows(liveness)
    total = liveness["always_live_bytes"] + liveness["not_always_live_bytes"]
    rows = liveness.loc[idx.to_numpy()]
    return pd.DataFrame({
        "ipu": rows["ipu"].astype(int).to_numpy(), "peak_step": rows["step"].to_numpy(),
        "peak_bytes": total.loc[idx.to_numpy()].to_numpy(),
        "always_live_bytes": rows["always_live_bytes"].to_numpy(),
        "not_always_live_bytes": rows["not_always_live_bytes"].to_numpy(),
        "phase": rows["phase"].astype(str).to_numpy() if "phase" in rows else "",
        "label": rows["label"].astype(str).to_numpy() if "label" in rows else "",
    })


def bumps(liveness: pd.DataFrame, rel_prominence: float = 0.1,
          max_per_ipu: int = 10) -> pd.DataFrame:
    """Bumps of not-always-live memory per IPU: local maxima whose prominence is at least
    `rel_prominence` of that IPU's not-always-live range, the most prominent first."""
    cols = ["ipu", "step", "not_always_live_bytes", "total_bytes", "prominence", "label",
            "phase"]
    frames = []
    for ipu, group in liveness.groupby("ipu", sort=True):
        group = group.sort_values("step")
        nal = group["not_always_live_bytes"].to_numpy(dtype=float)
        span = float(nal.max() - nal.min()) if len(nal) else 0.0
        if span <= 0:
            continue
        idx, prom = find_bumps(nal, rel_prominence * span)
        order = np.argsort(-prom, kind="stable")[:max_per_ipu]
        idx, prom = idx[order], prom[order]
        rows = group.iloc[idx]
        frames.append(pd.DataFrame({
            "ipu": int(ipu), "step": rows["step"].to_numpy(),  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
            "not_always_live_bytes": rows["not_always_live_bytes"].to_numpy(),
            "total_bytes": (rows["always_live_bytes"] + rows["not_always_live_bytes"]).to_numpy(),
            "prominence": prom,
            "label": rows["label"].astype(str).to_numpy() if "label" in rows else "",
            "phase": rows["phase"].astype(str).to_numpy() if "phase" in rows else "",
        }))
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat(frames, ignore_index=True)


def variables_live_at(variables: pd.DataFrame, ipu: int, step: int) -> pd.DataFrame:
    """Not-always-live variables on `ipu` live at program step `step`, largest first."""
    if variables.empty:
        return variables
    live = variables[(variables["ipu"] == ipu) & (variables["first_step"] <= step)
                     & (variables["last_step"] >= step)]
    return live.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)


def step_memory(liveness: pd.DataFrame, ipu: int, step: int) -> int | None:
    """The liveness curve's not-always-live bytes on `ipu` at `step` (None: no such step)."""
    if liveness.empty:
        return None
    row = liveness.loc[(liveness["ipu"] == ipu) & (liveness["step"] == step),
                       "not_always_live_bytes"]
    return int(row.iloc[0]) if len(row) else None


def liveness_source(meta: dict | None, ipu: int) -> str:
    """Where an imported profile's curve comes from, in words, for a note that there is no
    per-variable data: the rank's CUDA memory snapshot, or its trace's memory events."""
    measure = (meta or {}).get("measure") or {}
    if not measure.get("imported"):
        return "the recorded run"
    snaps = measure.get("memory_snapshots") or []
    if 0 <= ipu < len(snaps) and snaps[ipu]:
        return "the CUDA memory snapshot's allocations"
    return "the trace's memory events"


def merged_variables(live: pd.DataFrame) -> pd.DataFrame:
    """Rows of `variables_live_at` that read the same (one op's several outputs of the
    same name and lifetime: a norm's mean and rstd) as one row with their bytes summed
    and the count in the name ('x (2 tensors)'), largest first."""
    keys = [c for c in ("ipu", "name", "category", "first_step", "last_step") if c in live]
    if live.empty or "bytes" not in live or not keys:
        return live
    g = live.groupby(keys, sort=False, dropna=False)
    out = g["bytes"].sum().reset_index()
    count = g.size().to_numpy()
    out["name"] = [n if c == 1 else f"{n} ({c} tensors)" for n, c in
                   zip(out["name"].astype(str), count, strict=True)]
    return out.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)
