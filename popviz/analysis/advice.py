"""Plain-language advice from the facts of one profile: where memory or time goes wrong
and which knob (AMP, split points, recomputation, gradient accumulation) to turn.

Each rule is a small function returning zero or more `Advice` (the memory rules in
advice_memory.py, the time rules in advice_time.py); `advise` runs them in order of
urgency (does not fit, then slow). Thresholds live in popviz.vocab: one set for advice,
cards and figures."""

from __future__ import annotations

from typing import Any

import pandas as pd

from popviz.analysis.advice_base import Advice, amp_for
from popviz.analysis.advice_memory import amp_ignored_advice, headroom_advice, oom_advice
from popviz.analysis.advice_time import (
    balance_advice,
    bubble_advice,
    one_device_advice,
    shared_parameter_advice,
)
from popviz.analysis.amp import amp_steps
from popviz.analysis.balance import ipu_imbalance, is_sharded
from popviz.analysis.gpu_advice import micro_batch_advice
from popviz.metrics import fits
from popviz.vocab import IMBALANCE_LIMIT, naming_of

__all__ = ["Advice", "advise", "amp_for"]


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

    out = oom_advice(meta, stages, tile_memory, splits, recomputation, steps)
    out += balance_advice(meta, stages, tile_memory, ops, exchange, measured, proposed_splits)
    out += bubble_advice(meta, stages)
    out += one_device_advice(stages, measured)
    out += [Advice(*a) for a in micro_batch_advice(meta, stages)]
    pipelined = not stages.empty and stages["ipu"].nunique() > 1 and not is_sharded(meta)
    out += headroom_advice(meta, tile_memory, ops, steps,
                           ipu_imbalance(stages)[0] if pipelined else None)
    out += amp_ignored_advice(ops)
    out += shared_parameter_advice(meta)
    if not out:
        # a measured run has no tile data: whether it fits is unknown, not "fits"
        fitting = fits(tile_memory)
        if stages.empty or stages["ipu"].nunique() < 2:  # one device: no balance to judge
            text = ("Fits on one device" if fitting else "One device") + \
                ": no stages to balance, nothing to change."
        else:
            fit = "Fits, and the stages" if fitting else "The stages"
            text = (f"{fit} are balanced: the busiest is within {IMBALANCE_LIMIT - 1:.0%} "
                    "of the mean, nothing to change.")
        out.append(Advice("info", "ok", None, text))
    return out
