"""Everything the summary page says about one profile, as plain data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from popviz.analysis.advice import Advice, advise
from popviz.analysis.balance import (
    bottleneck_stage,
    imbalance,
    is_sharded,
    stage_balance,
    timed_stages,
)
from popviz.analysis.liveness import liveness_peaks
from popviz.analysis.memory import fit_summary, fullest_tiles, ipu_totals
from popviz.metrics import (
    device_capacities,
    device_fit,
    device_fits,
    fits_or_stored,
    stage_idle_fraction,
)
from popviz.vocab import naming_for

if TYPE_CHECKING:  # the type only: importing popviz.format loads h5py
    from popviz.format.profile import Profile


def capacity_per_ipu(meta: dict[str, Any]) -> float:
    target = meta.get("target") or {}
    return float(target.get("tiles_per_ipu", 0)) * float(target.get("bytes_per_tile", 0))


def idle_title(sharded: bool) -> str:
    """What a multi-device run's idle share is called. A pipelined run's idle is its
    pipeline bubbles (filling, draining, waiting for the slowest stage); a sharded run has
    no pipeline: one shard runs at a time, so each IPU idles while another shard runs."""
    return "waiting for other shards" if sharded else "pipeline bubbles"


def insights(profile: Profile) -> dict[str, Any]:
    """Fit, the fullest tiles, speed, the bottleneck and advice. Reads only the small tables
    (the trace only of a measured run, which is small), so it is cheap on big profiles."""
    meta, summary = profile.meta or {}, profile.summary or {}
    words = naming_for(profile)  # what kind of profile: its stated words
    measured = words.measured
    stages = timed_stages(profile.table("stages"),
                          profile.table("trace") if measured else None, measured)
    tile_memory = profile.table("tile_memory")
    fit = fit_summary(tile_memory, profile.table("oom"))
    live, capacity = profile.table("liveness"), device_capacities(meta)
    gpu = not words.has_tiles  # an imported GPU or a GPU target's plan: device memory
    devices = device_fit(live, capacity) if not fit["known"] and gpu else pd.DataFrame()
    if len(devices):  # a GPU: its peak against its device memory
        fit = {**fit, "known": True, "basis": "device", "fits": device_fits(live, capacity),
               "max_utilisation": float(devices["utilisation"].max()),
               "devices": devices.to_dict(orient="records")}
    elif not fit["known"]:
        fit["fits"] = fits_or_stored(tile_memory, summary)
    target = meta.get("target") or {}
    clock = float(target.get("clock_hz") or 0)
    step_cycles = summary.get("step_cycles")
    if step_cycles is None and not stages.empty:
        step_cycles = float(stage_balance(stages)["total_cycles"].max())
    step_ms = summary.get("step_ms")
    if step_ms is None and step_cycles and clock:
        step_ms = float(step_cycles) / clock * 1e3
    return {
        "kind": profile.kind,
        "sharded": is_sharded(meta),
        "model": (meta.get("model") or {}).get("name", ""),
        "target": target.get("name", ""),
        "num_ipus": int(target.get("num_ipus") or stages["ipu"].nunique() if len(stages)
                        else target.get("num_ipus") or 0),
        "fit": fit,
        "fullest_tiles": fullest_tiles(tile_memory) if len(tile_memory) else pd.DataFrame(),
        "ipu_totals": ipu_totals(tile_memory) if len(tile_memory) else pd.DataFrame(),
        "capacity_per_ipu": capacity_per_ipu(meta),
        "throughput": summary.get("throughput"),
        "latency_ms": summary.get("latency_ms"),
        "step_cycles": step_cycles,
        "step_ms": step_ms,
        "bottleneck": bottleneck_stage(stages),
        "imbalance": imbalance(stages) if len(stages) else 1.0,
        "bubble_fraction": stage_idle_fraction(stages),
        "peaks": liveness_peaks(profile.table("liveness")),
        "advice": advise(meta, stages, tile_memory, profile.table("ops"), measured,
                         exchange=profile.table("exchange")),
    }


__all__ = ["Advice", "capacity_per_ipu", "idle_title", "insights"]
