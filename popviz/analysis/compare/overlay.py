"""PopVision's merged liveness overlay: both profiles' live memory on one axis.

Each curve's program steps are put on x = fraction of its step (0 = its first recorded
step, 1 = its last), so runs with different numbers of steps line up. Either every device
(IPU or rank) of both sides is a curve, or each side is one curve, the whole-device peak:
at each x the most any of its devices holds (the envelope of its step-hold curves), whose
maximum is that side's fullest device's peak."""

from __future__ import annotations

import numpy as np
import pandas as pd

MODES = ("device", "peak")
COLUMNS = ["side", "curve", "ipu", "step", "x", "total_bytes"]


def _fraction(steps: np.ndarray) -> np.ndarray:
    lo, hi = float(steps.min()), float(steps.max())
    return (steps - lo) / (hi - lo) if hi > lo else np.zeros(len(steps))


def _envelope(curves: pd.DataFrame) -> pd.DataFrame:
    """The most any device holds at each x of any device: each device's memory holds
    from its step's x until its next step's."""
    xs = np.unique(curves["x"].to_numpy(float))
    held = []
    for _, g in curves.groupby("ipu", sort=True):
        g = g.sort_values("x", kind="stable")
        at = np.searchsorted(g["x"].to_numpy(float), xs, side="right") - 1
        y = g["total_bytes"].to_numpy(float)
        held.append(np.where(at >= 0, y[np.clip(at, 0, None)], 0.0))
    top = np.max(held, axis=0)
    owner = np.argmax(held, axis=0)
    ipus = np.array(sorted(curves["ipu"].unique()))
    return pd.DataFrame({"ipu": ipus[owner], "step": -1, "x": xs, "total_bytes": top})


def liveness_overlay(liveness: pd.DataFrame, mode: str = "device") -> pd.DataFrame:
    """`liveness`: Comparison.liveness (side, ipu, step, total_bytes, ...). Returns
    COLUMNS: side, curve ('IPU index' per device or 'peak'), ipu (the device holding the
    point), step (-1 on a peak curve), x in [0, 1], total_bytes."""
    if mode not in MODES:
        raise ValueError(f"liveness overlay mode must be device or peak, not {mode!r}")
    if liveness.empty:
        return pd.DataFrame(columns=COLUMNS)
    parts = []
    for (side, ipu), g in liveness.groupby(["side", "ipu"], sort=True):
        g = g.sort_values("step", kind="stable")
        steps = g["step"].to_numpy(float)
        parts.append(pd.DataFrame({"side": side, "curve": str(int(ipu)), "ipu": int(ipu),  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
                                   "step": g["step"].astype(int).to_numpy(),
                                   "x": _fraction(steps),
                                   "total_bytes": g["total_bytes"].to_numpy(float)}))
    curves = pd.concat(parts, ignore_index=True)
    if mode == "device":
        return curves[COLUMNS]
    peaks = [(_envelope(g).assign(side=side, curve="peak"))
             for side, g in curves.groupby("side", sort=True)]
    return pd.concat(peaks, ignore_index=True)[COLUMNS]


__all__ = ["MODES", "liveness_overlay"]
