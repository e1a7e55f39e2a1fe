"""Compare two profiles: which layout is better, why, and by how much.

`compare(a, b)` aligns the two profiles' own figures (every delta is exactly b - a and every
ratio b / a of those figures) and explains the difference. Times are converted to seconds
so modelled (cycles at meta.target.clock_hz) and measured (ns) profiles compare; per-sample
figures make layouts with different micro-batches, IPU counts and replicas comparable.

The "why" is an exact decomposition: IPU-time per sample = total IPUs / throughput
= (IPUs per replica x step time) / samples per replica, split by what the IPUs were doing
(forward, backward, recompute, weight update, exchange, idle + sync) from the trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from popviz.analysis.compare.sides import (
    TIME_CATEGORIES,
    Side,
    load_side,
    normalised_liveness,
)
from popviz.analysis.compare.table import DELTA_COLUMNS, Comparison, deltas
from popviz.analysis.compare.verdict import verdict
from popviz.vocab import Naming, naming_of

if TYPE_CHECKING:  # the type only: importing popviz.format loads h5py
    from popviz.format.profile import Profile


def _long(keys: list[str], units: dict[str, tuple[str, str]], a: pd.DataFrame,
          b: pd.DataFrame) -> pd.DataFrame:
    """Per-key tables of several metrics -> long delta frame (key..., metric, unit, deltas)."""
    out = []
    for metric, (unit, _) in units.items():
        sa = a[metric] if metric in a.columns else pd.Series(dtype=float)
        sb = b[metric] if metric in b.columns else pd.Series(dtype=float)
        d = deltas(sa, sb)
        if d.empty:
            continue
        d.index.names = keys
        d = d.reset_index()
        d.insert(len(keys), "metric", metric)
        d.insert(len(keys) + 1, "unit", unit)
        out.append(d)
    if not out:
        return pd.DataFrame(columns=[*keys, "metric", "unit", *DELTA_COLUMNS])
    frame = pd.concat(out, ignore_index=True)
    return frame.sort_values([*keys], kind="stable").reset_index(drop=True)


# metric -> (unit, which is better), in the order shown
METRICS: dict[str, tuple[str, str]] = {
    "throughput_per_ipu": ("samples/s per IPU", "higher"),
    "throughput": ("samples/s", "higher"),
    "total_ipus": ("IPUs", ""),
    "step_ms": ("ms", ""),
    "step_cycles": ("cycles", ""),
    "samples_per_step": ("samples", ""),
    "latency_ms": ("ms", "lower"),
    "ipu_us_per_sample": ("IPU-us per sample", "lower"),
    "idle_fraction": ("fraction", "lower"),
    "recompute_fraction": ("fraction of compute", "lower"),
    "peak_bytes_max": ("bytes", "lower"),
    "headroom_bytes_min": ("bytes", "higher"),
    "fullest_tile_utilisation": ("fraction", "lower"),
    "oom_tiles": ("tiles", "lower"),
    "exchange_bytes": ("bytes", "lower"),
    "inter_ipu_bytes": ("bytes", "lower"),
    "host_bytes": ("bytes", "lower"),
    "stash_bytes": ("bytes", "lower"),
}
IPU_METRICS = {"compute_ms": ("ms", "lower"), "exchange_ms": ("ms", "lower"),
               "idle_ms": ("ms", "lower"), "untraced_ms": ("ms", "lower"),
               "peak_bytes": ("bytes", "lower"), "headroom_bytes": ("bytes", "higher"),
               "oom_tiles": ("tiles", "lower"), "stash_bytes": ("bytes", "lower")}
STAGE_METRICS = {"forward_ms": ("ms", "lower"), "backward_ms": ("ms", "lower"),
                 "recompute_ms": ("ms", "lower"), "exchange_ms": ("ms", "lower"),
                 "idle_ms": ("ms", "lower"), "stash_bytes": ("bytes", "lower"),
                 "peak_bytes": ("bytes", "lower")}


def compare(a: Profile, b: Profile, judge: str | None = None) -> Comparison:
    """Compare open profile `a` with open profile `b` (`popviz.compare` also takes paths);
    `judge`: "total" or "per-device" when they run on different numbers of devices
    (verdict.JUDGES), None to be given both answers."""
    return build(load_side(a, "A"), load_side(b, "B"), judge)


def device_units(sa: Side, sb: Side) -> dict[str, str]:
    """Units that name the device, in each side's words (naming_of: IPU, or rank for a
    measured profile), e.g. 'samples/s per IPU (A) / rank (B)' when they differ."""
    words = [naming_of(s.facts) for s in (sa, sb)]

    def both(make: Callable[[Naming], str]) -> str:
        a, b = (make(w) for w in words)
        return a if a == b else f"{a} (A) / {b} (B)"
    time = both(lambda w: f"{w.device}-µs" if w.in_ns else "IPU-us")
    return {"throughput_per_ipu": "samples/s per " + both(lambda w: w.device),
            "total_ipus": both(lambda w: w.devices),
            "ipu_us_per_sample": f"{time} per sample", "time_per_sample": f"{time} per sample"}


def build(sa: Side, sb: Side, judge: str | None = None) -> Comparison:
    """The comparison of two loaded sides (see sides.load_side)."""
    metrics = deltas(pd.Series(sa.metrics, dtype=float), pd.Series(sb.metrics, dtype=float))
    metrics = metrics.reindex([m for m in METRICS if m in metrics.index])
    metrics = metrics.dropna(how="all", subset=["a", "b"])
    if "step_cycles" in metrics.index and metrics.loc["step_cycles", ["a", "b"]].isna().any():
        metrics = metrics.drop(index="step_cycles")  # ns vs cycles: compare step_ms instead
    units = device_units(sa, sb)
    metrics.insert(0, "unit", [units.get(m, METRICS[m][0]) for m in metrics.index])
    metrics.insert(1, "better", [METRICS[m][1] for m in metrics.index])
    metrics = metrics.rename_axis("metric").reset_index()

    tps = deltas(sa.time_per_sample, sb.time_per_sample).fillna({"a": 0.0, "b": 0.0})
    tps = tps.reindex([c for c in TIME_CATEGORIES if c in tps.index])
    tps["delta"] = tps["b"] - tps["a"]  # absent category = no time spent on it
    tps["ratio"] = tps["b"] / tps["a"].where(tps["a"] != 0)
    total = float(tps["delta"].sum())
    tps["share_of_delta"] = tps["delta"] / total if total else np.nan
    tps.insert(0, "unit", units["time_per_sample"])
    tps = tps.rename_axis("category").reset_index()

    # a class one side never ran costs it 0; a side with no op costs at all (measured) is
    # absent, not 0
    fill = {k: 0.0 for k, side in (("a", sa), ("b", sb)) if len(side.op_classes)}
    ops = deltas(sa.op_classes, sb.op_classes).fillna(fill)
    ops["delta"] = ops["b"] - ops["a"]
    ops["ratio"] = ops["b"] / ops["a"].where(ops["a"] != 0)
    if not isinstance(ops.index, pd.MultiIndex):  # neither side has per-op times
        ops.index = pd.MultiIndex.from_arrays([[], []])
    ops.index.names = ["op_class", "phase"]
    ops.insert(0, "unit", "us per sample")
    ops = ops.reset_index().sort_values("delta", key=np.abs, ascending=False, kind="stable")

    sides = pd.DataFrame([sa.facts, sb.facts])
    liveness, phase_x = normalised_liveness(sa.liveness, sb.liveness)
    tiles = pd.concat([sa.tiles, sb.tiles], ignore_index=True)
    comp = Comparison(
        sides=sides, metrics=metrics, time_per_sample=tps,
        ipus=_long(["ipu"], IPU_METRICS, sa.ipus, sb.ipus),
        stages=_long(["stage"], STAGE_METRICS, sa.stages, sb.stages),
        op_classes=ops.reset_index(drop=True), liveness=liveness, tiles=tiles,
        phase_x=phase_x)
    comp.verdict = verdict(comp, sa, sb, judge)
    return comp


__all__ = ["IPU_METRICS", "METRICS", "STAGE_METRICS", "build", "compare", "device_units"]
