"""Advice on memory: a device that does not fit (which knob: AMP, recomputation, a split
moved), headroom AMP could use, and AMP an op ignored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from popviz.analysis.advice_base import Advice, KiB, amp_for
from popviz.analysis.amp import amp_effect, amp_to_fit, effect_words, knows
from popviz.analysis.memory import ipu_totals, oom_tiles
from popviz.vocab import (
    DEFAULT_AMP,
    MIN_AMP,
    NEARLY_FULL,
    TILE_AMBER,
    ipu_label,
)


def _split_after(stages: pd.DataFrame, splits: list[str], stage: int) -> str | None:
    """The split name that starts stage + 1 (the boundary after `stage`)."""
    if 0 <= stage < len(splits):
        return splits[stage]
    if "first_layer" in stages.columns:
        nxt = stages[stages["stage"] == stage + 1]
        if len(nxt):
            return str(nxt["first_layer"].iloc[0])
    return None


def oom_advice(meta: dict[str, Any], stages: pd.DataFrame, tile_memory: pd.DataFrame,
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


def _multi_pass_ops(ops: pd.DataFrame) -> pd.Series | None:
    """Per IPU: ops the cost model splits into extra serial passes (the only cycles a
    higher availableMemoryProportion can save); None when the ops table cannot tell."""
    if ops.empty or not {"passes", "ipu"} <= set(ops.columns):
        return None
    return (ops["passes"] > 1).groupby(ops["ipu"]).sum()


def headroom_advice(meta: dict[str, Any], tile_memory: pd.DataFrame,
                     ops: pd.DataFrame, steps: Callable[[], Any],
                     busiest: int | None = None) -> list[Advice]:
    """A higher AMP where tiles have room. `busiest`: the IPU that sets a pipeline's step
    (None: every IPU's cycles add to it, as a sharded run's do); a saving elsewhere is
    said not to shorten the step."""
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
                                  f"availableMemoryProportion {effect_words(amp, effect)}."
                                  + _not_the_step(int(row.ipu), busiest)))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
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
                          f"{DEFAULT_AMP:g} {why}" + _not_the_step(int(row.ipu), busiest)))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
    return out


def _not_the_step(ipu: int, busiest: int | None) -> str:
    """' IPU1, the busiest, sets the step's pace: the step hardly shortens.' for a
    pipeline's other IPUs: their saved cycles mostly become idle time (only where they
    are the slowest of a superstep, in the fill and drain, do they shorten the step)."""
    if busiest is None or ipu == busiest:
        return ""
    return f" {ipu_label(busiest)}, the busiest, sets the step's pace: the step hardly shortens."


def amp_ignored_advice(ops: pd.DataFrame) -> list[Advice]:
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
