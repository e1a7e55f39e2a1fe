"""Plain-language advice from the facts of one profile: where memory or time goes wrong
and which knob (AMP, split points, recomputation, gradient accumulation) to turn.

Each rule is a small function returning zero or more `Advice`; `advise` runs them in order
of urgency (does not fit, then slow). Thresholds live in popviz.vocab: one set for advice,
cards and figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from popviz.analysis.amp import amp_effect, amp_steps, amp_to_fit, effect_words, knows
from popviz.analysis.balance import (
    imbalance,
    ipu_imbalance,
    is_sharded,
    returns_to_an_ipu,
    stage_balance,
    stages_take_turns,
)
from popviz.analysis.gpu_advice import micro_batch_advice
from popviz.analysis.memory import ipu_totals, oom_tiles
from popviz.analysis.pipeline_plan import (
    balanced_bounds,
    bound_by,
    frozen_stages,
    host_io_by_ipu,
    plan_moves,
    profile_recomputes,
    segments,
    stage_costs,
)
from popviz.metrics import fits, stage_idle_fraction
from popviz.vocab import (
    BUBBLE_LIMIT,
    DEFAULT_AMP,
    IMBALANCE_LIMIT,
    MEASURED_KIND,
    MIN_AMP,
    MODELLED_KIND,
    NEARLY_FULL,
    TILE_AMBER,
    ipu_label,
    naming_of,
)

KiB = 1024


@dataclass(frozen=True)
class Advice:
    severity: str  # "error" (does not fit), "warning" (slow), "info"
    topic: str  # "amp", "split", "recomputation", "accumulation", "memory", "host_io",
    # "idle" (one measured device mostly waiting), "micro_batch" (GPU memory unused), "ok"
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
                splits: list[str], recomputation: bool, steps: Callable[[], Any]
                ) -> list[Advice]:
    out: list[Advice] = []
    over = oom_tiles(tile_memory)
    if over.empty:
        return out
    totals = ipu_totals(tile_memory).set_index("ipu")
    for ipu, tiles in over.groupby("ipu", sort=True):
        ipu = int(ipu)  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
        worst = int(tiles["bytes_over"].max())
        head = (f"{ipu_label(ipu)} does not fit: {len(tiles)} tile(s) out of memory, "
                f"up to {worst / KiB:,.0f} KiB over.")
        nal = float(tiles.get("not_always_live_peak", pd.Series([0.0])).sum())
        alive = float(tiles.get("always_live", pd.Series([0.0])).sum())
        if nal >= alive:
            amp = amp_for(meta, ipu)
            effect = amp_effect(steps(), ipu, lower=True)
            fit_amp, most = amp_to_fit(steps(), ipu, worst) if effect is not None \
                else (None, 0)
            if effect is not None and fit_amp is None:  # no AMP saves enough: say so
                lowest = float(steps().query("ipu == @ipu")["amp"].min())
                out.append(Advice("error", "amp", ipu, f"{head} Temporaries and activations "
                                  f"dominate there, but lowering availableMemoryProportion "
                                  f"alone will not make {ipu_label(ipu)} fit: even at "
                                  f"{lowest:g} its convolutions' and matmuls' largest "
                                  f"temporary per tile shrinks by {most / KiB:,.0f} KiB, "
                                  f"against the {worst / KiB:,.0f} KiB its fullest tile is "
                                  f"over. Cut activations (recomputation) or move layers off "
                                  f"it (below), then lower AMP {effect_words(amp, effect)} "
                                  f"if it is still short."))
            elif effect is not None:  # the highest lower AMP that saves enough
                out.append(Advice("error", "amp", ipu, f"{head} Temporaries and activations "
                                  f"dominate there: lower availableMemoryProportion on "
                                  f"{ipu_label(ipu)} to {fit_amp:g}, the highest step whose "
                                  f"convolutions and matmuls shrink their largest temporary "
                                  f"per tile by at least the {worst / KiB:,.0f} KiB over (the "
                                  f"nearest step: {effect_words(amp, effect)})."))
            elif amp > MIN_AMP and not knows(steps(), ipu):  # cannot re-plan: say roughly
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
        stage_rows = stages[stages["ipu"] == ipu]["stage"].tolist() if "stage" in stages else []
        if len(stage_rows) and len(totals) > 1:
            first, last = int(min(stage_rows)), int(max(stage_rows))
            before, after = util.get(ipu - 1), util.get(ipu + 1)
            roomy = [u for u in (before, after) if u is not None and u < 1]
            if not roomy:  # a neighbour that is itself over has no room to take layers
                out.append(Advice("error", "split", ipu, f"No neighbour of {ipu_label(ipu)} "
                                  "has room to take layers (" + ", ".join(
                                      f"{ipu_label(i)} {u:.0%} used" for i, u in
                                      ((ipu - 1, before), (ipu + 1, after)) if u is not None)
                                  + "): spread the model over more IPUs, or cut what each "
                                  "holds (recomputation, a smaller micro-batch)."))
            elif after is not None and after < 1 and (before is None or before >= 1
                                                      or after <= before):
                name = _split_after(stages, splits, last)
                if name:
                    out.append(Advice("error", "split", ipu, f"Move split '{name}' earlier so "
                                      f"{ipu_label(ipu + 1)} ({after:.0%} used) takes "
                                      f"layers from {ipu_label(ipu)}."))
            elif before is not None and before < 1:
                name = _split_after(stages, splits, first - 1)
                if name:
                    out.append(Advice("error", "split", ipu, f"Move split '{name}' later so "
                                      f"{ipu_label(ipu - 1)} ({before:.0%} used) takes "
                                      f"layers from {ipu_label(ipu)}."))
    return out


def _pct(shares: dict[str, float]) -> str:
    return ", ".join(f"{v:.0%} {k}" for k, v in shares.items())


def _split_moves(meta: dict[str, Any], stages: pd.DataFrame, ops: pd.DataFrame,
                 tile_use: dict[int, float], proposed_splits: list[str] | None,
                 top: int, ipu: int) -> list[Advice]:
    """Where each split should move: the tune search's plan when given, else a balanced
    split of the stored per-segment costs that keeps nearly-full IPUs from taking layers."""
    segs = segments(ops, meta)
    ordered = stages.sort_values("stage")
    if segs is None or "first_layer" not in ordered.columns:
        return []
    current = segs.bounds([str(x) for x in ordered["first_layer"].iloc[1:]])
    if current is None:
        return []
    frozen = frozen_stages(ordered, tile_use)
    recompute = profile_recomputes(meta) and len(ordered) > 1
    if proposed_splits is not None:
        proposed, source = segs.bounds(proposed_splits), "the tune search's best plan"
    else:
        proposed = balanced_bounds(segs, len(ordered), current, frozen,
                                   recompute=recompute)
        source = "a balanced split of the stored per-layer costs"
    if proposed is None or len(proposed) != len(current):
        return []
    moves = plan_moves(segs, current, proposed)
    ipu_of = dict(zip(ordered["stage"].astype(int), ordered["ipu"].astype(int)))
    words = naming_of(meta)  # a GPU plan: GPUs and ns, no tiles
    label, unit = (words.label, words.unit) if words.gpu_plan else (ipu_label, "cycles")
    held = [label(ipu_of.get(s, s)) for s in sorted(frozen)]
    keep = (f" {', '.join(held)} take no layers: fullest tile at or past "
            f"{TILE_AMBER:.0%}." if held else "")
    if not moves:
        return [Advice("info", "split", ipu, f"Stage {top} cannot be balanced further at the "
                       f"usable split names ({source} keeps every split where it is): split "
                       f"the model at finer points, or raise the stage count.{keep}")]
    # the moves are one plan: lead with what it does as a whole, then word each move as a
    # part of it (alone, a move can load the bottleneck further before a later one relieves it)
    was, now = stage_costs(segs, current, recompute), stage_costs(segs, proposed, recompute)
    before, after = max(was), max(now)
    n = len(moves)
    out = []
    if after > 0:
        parts = "its parts are below, to make together" if n > 1 else "the move below"
        out.append(Advice("info", "split", None, (
            f"One plan ({source}): splits {[segs.names[b - 1] for b in proposed]}, "
            f"{n} split move{'s' if n > 1 else ''} at once ({parts}). The slowest stage "
            f"drops from {before:,.0f} to {after:,.0f} {unit} per micro-batch, about "
            f"{before / after:.2f}x on the steady state.{keep}")))
    for i, m in enumerate(moves, 1):
        gives, takes = (m.index, m.index + 1) if m.earlier else (m.index + 1, m.index)
        where = ipu_of.get(takes, takes)
        shown = ", ".join(m.layers[:4]) + (f" and {len(m.layers) - 4} more"
                                          if len(m.layers) > 4 else "")
        part = f"Part {i} of {n} of the plan" if n > 1 else "The plan"
        out.append(Advice("warning", "split", where, (
            f"{part}: move split '{m.old}' {'earlier' if m.earlier else 'later'} to "
            f"'{m.new}': stage {takes} ({label(where)}"
            + ("" if not words.has_tiles else f", fullest tile {tile_use.get(where, 0.0):.0%} used")
            + f") takes {shown} from stage {gives}; with "
            f"the whole plan stage {takes} goes from {was[takes]:,.0f} to "
            f"{now[takes]:,.0f} {unit} per micro-batch.")))
    return out


def _balance_advice(meta: dict[str, Any], stages: pd.DataFrame, tile_memory: pd.DataFrame,
                    ops: pd.DataFrame, exchange: pd.DataFrame | None, measured: bool,
                    proposed_splits: list[str] | None) -> list[Advice]:
    bal = stage_balance(stages)
    if stages_take_turns(bal) or bal["busy_cycles"].mean() <= 0:
        return []
    if returns_to_an_ipu(bal):
        return _ipu_balance_advice(meta, stages, measured)
    busy = bal.set_index("stage")["busy_cycles"]
    top = int(busy.idxmax())  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
    load = imbalance(stages)
    if load < IMBALANCE_LIMIT:
        return []
    row = bal[bal["stage"] == top].iloc[0]
    ipu = int(row["ipu"])
    # a measured run is ranks and ns, a modelled one IPUs and cycles (a GPU plan: GPUs, ns)
    words = naming_of(MEASURED_KIND if measured else MODELLED_KIND, meta)  # meta's words win
    gpu = words.gpu_plan
    where, others = words.label(ipu), words.devices
    if is_sharded(meta):
        return [_sharded_advice(meta, where, top, load)]
    busy_time = "busy time" if measured or gpu else "busy cycles"
    wait = "wait for its activations and gradients" if gpu else "wait at every sync"
    kind, shares = bound_by(row, host_io_by_ipu(exchange).get(ipu, 0.0))
    head = (f"Stage {top} on {where} is the bottleneck: {load:.2f}x the mean {busy_time} "
            f"of all stages, so the other {others} {wait}. It is {kind}-bound "
            f"({_pct(shares)}).")
    if kind == "host I/O":
        return [Advice("warning", "host_io", ipu, head + " Moving splits does not shorten "
                       "host transfers: send fewer or smaller inputs (uint8 or half images, "
                       "preprocessing on the device) or raise device iterations.")]
    if kind == "exchange":
        head += (" Exchange dominates: prefer cuts where the boundary activations are "
                 "small, and check the exchange page for the largest transfers.")
    out = [Advice("warning", "split", ipu, head)]
    if not measured:
        tile_use = {int(r.ipu): float(r.max_tile_utilisation)  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                    for r in ipu_totals(tile_memory).itertuples()} if len(tile_memory) else {}
        out += _split_moves(meta, stages, ops, tile_use, proposed_splits, top, ipu)
    return out


def _sharded_advice(meta: dict[str, Any], where: str, top: int, load: float) -> Advice:
    """Sharded execution runs one IPU at a time (docs/reference: one shard after
    another), so the step is the sum of the shards: a heavier shard does not make the
    others wait longer than they would anyway, and moving splits does not shorten the
    step. What does is running the shards at once: pipelining."""
    # what fills a pipeline: micro-batches accumulated in training, batches a host call
    # runs (device iterations) in inference, which has no gradients
    fill = "gradient accumulation" if (meta.get("options") or {}).get("training", True) \
        is not False else "device iterations"
    return Advice("info", "split", None, (
        f"Sharded: the IPUs take turns, so the step is the sum of the shards' times; "
        f"stage {top} on {where}, at {load:.2f}x the mean, holds no other IPU back, and "
        "moving splits balances memory, not time. To run the shards at once, "
        f"pipeline them (--strategy pipelined, with {fill} to fill the pipeline)."))


def _ipu_balance_advice(meta: dict[str, Any], stages: pd.DataFrame, measured: bool
                        ) -> list[Advice]:
    """The bottleneck IPU, its stages' busy cycles summed; no split plan (the split
    search moves layers between neighbouring stages, each on its own IPU)."""
    ipu, load = ipu_imbalance(stages)
    if load < IMBALANCE_LIMIT:
        return []
    words = naming_of(MEASURED_KIND if measured else MODELLED_KIND, meta)  # meta's words win
    own = sorted(int(s) for s in stages.loc[stages["ipu"] == ipu, "stage"])
    return [Advice("warning", "split", ipu, (
        f"{words.label(ipu)} is the bottleneck: {load:.2f}x the mean busy load of all "
        f"{words.devices} (its stages {own} run in turn). Move layers off it; stages that "
        f"come back to an earlier {words.device} get no split plan here: try `popviz tune`."))]


def _bubble_advice(meta: dict[str, Any], stages: pd.DataFrame) -> list[Advice]:
    """Bubbles amortised by more micro-batches per pipeline fill: gradient accumulation
    in training; in inference, which has no gradients to accumulate, the batches each host
    call pipelines (device iterations x gradient accumulation, as compiled)."""
    options = meta.get("options") or {}
    bal = stage_balance(stages)
    if stages_take_turns(bal) or \
            options.get("strategy", "pipelined") != "pipelined":
        return []
    bubble = stage_idle_fraction(stages)
    accumulation = int(options.get("gradient_accumulation", 1) or 1)
    need = 4 * len(bal)
    if options.get("training", True) is False:
        iterations = int(options.get("device_iterations", 1) or 1)
        filled = accumulation * iterations
        if bubble < BUBBLE_LIMIT or filled >= need:
            return []
        return [Advice("warning", "accumulation", None, (
            f"{bubble:.0%} of the step is idle in pipeline bubbles: each host call pipelines "
            f"{filled} batch(es) through {len(bal)} stages. Raise device iterations (now "
            f"{iterations}) to at least {-(-need // accumulation)}, so that a call runs "
            f"{need} or more batches and the ramp-up and ramp-down are amortised (latency "
            "per batch stays; throughput rises)."))]
    if bubble < BUBBLE_LIMIT or accumulation >= need:
        return []
    return [Advice("warning", "accumulation", None,
                   f"{bubble:.0%} of the step is idle in pipeline bubbles: raise gradient "
                   f"accumulation (now {accumulation}) to at least {need} to amortise "
                   "the ramp-up and ramp-down.")]


def _one_device_advice(stages: pd.DataFrame, measured: bool) -> list[Advice]:
    """A measured run on one device has no balance to judge; its idle share says whether
    the device or the host sets the pace (many short kernels with gaps between: launch- or
    host-bound)."""
    if not measured or stages.empty or stages["ipu"].nunique() != 1:
        return []
    idle = stage_idle_fraction(stages)
    where = naming_of(MEASURED_KIND).label(int(stages["ipu"].iloc[0]))
    if idle < BUBBLE_LIMIT:
        return [Advice("info", "ok", None, f"One device ({where}), so no balance between "
                       f"devices to judge; it is busy {1 - idle:.0%} of the step.")]
    return [Advice("warning", "idle", int(stages["ipu"].iloc[0]), (
        f"{where.capitalize()} is idle {idle:.0%} of the step: it computes only "
        f"{1 - idle:.0%} of the time, so the step is launch- or host-bound (Python, "
        "kernel launches, data loading between kernels), not device-bound. The trace "
        "shows the gaps; fewer, larger kernels (a bigger micro-batch, torch.compile or "
        "CUDA graphs) or a faster input pipeline close them. With one device there is "
        "no stage balance to judge."))]


def _multi_pass_ops(ops: pd.DataFrame) -> pd.Series | None:
    """Per IPU: ops the cost model splits into extra serial passes (the only cycles a
    higher availableMemoryProportion can save); None when the ops table cannot tell."""
    if ops.empty or not {"passes", "ipu"} <= set(ops.columns):
        return None
    return (ops["passes"] > 1).groupby(ops["ipu"]).sum()


def _headroom_advice(meta: dict[str, Any], tile_memory: pd.DataFrame,
                     ops: pd.DataFrame, steps: Callable[[], Any]) -> list[Advice]:
    if tile_memory.empty or not oom_tiles(tile_memory).empty:
        return []
    multi_pass = _multi_pass_ops(ops)
    out = []
    for row in ipu_totals(tile_memory).itertuples():
        amp = amp_for(meta, int(row.ipu))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
        if row.max_tile_utilisation >= TILE_AMBER:  # type: ignore[arg-type, operator]  # pandas-stubs: a cell is any scalar
            # fits, but with no room: amber, never "nothing to change"
            out.append(Advice("warning", "memory", int(row.ipu),  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                              f"{ipu_label(row.ipu)} fits with little headroom: the fullest "
                              f"tile is {row.max_tile_utilisation:.0%} used. A larger batch, "
                              "more layers or a higher availableMemoryProportion there will "
                              "not fit; lower the AMP or move layers off it first."))
        if row.max_tile_utilisation >= NEARLY_FULL or amp >= DEFAULT_AMP:  # type: ignore[arg-type, operator]  # pandas-stubs: a cell is any scalar
            continue
        if knows(steps(), int(row.ipu)):  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
            # re-planned: name the nearest higher AMP that changes a plan, if any does
            effect = amp_effect(steps(), int(row.ipu), lower=False)  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
            if effect is not None:
                out.append(Advice("info", "amp", int(row.ipu),  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                                  f"{ipu_label(row.ipu)}: the fullest tile is only "
                                  f"{row.max_tile_utilisation:.0%} used; raise "
                                  f"availableMemoryProportion {effect_words(amp, effect)}."))
            continue
        if multi_pass is None:
            why = "may save cycles."
        else:
            # no op in extra passes there: a higher AMP changes no modelled cycle
            n = int(multi_pass.get(int(row.ipu), 0))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
            if n == 0:
                continue
            why = (f"would let {n} convolution / matmul op{'s' if n > 1 else ''} run in "
                   "fewer serial passes.")
        out.append(Advice("info", "amp", int(row.ipu),  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                          f"{ipu_label(row.ipu)}: the fullest tile is only "
                          f"{row.max_tile_utilisation:.0%} used; raising "
                          f"availableMemoryProportion from {amp:g} toward "
                          f"{DEFAULT_AMP:g} {why}"))
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
           ops: pd.DataFrame | None = None, measured: bool | None = None,
           exchange: pd.DataFrame | None = None,
           proposed_splits: list[str] | None = None) -> list[Advice]:
    """Every piece of advice for one profile, most urgent first. A measured profile
    (meta kind, unless `measured` says) is worded in ranks and time, not IPUs and cycles.
    `exchange` (the transfers table) tells host I/O apart from IPU-to-IPU exchange;
    `proposed_splits` (the tune search's best plan, from popviz.advise) replaces the
    balanced split of the stored per-layer costs."""
    if measured is None:
        measured = naming_of(meta).measured
    options = meta.get("options") or {}
    splits = [str(s) for s in (options.get("splits") or [])]
    recomputation = bool(options.get("recomputation", False))
    ops = ops if ops is not None else pd.DataFrame()
    known: dict[str, Any] = {}

    def steps() -> Any:  # re-planned at each AMP step only when an AMP advice needs it
        if "steps" not in known:
            known["steps"] = amp_steps(ops, meta)
        return known["steps"]

    out = _oom_advice(meta, stages, tile_memory, splits, recomputation, steps)
    out += _balance_advice(meta, stages, tile_memory, ops, exchange, measured, proposed_splits)
    out += _bubble_advice(meta, stages)
    out += _one_device_advice(stages, measured)
    out += [Advice(*a) for a in micro_batch_advice(meta, stages)]
    out += _headroom_advice(meta, tile_memory, ops, steps)
    out += _amp_ignored_advice(ops)
    out += _shared_parameter_advice(meta)
    if not out:
        # a measured run has no tile data: whether it fits is unknown, not "fits"
        fitting = fits(tile_memory)
        if stages.empty or stages["ipu"].nunique() < 2:  # one device: no balance to judge
            text = ("Fits on one device" if fitting else "One device") + \
                ": no stages to balance, nothing to change."
        else:
            fit = "Fits, and the stages" if fitting else "The stages"
            text = f"{fit} are balanced within {IMBALANCE_LIMIT - 1:.0%}: nothing to change."
        out.append(Advice("info", "ok", None, text))
    return out
