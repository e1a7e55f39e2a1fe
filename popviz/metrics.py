"""Where each instant of a device's (IPU's or rank's) timeline goes, counted once.

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

from popviz.vocab import CATEGORIES, COMPUTE, category_codes

__all__ = ["CATEGORIES", "COMPUTE", "idle_fractions", "rank_time", "sweep"]


def _codes(trace: pd.DataFrame) -> np.ndarray:
    """Each event's category index in CATEGORIES (popviz.vocab.category_codes)."""
    return category_codes(trace["kind"].astype(str).to_numpy(),
                          trace["pass"].astype(str).to_numpy() if "pass" in trace.columns
                          else None)


def sweep(group: np.ndarray, start: np.ndarray, end: np.ndarray, code: np.ndarray,
          n_groups: int, n_codes: int) -> np.ndarray:
    """Time per (group, code) with each instant counted once, for the lowest code active.
    Events must lie inside their group's window; add one event of code n_codes - 1
    spanning the window to collect the uncovered time. Vectorised: one sort, one cumsum."""
    n = len(start)
    out = np.zeros((n_groups, n_codes))
    if n == 0:
        return out
    g = np.concatenate([group, group]).astype(np.int64)
    t = np.concatenate([start, end]).astype(np.float64)
    c = np.concatenate([code, code]).astype(np.int64)
    step = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    order = np.lexsort((t, g))
    g, t, c, step = g[order], t[order], c[order], step[order]
    delta = np.zeros((2 * n, n_codes), dtype=np.int64)
    delta[np.arange(2 * n), c] = step
    active = np.cumsum(delta, axis=0)[:-1] > 0  # coverage between point i and i + 1
    length = np.diff(t)
    ok = (g[:-1] == g[1:]) & (length > 0) & active.any(axis=1)
    winner = np.argmax(active, axis=1)  # the first (highest-priority) active code
    np.add.at(out, (g[:-1][ok], winner[ok]), length[ok])
    return out


def rank_time(trace: pd.DataFrame) -> pd.DataFrame:
    """Per device (index ipu): mean time per step in each of CATEGORIES + "untraced",
    summing to the step time (column step_time) in the trace's unit. A step's window runs
    from its first start to its last end over all devices (a trace without a step column
    is one step), so every device shares the same rank-time."""
    cols = [*CATEGORIES, "untraced"]
    if trace.empty:
        return pd.DataFrame(columns=[*cols, "step_time", "steps"],
                            index=pd.Index([], name="ipu"), dtype=float)
    ipu = trace["ipu"].astype(int).to_numpy()
    step = (pd.to_numeric(trace["step"], errors="coerce").fillna(0).astype(int).to_numpy()
            if "step" in trace.columns else np.zeros(len(trace), dtype=int))
    start = trace["start"].to_numpy(np.float64)
    end = trace["end"].to_numpy(np.float64)
    steps, step_idx = np.unique(step, return_inverse=True)
    w_start = np.full(len(steps), np.inf)
    w_end = np.full(len(steps), -np.inf)
    np.minimum.at(w_start, step_idx, start)
    np.maximum.at(w_end, step_idx, end)
    ipus, ipu_idx = np.unique(ipu, return_inverse=True)
    n_groups = len(ipus) * len(steps)
    group = ipu_idx * len(steps) + step_idx
    # one window-long event of the lowest priority per (device, step) catches the gaps
    all_groups = np.arange(n_groups)
    g_step = all_groups % len(steps)
    times = sweep(np.concatenate([group, all_groups]),
                  np.concatenate([start, w_start[g_step]]),
                  np.concatenate([end, w_end[g_step]]),
                  np.concatenate([_codes(trace), np.full(n_groups, len(CATEGORIES))]),
                  n_groups, len(cols))
    per = times.reshape(len(ipus), len(steps), len(cols)).mean(axis=1)
    out = pd.DataFrame(per, columns=cols, index=pd.Index(ipus, name="ipu"))
    out["step_time"] = float((w_end - w_start).mean())
    out["steps"] = float(len(steps))
    return out


def idle_fractions(times: pd.DataFrame) -> tuple[pd.Series, float]:
    """Idle (idle + sync) over rank-time: per device, and overall."""
    if times.empty:
        return pd.Series(dtype=float), 0.0
    idle = times["idle"] + times["sync"]
    rank = times["step_time"].replace(0, np.nan)
    overall = float(idle.sum() / rank.sum()) if rank.sum() else 0.0
    return (idle / rank).fillna(0.0), overall
