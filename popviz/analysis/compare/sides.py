"""One side of a comparison: a profile's own figures, in seconds and per sample.

Everything a comparison aligns is computed here from one profile alone, so each delta the
comparison reports is the difference of two numbers this module produced independently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from popviz.metrics import (
    COMPUTE,
    device_capacities,
    fit_verdict,
    fits_or_stored,
    idle_fractions,
    oom_tiles,
    peak_liveness,
    rank_time,
    stash,
    stash_per_ipu,
)
from popviz.vocab import ipu_label, naming_for, profile_words

if TYPE_CHECKING:  # the type only: importing popviz.format loads h5py
    from popviz.format.profile import Profile

# what the IPUs spend their time on, in the order shown (trace kind / pass -> category)
TIME_CATEGORIES = ["forward", "backward", "recompute", "weight_update", "compute",
                   "exchange", "idle", "untraced"]
# timeline categories folded into the comparison's: host I/O is exchange, a sync is waiting
_FOLD = {"host_io": "exchange", "sync": "idle"}
COMPUTE_CATEGORIES = COMPUTE
PER_SAMPLE_PHASES = ("forward", "backward", "recompute", "host_io")
# liveness anchors: the first step of these phases lands at the same x on both sides
ANCHORS: dict[str, tuple[str, ...]] = {"backward": ("backward", "recompute"),
                                       "optimiser": ("optimiser",)}


@dataclass
class Side:
    label: str                    # "A" or "B"
    facts: dict[str, Any]         # descriptive: name, kind, target, options, fits, ...
    metrics: dict[str, float]     # headline numbers (build.METRICS)
    time_per_sample: pd.Series    # category -> IPU-us per sample
    op_classes: pd.Series         # (op_class, phase) -> us per sample
    ipus: pd.DataFrame            # index ipu: compute_ms, exchange_ms, idle_ms, peak_bytes, ...
    stages: pd.DataFrame          # index stage: forward_ms, ..., stash_bytes, peak_bytes
    liveness: pd.DataFrame        # side, ipu, step, phase, always/not-always/total bytes
    tiles: pd.DataFrame           # side, ipu, tile, total_bytes, capacity_bytes, utilisation


def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if np.isfinite(out) else None


def seconds_per_unit(profile: Profile) -> tuple[float, str]:
    """Seconds per trace time unit and the unit's name: ns when measured, else cycles at
    meta.target.clock_hz (a ValueError naming the profile when the clock is missing)."""
    if naming_for(profile).in_ns:  # a run, or a GPU plan: its trace is in ns
        return 1e-9, "ns"
    clock = _num((profile.meta.get("target") or {}).get("clock_hz"))
    if not clock or clock <= 0:
        raise ValueError(f"{profile.path or profile.name}: meta.target.clock_hz is missing, "
                         "so its cycles cannot be converted to seconds")
    return 1.0 / clock, "cycles"


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    if name in frame.columns:
        return pd.to_numeric(frame[name], errors="coerce").fillna(0).astype(float)
    return pd.Series(0.0, index=frame.index)


def _options_text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "default"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "none"
    return "" if value is None else str(value)


def _layout_splits(stages: pd.DataFrame, options: dict[str, Any]) -> str:
    """The split points as compiled (each later stage's first layer): the same layout reads
    the same whether its options named splits or blocks per stage."""
    if "first_layer" in stages.columns and len(stages) > 1:
        return " ".join(map(str, stages.sort_values("stage")["first_layer"].iloc[1:]))
    return _options_text(options.get("splits") or [])


def _layout_amp(stages: pd.DataFrame, options: dict[str, Any]) -> str:
    """The AMP each IPU ran with (defaults filled in), else the options as given."""
    if "amp" in stages.columns and len(stages):
        per_ipu = stages.drop_duplicates("ipu").sort_values("ipu")
        return ", ".join(f"IPU{int(i)}: {float(a):g}" for i, a in
                         zip(per_ipu["ipu"], per_ipu["amp"], strict=True))
    return _options_text(options.get("available_memory_proportion") or {})


def load_side(profile: Profile, label: str) -> Side:
    """Read what a comparison needs from one profile (Profile or ReportProfile)."""
    meta, summary = profile.meta or {}, dict(profile.summary or {})
    target, options = meta.get("target") or {}, meta.get("options") or {}
    scale, unit = seconds_per_unit(profile)
    stages, trace = profile.stages, profile.trace
    tile_memory, liveness, exchange = profile.tile_memory, profile.liveness, profile.exchange

    num_ipus = int(_num(summary.get("num_ipus")) or _num(target.get("num_ipus"))
                   or (trace["ipu"].nunique() if len(trace) else 1))
    replicas = int(_num(summary.get("replicas")) or _num(options.get("replication_factor"))
                   or 1)
    total_ipus = int(_num(summary.get("total_ipus")) or num_ipus * replicas)
    micro_batch = int(_num(summary.get("micro_batch_size")) or _num(
        (meta.get("model") or {}).get("batch_size")) or _num(options.get("micro_batch_size"))
        or 1)
    accumulation = int(_num(options.get("gradient_accumulation")) or 1)
    iterations = int(_num(options.get("device_iterations")) or 1)
    samples = _num(summary.get("samples_per_step")) or float(
        micro_batch * accumulation * iterations * replicas)

    span = float(trace["end"].max() - trace["start"].min()) if len(trace) else 0.0
    step_cycles = _num(summary.get("step_cycles"))
    step_s = _num(summary.get("step_seconds"))
    if step_s is None and (step_cycles is not None or span > 0):
        step_s = (step_cycles if step_cycles is not None else span) * scale
    throughput = _num(summary.get("throughput")) or (samples / step_s if step_s else None)
    per_ipu = _num(summary.get("throughput_per_ipu")) or (
        throughput / total_ipus if throughput else None)

    # IPU-time per sample by category, each instant of a device's step counted once (the
    # timeline sweep); untraced time closes the sum exactly
    times = rank_time(trace)
    folded = times[[c for c in times.columns if c not in ("untraced", "step_time", "steps")]]
    folded = folded.T.groupby(lambda c: _FOLD.get(c, c), sort=False).sum().T
    per_replica = samples / replicas if replicas else samples
    by_cat = folded.sum() * scale * 1e6 / per_replica
    tps = by_cat.reindex(TIME_CATEGORIES[:-1]).fillna(0.0)
    ipu_us = 1e6 / per_ipu if per_ipu else float("nan")
    rest = ipu_us - float(tps.sum()) if per_ipu else 0.0
    tps["untraced"] = rest if abs(rest) > 1e-9 * abs(ipu_us) else 0.0  # not float noise
    compute = float(tps[list(COMPUTE_CATEGORIES)].sum())

    # per IPU, per step
    ipus = pd.DataFrame(index=pd.Index(range(num_ipus), name="ipu"))
    ms = scale * 1e3
    ipus["compute_ms"] = folded.reindex(columns=list(COMPUTE_CATEGORIES), fill_value=0.0).sum(
        axis=1).reindex(ipus.index).fillna(0.0) * ms
    for c in ("exchange", "idle"):
        ipus[f"{c}_ms"] = (folded[c].reindex(ipus.index).fillna(0.0) if c in folded.columns
                           else 0.0) * ms
    # what no event covers (a measured rank's host work between ops): with it the bars
    # add up to the step
    ipus["untraced_ms"] = (times["untraced"].reindex(ipus.index).fillna(0.0)
                           if "untraced" in times.columns else 0.0) * ms
    capacity = float(_num(target.get("tiles_per_ipu")) or 0) * float(
        _num(target.get("bytes_per_tile")) or 0)
    # an imported GPU: each rank's own device memory (ranks may hold different GPUs)
    gpu_memory = {} if capacity else device_capacities(meta)
    per_device = (pd.Series(capacity, index=ipus.index, dtype=float) if capacity
                  else pd.Series(gpu_memory, dtype=float).reindex(ipus.index))
    peaks = peak_liveness(liveness).astype(float)
    if peaks.empty and "peak_bytes" in stages.columns:
        peaks = _col(stages, "peak_bytes").groupby(stages["ipu"].astype(int)).max()
    ipus["peak_bytes"] = peaks.reindex(ipus.index).astype(float)
    ipus["headroom_bytes"] = per_device - ipus["peak_bytes"]
    if gpu_memory:  # the capacity the fullest device's peak is a share of
        held = ipus["peak_bytes"].where(per_device.notna())
        capacity = (float(per_device[held.idxmax()])  # type: ignore[call-overload]  # pandas-stubs: a label is Hashable
                    if held.notna().any() else float(per_device.max()))
        capacity = capacity if capacity == capacity else 0.0  # no rank of this profile
    over = oom_tiles(tile_memory) if len(tile_memory) else tile_memory
    ipus["oom_tiles"] = (over.groupby("ipu").size().reindex(ipus.index).fillna(0).astype(float)
                         if len(tile_memory) else np.nan)
    # a measured run's traces hold no stash: unknown (NaN), not none
    stash_known = len(stages) > 0 and not naming_for(profile).measured
    ipus["stash_bytes"] = (stash_per_ipu(stages).astype(float).reindex(ipus.index)
                           .fillna(0.0) if stash_known else np.nan)

    st = pd.DataFrame(index=pd.Index(stages["stage"].astype(int).to_numpy() if len(stages)
                                     else [], name="stage"))
    for col in ("forward", "backward", "recompute", "exchange", "idle"):
        st[f"{col}_ms"] = _col(stages, f"{col}_cycles").to_numpy() * ms
    st["stash_bytes"] = (stash(stages)["stash_bytes"].to_numpy(float)
                         if stash_known and "stash_bytes" in stages.columns
                         else np.full(len(st), np.nan))
    st["peak_bytes"] = _col(stages, "peak_bytes").to_numpy()

    ops = profile.ops
    op_classes = pd.Series(dtype=float)
    if len(ops) and "cycles" in ops.columns:
        # a modelled op runs once per micro-batch, the optimiser once per weight update; a
        # measured run's ops are every call of every recorded step
        per = (np.full(len(ops), float(per_replica * max(ops["step"].nunique(), 1)))
               if naming_for(profile).measured and "step" in ops.columns else
               np.where(ops["phase"].astype(str).isin(PER_SAMPLE_PHASES), micro_batch,
                        micro_batch * accumulation))
        us = _col(ops, "cycles").to_numpy() * scale * 1e6 / per
        cls = (ops["op_class"].astype(str).to_numpy() if "op_class" in ops.columns
               else np.full(len(ops), "other", dtype=object))  # optional column
        op_classes = pd.Series(us).groupby([cls, ops["phase"].astype(str).to_numpy()]).sum()

    tiles = pd.DataFrame({"side": label, "ipu": tile_memory["ipu"].astype(int).to_numpy(),
                          "tile": tile_memory["tile"].astype(int).to_numpy(),
                          "total_bytes": _col(tile_memory, "total_bytes").to_numpy(),
                          "capacity_bytes": _col(tile_memory, "capacity_bytes").to_numpy()})
    tiles["utilisation"] = tiles["total_bytes"] / tiles["capacity_bytes"].where(
        tiles["capacity_bytes"] > 0)
    lv = pd.DataFrame({"side": label, "ipu": liveness["ipu"].astype(int).to_numpy(),
                       "step": liveness["step"].astype(int).to_numpy(),
                       "phase": liveness["phase"].astype(str).to_numpy(),
                       "always_live_bytes": _col(liveness, "always_live_bytes").to_numpy(),
                       "not_always_live_bytes": _col(liveness, "not_always_live_bytes")
                       .to_numpy()})
    lv["total_bytes"] = lv["always_live_bytes"] + lv["not_always_live_bytes"]

    inter = ex_host = 0.0
    if len(exchange):
        host = exchange["src"].astype(str).str.lower().eq("host") | exchange["dst"].astype(
            str).str.lower().eq("host")
        # a measured run's transfers cover every recorded step: the metric is one step's
        steps = exchange["step"].nunique() if "step" in exchange.columns else 1
        ex_bytes = _col(exchange, "bytes") / max(int(steps), 1)
        # a copy between two stages of one device (interleaved stages on one rank, kind
        # internal) moves nothing between devices: a one-rank run read 128 KiB of
        # rank-to-rank traffic (an all-reduce's row names one IPU too, and does cross)
        between = (exchange["kind"].astype(str) != "internal").to_numpy() \
            if "kind" in exchange.columns else np.ones(len(exchange), dtype=bool)
        ex_host = float(ex_bytes[host].sum())
        inter = float(ex_bytes[~host & between].sum())
    fits = fit_verdict(tile_memory, liveness, meta)
    fits = fits_or_stored(tile_memory, summary) if fits is None else fits
    n_oom = float(len(over)) if len(tile_memory) else float(_num(summary.get("oom_tiles")) or 0)
    metrics = {
        "throughput_per_ipu": per_ipu, "throughput": throughput, "total_ipus": total_ipus,
        "step_ms": step_s * 1e3 if step_s else None,
        "step_cycles": (step_cycles if step_cycles is not None else span or None)
        if unit == "cycles" else None,
        "samples_per_step": samples, "latency_ms": _num(summary.get("latency_ms")),
        "ipu_us_per_sample": ipu_us if per_ipu else None,
        # one definition of idle (popviz.metrics), from the trace, never a stored copy
        "idle_fraction": idle_fractions(times)[1] if len(times)
        else _num(summary.get("idle_fraction")),
        "recompute_fraction": float(tps["recompute"]) / compute if compute else 0.0,
        "peak_bytes_max": float(ipus["peak_bytes"].max()) if len(peaks) else None,
        "headroom_bytes_min": float(ipus["headroom_bytes"].min()) if len(peaks) and capacity
        else None,
        "fullest_tile_utilisation": float(tiles["utilisation"].max()) if len(tiles) else None,
        "oom_tiles": n_oom, "exchange_bytes": inter + ex_host, "inter_ipu_bytes": inter,
        "host_bytes": ex_host,
        "stash_bytes": float(stash_per_ipu(stages).sum()) if stash_known else None,
    }
    name = str(profile.name or label)
    if name in ("training", "inference") and profile.path:
        name = f"{Path(profile.path).parent.parent.name}/{name}"  # PopTorch's run folders
    training = options.get("training", summary.get("training", True))
    facts = {
        "side": label, "name": name, "run": "training" if training else "inference",
        "path": str(profile.path), "kind": str(profile.kind),
        "model": str((meta.get("model") or {}).get("name", "")),
        # an imported trace records no model: its name is the trace file's
        "model_from_file": bool((meta.get("measure") or {}).get("imported")),
        "target": str(target.get("name", "")), "clock_hz": _num(target.get("clock_hz")),
        "family": str(target.get("family") or "ipu"),
        # the words the profile states (what `ipu` counts, what its times hold)
        **dict(zip(("device_kind", "time_unit"), profile_words(profile))),
        "num_ipus": num_ipus, "replicas": replicas,
        "total_ipus": total_ipus, "ipu_capacity_bytes": capacity,
        "capacity_name": "device memory" if gpu_memory else "IPU capacity", "fits": fits,
        "oom_tiles": int(n_oom),
        "oom_ipus": " ".join(ipu_label(i) for i in sorted(set(over["ipu"].astype(int))))
        if len(tile_memory) else "",
        "strategy": _options_text(options.get("strategy")),
        "schedule": _options_text(options.get("schedule")),
        "recomputation": bool(options.get("recomputation", False)),
        "amp": _layout_amp(stages, options),
        "splits": _layout_splits(stages, options),
        # a GPU plan runs the dtypes as recorded: the IPU precision option does not apply
        "precision": "as recorded" if target.get("family") == "gpu"
        else _options_text(options.get("precision")),
        "micro_batch_size": micro_batch, "gradient_accumulation": accumulation,
    }
    return Side(label=label, facts=facts, metrics={k: v for k, v in metrics.items()
                                                   if v is not None},
                time_per_sample=tps, op_classes=op_classes, ipus=ipus, stages=st,
                liveness=lv, tiles=tiles)


def _anchor_fractions(lv: pd.DataFrame) -> pd.DataFrame:
    """Per (side, ipu): the step count and the first step of each anchor phase (NaN if none)."""
    rows = []
    for (side, ipu), g in lv.groupby(["side", "ipu"], sort=True):
        g = g.sort_values("step")
        row: dict[str, Any] = {"side": side, "ipu": ipu, "n": float(g["step"].max() + 1)}
        for name, phases in ANCHORS.items():
            hit = g.loc[g["phase"].isin(phases), "step"]
            row[name] = float(hit.iloc[0]) if len(hit) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def normalised_liveness(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame,
                                                                   dict[str, float]]:
    """Both sides' liveness on a common x in [0, 1] (program progress) whose phase
    boundaries coincide: each IPU's steps are mapped piecewise-linearly so that its first
    backward (or recompute) step and its first optimiser step land on the same x for every
    curve, x_k being the mean over the two sides of their own boundary fractions.
    Returns the frame (with column x) and {anchor: x}."""
    lv = pd.concat([a, b], ignore_index=True)
    if lv.empty:
        return lv.assign(x=pd.Series(dtype=float)), {}
    fr = _anchor_fractions(lv)
    knots: dict[str, float] = {}
    for name in ANCHORS:
        if fr[name].notna().all():  # an anchor only when every curve has that phase
            frac = fr[name] / fr["n"]
            knots[name] = float(frac.groupby(fr["side"]).mean().mean())
    if list(knots.values()) != sorted(knots.values()):
        knots = {}
    xs = np.empty(len(lv))
    for key, idx in lv.groupby(["side", "ipu"], sort=False).groups.items():
        side, ipu = cast(tuple[str, int], key)  # grouped by (side, ipu)
        row = fr[(fr["side"] == side) & (fr["ipu"] == ipu)].iloc[0]
        steps_k, xs_k = [0.0], [0.0]
        for name, x in knots.items():
            if row[name] > steps_k[-1]:
                steps_k.append(float(row[name]))
                xs_k.append(x)
        steps_k.append(max(row["n"] - 1, steps_k[-1] + 1))  # last step at x = 1
        xs_k.append(1.0)
        xs[lv.index.get_indexer(idx)] = np.interp(lv.loc[idx, "step"].to_numpy(float),
                                                  steps_k, xs_k)
    out = lv.assign(x=xs).sort_values(["side", "ipu", "step"], kind="stable")
    return out.reset_index(drop=True), knots
