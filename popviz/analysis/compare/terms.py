"""Whether two runs compare on equal terms, and what that does to the verdict.

Two runs that differ in micro-batch, gradient accumulation, precision, target or kind
(modelled vs measured) are not like for like: their step times and totals measure
different work. Only per-sample figures (device time per sample = 1 / throughput per
device) can still decide between them, and only when they differ clearly; a modelled IPU
against a measured CPU run is never a race (a cost model against a wall clock), so it gets
no winner and no "N x faster"."""

from __future__ import annotations

import math
import re
from typing import Any

TERMS = [("kind", "kind"), ("target", "target"), ("micro_batch_size", "micro-batch"),
         ("gradient_accumulation", "gradient accumulation"), ("precision", "precision")]
DECISIVE = 1.25  # per-sample figures decide only when one side is this much faster


def shown(value: Any) -> str:
    """A fact as text; 'unknown' when the profile does not say (None, '' or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return "unknown"
    return str(value)


def unequal_terms(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """['micro-batch 16 vs 4', 'precision 16.32 vs unknown', ...] for the terms the two
    sides' facts differ in."""
    out = []
    for key, label in TERMS:
        va, vb = shown(a.get(key)), shown(b.get(key))
        if va != vb:
            out.append(f"{label} {va} vs {vb}")
    return out


def lead_of(terms: list[str]) -> str:
    """The sentence a headline starts with when the terms differ (a page showing the terms
    elsewhere drops it from the headline rather than say it twice)."""
    return "Not like for like: A and B differ in " + ", ".join(terms) + "."


def on_equal_terms(verdict: dict[str, Any], a: dict[str, Any],
                   b: dict[str, Any]) -> dict[str, Any]:
    """`verdict` (verdict.verdict) with `terms` (what differs) added. When both fit
    and the terms differ, the headline says so first and the winner stands only if
    per-sample figures decide it (a factor of at least DECISIVE, same kind); when only
    one fits (or neither), fitting decides as before."""
    terms = unequal_terms(a, b)
    out = dict(verdict, terms=terms, like_for_like=not terms)
    if not terms:
        return out
    kinds_differ = str(a.get("kind")) != str(b.get("kind"))
    factor = verdict.get("factor_per_ipu") or 1.0
    fits = verdict.get("fits") or {}
    if fits.get("A") != fits.get("B") or not fits.get("A"):
        return out  # fitting decides (or neither fits): the headline says so already
    lead = lead_of(terms)
    if kinds_differ:
        per = verdict.get("per_device") or {}
        known = all(isinstance(per.get(k), (int, float)) and math.isfinite(per[k])
                    for k in ("a", "b"))
        totals = all(isinstance(per.get(k), (int, float)) and math.isfinite(per[k])
                     for k in ("total_a", "total_b"))
        speed = (f" Samples/s per device: A {per['a']:,.1f}, B {per['b']:,.1f}"
                 + (f" (in total A {per['total_a']:,.1f} on {per['devices_a']}, B "
                    f"{per['total_b']:,.1f} on {per['devices_b']})" if totals else "") + "."
                 if known else "")
        out["winner"] = None
        out["headline"] = (f"{lead} A modelled run (the cost model's cycles) and a measured "
                           f"one (wall clock) are not a race: no winner.{speed}")
        # keep where the device time goes, without calling it a win
        out["reasons"] = [re.sub(r"^[AB] is faster per (\w+) because ",
                                 r"Where the \1 time per sample differs: ", r)
                          for r in verdict.get("reasons", []) if "x faster" not in r]
        return out
    if verdict.get("judged_by") == "total" or (verdict.get("winner") is None
                                               and verdict.get("faster_per_ipu")):
        # asked for the job's samples/s (a rate: comparable whatever the step holds), or
        # the two questions have different answers, which the headline gives
        out["headline"] = f"{lead} {verdict['headline']}"
        return out
    if verdict.get("faster_per_ipu") and factor >= DECISIVE:
        out["headline"] = (f"{lead} Per sample {verdict['faster_per_ipu']} is still "
                           f"clearly faster: {verdict['headline']}")
    else:
        out["winner"] = None
        out["headline"] = (f"{lead} No headline winner: per sample the two are within "
                           f"{DECISIVE:.2f}x of each other. {verdict['headline']}")
    return out
