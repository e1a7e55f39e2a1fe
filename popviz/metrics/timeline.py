"""Where each instant of a device's timeline goes, swept a slice of whole devices at a time.

`metrics.rank_time` and `metrics.stage_time` of a whole trace are a `TimelineTally` fed
that trace in one `add`. `popviz import` of a job feeds it one rank's events at a time and
keeps only what the sweep leaves (a few numbers per rank and step): the job's trace is
then written rank by rank and never held whole. The sweep of a device does not depend on
the other devices; only the step windows (first start to last end of a step over every
device) do, and those are merged at the end. With whole-number times (ns) the figures are
exactly the ones one sweep over the whole trace gives (tests/test_timeline.py).

Part of the metrics core (popviz.metrics): numpy, pandas and popviz.vocab only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from popviz.vocab import CATEGORIES, category_codes

RANK_COLUMNS = [*CATEGORIES, "untraced"]


def event_codes(trace: pd.DataFrame) -> np.ndarray:
    """Each event's category index in CATEGORIES (popviz.vocab.category_codes)."""
    return category_codes(trace["kind"].to_numpy(),
                          trace["pass"].to_numpy() if "pass" in trace.columns else None)


def sweep(group: np.ndarray, start: np.ndarray, end: np.ndarray, code: np.ndarray,
          n_groups: int, n_codes: int) -> np.ndarray:
    """Time per (group, code) with each instant counted once, for the lowest code active.
    Vectorised: one sort, one cumsum. When no two events of a group overlap (every
    modelled trace) it is the plain sum of durations, taken without the cumsum."""
    n = len(start)
    out = np.zeros((n_groups, n_codes))
    if n == 0:
        return out
    order = np.lexsort((start, group))
    gs, s0, e0 = group[order], start[order], end[order]
    # sorted by start, no event starts before the previous one ends: no overlap at all
    if not ((gs[1:] == gs[:-1]) & (s0[1:] < e0[:-1])).any():
        np.add.at(out, (gs.astype(np.int64), code[order].astype(np.int64)),
                  (e0 - s0).astype(np.float64))
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


@dataclass
class _Device:
    steps: np.ndarray  # the steps this device has events in, sorted
    times: np.ndarray  # (len(steps), len(RANK_COLUMNS)): the sweep, "untraced" still 0
    stages: np.ndarray  # the stages it has events of, sorted (stage >= 0)
    stage_times: np.ndarray  # (len(stages), len(CATEGORIES))


