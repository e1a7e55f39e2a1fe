"""Plain-language advice from the facts of one profile: where memory or time goes wrong
and which knob (AMP, split points, recomputation, gradient accumulation) to turn.

Each rule is a small function returning zero or more `Advice`; `advise` runs them in order
of urgency (does not fit, then slow). Thresholds live in popviz.vocab: one set for advice,
cards and figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from popviz.analysis.balance import imbalance, stage_balance
from popviz.analysis.memory import ipu_totals, oom_tiles
from popviz.metrics import stage_idle_fraction
from popviz.vocab import (
    BUBBLE_LIMIT,
    DEFAULT_AMP,
    IMBALANCE_LIMIT,
    MEASURED_KIND,
    MIN_AMP,
    MODELLED_KIND,
    NEARLY_FULL,
    ipu_label,
    is_measured,
    naming_of,
)

KiB = 1024


@dataclass(frozen=True)
class Advice:
    severity: str  # "error" (does not fit), "warning" (slow), "info"
    topic: str  # "amp", "split", "recomputation", "accumulation", "ok"
    ipu: int | None
    text: str


def amp_for(meta: dict[str, Any], ipu: int) -> float:
    """The conv AMP in effect on `ipu` from meta['options'] ({"all": a, "IPU1": [c, m]})."""
    amp = (meta.get("options") or {}).get("available_memory_proportion") or {}
    value = amp.get(ipu_label(ipu), amp.get(str(ipu), amp.get("all", DEFAULT_AMP)))
    if isinstance(value, (list, tuple)):
        value = value[0]
    try:
        return float(value)
    except (TypeError, ValueError):
        return DEFAULT_AMP


def _split_after(stages: pd.DataFrame, splits: list[str], stage: int) -> str | None:
    """The split name that starts stage + 1 (the boundary after `stage`)."""
    if 0 <= stage < len(splits):
        return splits[stage]
    if "first_layer" in stages.columns:
        nxt = stages[stages["stage"] == stage + 1]
        if len(nxt):
            return str(nxt["first_layer"].iloc[0])
    return None


def _oom_advice(meta: dict[str, Any], stages: pd.DataFrame, tile_memory: pd.DataFrame,
                splits: list[str], recomputation: bool) -> list[Advice]:
    out: list[Advice] = []
    over = oom_tiles(tile_memory)
    if over.empty:
        return out
    totals = ipu_totals(tile_memory).set_index("ipu")
    for ipu, tiles in over.groupby("ipu", sort=True):
        ipu = int(ipu)
        worst = int(tiles["bytes_over"].max())
        head = (f"{ipu_label(ipu)} does not fit: {len(tiles)} tile(s) out of memory, "
                f"up to {worst / KiB:,.0f} KiB over.")
        nal = float(tiles.get("not_always_live_peak", pd.Series([0.0])).sum())
        alive = float(tiles.get("always_live", pd.Series([0.0])).sum())
        if nal >= alive:
            amp = amp_for(meta, ipu)
            if amp > MIN_AMP:
                new = max(MIN_AMP, round(amp / 2, 2))
                out.append(Advice("error", "amp", ipu, f"{head} Temporaries and activations "
                                  f"dominate there: lower availableMemoryProportion on "
                                  f"{ipu_label(ipu)} from {amp:g} to about {new:g}."))
            if not recomputation:
                out.append(Advice("error", "recomputation", ipu,
                                  "Enable recomputation to cut activation liveness on "
                                  f"{ipu_label(ipu)} (only checkpoints are kept through the "
                                  "forward pass)."))
        else:
            out.append(Advice("error", "split", ipu, f"{head} Always-live data (weights, "
                              "optimiser state) dominate: move layers off this IPU or "
                              "offload the optimiser state."))
        # where to move layers: the neighbour with more free memory
        util = totals["utilisation"]
        stage_rows = stages[stages["ipu"] == ipu]["stage"] if "stage" in stages else []
        if len(stage_rows) and len(totals) > 1:
            first, last = int(min(stage_rows)), int(max(stage_rows))
            before, after = util.get(ipu - 1), util.get(ipu + 1)
            if after is not None and (before is None or after <= before):
                name = _split_after(stages, splits, last)
                if name:
                    out.append(Advice("error", "split", ipu, f"Move split '{name}' earlier so "
                                      f"{ipu_label(ipu + 1)} ({after:.0%} used) takes "
                                      f"layers from {ipu_label(ipu)}."))
            elif before is not None:
                name = _split_after(stages, splits, first - 1)
                if name:
                    out.append(Advice("error", "split", ipu, f"Move split '{name}' later so "
                                      f"{ipu_label(ipu - 1)} ({before:.0%} used) takes "
                                      f"layers from {ipu_label(ipu)}."))
    return out


def _balance_advice(stages: pd.DataFrame, splits: list[str],
                    measured: bool = False) -> list[Advice]:
    bal = stage_balance(stages)
    if len(bal) < 2 or bal["busy_cycles"].mean() <= 0:
        return []
    busy = bal.set_index("stage")["busy_cycles"]
    top = int(busy.idxmax())
    load = imbalance(stages)
    if load < IMBALANCE_LIMIT:
        return []
    ipu = int(bal.loc[bal["stage"] == top, "ipu"].iloc[0])
    # a measured run is ranks and ns, a modelled one IPUs and cycles
    words = naming_of(MEASURED_KIND if measured else MODELLED_KIND)
    where, others = words.label(ipu), words.devices
    busy_time = "busy time" if measured else "busy cycles"
    head = (f"Stage {top} on {where} is the bottleneck: {load:.2f}x the mean {busy_time} "
            f"of all stages, so the other {others} wait at every sync.")
    before, after = busy.get(top - 1), busy.get(top + 1)
    if after is not None and (before is None or after <= before):
        name = _split_after(stages, splits, top)
        move = f" Move split '{name}' earlier to hand layers to stage {top + 1}." if name else ""
    elif before is not None:
        name = _split_after(stages, splits, top - 1)
        move = f" Move split '{name}' later to hand layers to stage {top - 1}." if name else ""
    else:
        move = ""
    return [Advice("warning", "split", ipu, head + move)]


def _bubble_advice(meta: dict[str, Any], stages: pd.DataFrame) -> list[Advice]:
    options = meta.get("options") or {}
    bal = stage_balance(stages)
    if len(bal) < 2 or options.get("strategy", "pipelined") != "pipelined":
        return []
    bubble = stage_idle_fraction(stages)
    accumulation = int(options.get("gradient_accumulation", 1) or 1)
    if bubble < BUBBLE_LIMIT or accumulation >= 4 * len(bal):
        return []
    return [Advice("warning", "accumulation", None,
                   f"{bubble:.0%} of the step is idle in pipeline bubbles: raise gradient "
                   f"accumulation (now {accumulation}) to at least {4 * len(bal)} to amortise "
                   "the ramp-up and ramp-down.")]


def _headroom_advice(meta: dict[str, Any], tile_memory: pd.DataFrame) -> list[Advice]:
    if tile_memory.empty or not oom_tiles(tile_memory).empty:
        return []
    out = []
    for row in ipu_totals(tile_memory).itertuples():
        amp = amp_for(meta, int(row.ipu))
        if row.max_tile_utilisation < NEARLY_FULL and amp < DEFAULT_AMP:
            out.append(Advice("info", "amp", int(row.ipu),
                              f"{ipu_label(row.ipu)}: the fullest tile is only "
                              f"{row.max_tile_utilisation:.0%} used; raising "
                              f"availableMemoryProportion from {amp:g} toward "
                              f"{DEFAULT_AMP:g} may save cycles."))
    return out


def _amp_ignored_advice(ops: pd.DataFrame) -> list[Advice]:
    if ops.empty or "amp_ignored" not in ops.columns:
        return []
    ignored = ops[ops["amp_ignored"].astype(bool)]
    if ignored.empty:
        return []
    where = ignored["layer"] if "layer" in ignored.columns else ignored["op"]
    names = ", ".join(dict.fromkeys(str(x) for x in where))
    shown = names if len(names) < 120 else names[:117] + "..."
    return [Advice("info", "amp", None, f"{len(ignored)} op(s) could not be planned within "
                   f"their availableMemoryProportion, so lowering it will not help them: "
                   f"{shown}.")]


def _shared_parameter_advice(meta: dict[str, Any]) -> list[Advice]:
    """Tied weights read on several IPUs (meta['shared_parameters'], from the compiler)."""
    out = []
    for p in meta.get("shared_parameters") or []:
        copies = ", ".join(ipu_label(i) for i in p.get("copy_ipus", []))
        home = p.get("home_ipu", 0)
        out.append(Advice(
            "info", "split", home,
            f"Parameter {p.get('name')} ({p.get('bytes', 0) / KiB:.0f} KiB) is shared: it "
            f"lives on {ipu_label(home)} and a copy on {copies}; its gradient goes from "
            f"{copies} to {ipu_label(home)} at every weight update. Keeping its readers in one "
            "stage avoids the copy and the exchange."))
    return out


def advise(meta: dict[str, Any], stages: pd.DataFrame, tile_memory: pd.DataFrame,
           ops: pd.DataFrame | None = None, measured: bool | None = None) -> list[Advice]:
    """Every piece of advice for one profile, most urgent first. A measured profile
    (meta kind, unless `measured` says) is worded in ranks and time, not IPUs and cycles."""
    if measured is None:
        measured = is_measured(meta.get("kind", ""))
    options = meta.get("options") or {}
    splits = [str(s) for s in (options.get("splits") or [])]
    recomputation = bool(options.get("recomputation", False))
    out = _oom_advice(meta, stages, tile_memory, splits, recomputation)
    out += _balance_advice(stages, splits, measured)
    out += _bubble_advice(meta, stages)
    out += _headroom_advice(meta, tile_memory)
    out += _amp_ignored_advice(ops if ops is not None else pd.DataFrame())
    out += _shared_parameter_advice(meta)
    if not out:
        out.append(Advice("info", "ok", None, "Fits, and the stages are balanced within "
                          f"{IMBALANCE_LIMIT - 1:.0%}: nothing to change."))
    return out
