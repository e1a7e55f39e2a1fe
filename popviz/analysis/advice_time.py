"""Advice on time: stages out of balance (which split to move, or that sharded ranks
take turns), bubbles, one device mostly waiting, and shared parameters' exchange."""

from __future__ import annotations

from typing import Any

import pandas as pd

from popviz.analysis.advice_base import Advice, KiB
from popviz.analysis.balance import (
    UNTRACED,
    imbalance,
    ipu_imbalance,
    is_sharded,
    returns_to_an_ipu,
    stage_balance,
    stages_take_turns,
)
from popviz.analysis.memory import ipu_totals
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
from popviz.metrics import stage_idle_fraction
from popviz.vocab import (
    BUBBLE_LIMIT,
    IMBALANCE_LIMIT,
    MEASURED_KIND,
    MODELLED_KIND,
    TILE_AMBER,
    ipu_label,
    naming_of,
)

# a measured bottleneck's untraced share of its step past this is said beside its busy
# time's split (a CPU rank's Python between ops: 46% of the bundled tutorial's rank 0)
UNTRACED_WORTH_SAYING = 0.10


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


def balance_advice(meta: dict[str, Any], stages: pd.DataFrame, tile_memory: pd.DataFrame,
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
            f"({_pct(shares)} of its busy time).")
    untraced = float(row.get(UNTRACED, 0.0) or 0.0) / float(row["total_cycles"] or 1.0)
    if measured and untraced > UNTRACED_WORTH_SAYING:  # what no event covers: not work
        head += (f" That busy time is {float(row['busy_fraction']):.0%} of its step; "
                 f"{untraced:.0%} is untraced (host time between traced ops).")
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


def bubble_advice(meta: dict[str, Any], stages: pd.DataFrame) -> list[Advice]:
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


def one_device_advice(stages: pd.DataFrame, measured: bool) -> list[Advice]:
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


def shared_parameter_advice(meta: dict[str, Any]) -> list[Advice]:
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