@dataclass
class TimelineTally:
    """`rank_time` and `stage_time` of every trace slice `add`ed, each slice holding all of
    its devices' events (a device is never split over two slices)."""

    devices: dict[int, _Device] = field(default_factory=dict)
    windows: dict[int, tuple[float, float]] = field(default_factory=dict)  # step: lo, hi

    @classmethod
    def of(cls, trace: pd.DataFrame) -> TimelineTally:
        """The tally of one whole trace."""
        tally = cls()
        tally.add(trace)
        return tally

    def add(self, trace: pd.DataFrame) -> None:
        if trace.empty:
            return
        ipu = trace["ipu"].astype(int).to_numpy()
        step = (pd.to_numeric(trace["step"], errors="coerce").fillna(0).astype(int).to_numpy()
                if "step" in trace.columns else np.zeros(len(trace), dtype=int))
        start = trace["start"].to_numpy(np.float64)
        end = trace["end"].to_numpy(np.float64)
        codes = event_codes(trace)
        steps, step_idx = np.unique(step, return_inverse=True)
        lo = np.full(len(steps), np.inf)
        hi = np.full(len(steps), -np.inf)
        np.minimum.at(lo, step_idx, start)
        np.maximum.at(hi, step_idx, end)
        self._widen(zip(steps.tolist(), lo.tolist(), hi.tolist(), strict=True))
        ipus, ipu_idx = np.unique(ipu, return_inverse=True)
        if any(int(i) in self.devices for i in ipus):
            raise ValueError("a device's events came in two slices")
        group = ipu_idx * len(steps) + step_idx
        times = sweep(group, start, end, codes, len(ipus) * len(steps), len(RANK_COLUMNS))
        times = times.reshape(len(ipus), len(steps), len(RANK_COLUMNS))
        stage = trace["stage"].to_numpy(np.int64) if "stage" in trace.columns \
            else np.full(len(trace), -1, np.int64)
        keep = stage >= 0
        n_stages = int(stage[keep].max()) + 1 if keep.any() else 0
        per_stage = sweep(ipu_idx[keep] * n_stages + stage[keep], start[keep], end[keep],
                          codes[keep], len(ipus) * n_stages, len(CATEGORIES)
                          ).reshape(len(ipus), n_stages, len(CATEGORIES))
        for k, device in enumerate(ipus.tolist()):
            mine = step_idx[ipu_idx == k]
            has = np.unique(mine)
            seen = np.unique(stage[keep & (ipu_idx == k)])
            self.devices[int(device)] = _Device(steps[has], times[k][has], seen,
                                                per_stage[k][seen])

    def merge(self, other: TimelineTally) -> None:
        """Add another tally's devices (none of them in this one)."""
        if set(other.devices) & set(self.devices):
            raise ValueError("a device's events came in two slices")
        self.devices.update(other.devices)
        self._widen((s, lo, hi) for s, (lo, hi) in other.windows.items())

    def _widen(self, windows: Any) -> None:
        for step, lo, hi in windows:
            was = self.windows.get(step)
            self.windows[step] = (lo, hi) if was is None else (min(was[0], lo),
                                                               max(was[1], hi))

    def rank_time(self) -> pd.DataFrame:
        """`metrics.rank_time` of everything added."""
        if not self.devices:
            return pd.DataFrame(columns=[*RANK_COLUMNS, "step_time", "steps"],
                                index=pd.Index([], name="ipu"), dtype=float)
        steps = np.array(sorted(self.windows))
        w_start = np.array([self.windows[s][0] for s in steps.tolist()])
        w_end = np.array([self.windows[s][1] for s in steps.tolist()])
        ipus = sorted(self.devices)
        times = np.zeros((len(ipus), len(steps), len(RANK_COLUMNS)))
        for k, ipu in enumerate(ipus):
            device = self.devices[ipu]
            times[k, np.searchsorted(steps, device.steps)] = device.times
        times = times.reshape(len(ipus) * len(steps), len(RANK_COLUMNS))
        # what no event covers: the (device, step) window less the time attributed in it
        window = (w_end - w_start)[np.arange(len(times)) % len(steps)]
        times[:, -1] = window - times[:, :-1].sum(axis=1)
        per = times.reshape(len(ipus), len(steps), len(RANK_COLUMNS)).mean(axis=1)
        out = pd.DataFrame(per, columns=RANK_COLUMNS, index=pd.Index(ipus, name="ipu"))
        out["step_time"] = float((w_end - w_start).mean())
        out["steps"] = float(len(steps))
        return out

    def stage_time(self, n_stages: int) -> pd.DataFrame:
        """`metrics.stage_time(trace, n_stages)` of everything added."""
        out = pd.DataFrame(0.0, index=pd.RangeIndex(n_stages, name="stage"),
                           columns=list(CATEGORIES))
        ipus = [i for i in sorted(self.devices)
                if (self.devices[i].stages < n_stages).any()]
        if not ipus or not n_stages:
            return out
        times = np.zeros((len(ipus), n_stages, len(CATEGORIES)))
        for k, ipu in enumerate(ipus):
            device = self.devices[ipu]
            inside = device.stages < n_stages
            times[k, device.stages[inside]] = device.stage_times[inside]
        out.loc[:, :] = times.sum(axis=0)
        return out
