"""The comparison's result: the `Comparison` of aligned delta frames, how a delta frame is
made (`deltas`: b - a and b / a of the sides' own figures) and how its figures read as text.

Kept apart from `build` so that `verdict` can read a `Comparison` without importing the code
that assembles one (the old compare <-> compare_verdict import circle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from popviz.jsonsafe import jsonable as _plain

DELTA_COLUMNS = ["a", "b", "delta", "ratio"]


@dataclass
class Comparison:
    """Aligned tables of two profiles, A and B, and the verdict.

    Delta frames share the columns `a, b, delta (= b - a), ratio (= b / a, NaN if a == 0)`;
    a figure missing on one side is NaN there (and so are its delta and ratio)."""

    sides: pd.DataFrame        # one row per side: name, kind, target, IPUs, options, fits
    metrics: pd.DataFrame      # metric, unit, better ('higher'|'lower'|''), a, b, delta, ratio
    time_per_sample: pd.DataFrame  # category, unit (us), a, b, delta, ratio, share_of_delta
    ipus: pd.DataFrame         # ipu, metric, unit, a, b, delta, ratio
    stages: pd.DataFrame       # stage, metric, unit, a, b, delta, ratio
    op_classes: pd.DataFrame   # op_class, phase, unit (us per sample), a, b, delta, ratio
    liveness: pd.DataFrame     # side, ipu, step, x (0..1 progress), phase, *_bytes
    tiles: pd.DataFrame        # side, ipu, tile, total_bytes, capacity_bytes, utilisation
    phase_x: dict[str, float] = field(default_factory=dict)  # anchor phase -> common x
    verdict: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe facts (what `popviz compare --json` prints); big curves left out."""
        def rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
            clean = frame.astype(object).where(frame.notna(), None)
            return [{str(k): _plain(v) for k, v in r.items()} for r in clean.to_dict("records")]
        return {"sides": rows(self.sides), "metrics": rows(self.metrics),
                "time_per_sample": rows(self.time_per_sample), "ipus": rows(self.ipus),
                "stages": rows(self.stages), "op_classes": rows(self.op_classes),
                "liveness_phase_x": _plain(self.phase_x), "verdict": _plain(self.verdict)}


def format_value(value: Any, unit: str) -> str:
    """A figure of a delta frame as text, in its unit ('-' when absent)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    value = float(value)
    if unit == "bytes":
        for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= size:
                return f"{value / size:,.1f} {name}"
        return f"{value:,.0f} B"
    if unit.startswith("fraction"):
        return f"{value:.1%}"
    if abs(value) >= 100 or value.is_integer():
        return f"{value:,.0f}"
    return f"{value:,.3g}" if abs(value) < 1 else f"{value:,.2f}"


def format_ratio(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{float(value):.2f}x"


def deltas(a: pd.Series, b: pd.Series) -> pd.DataFrame:
    """Outer-aligned a, b, delta = b - a and ratio = b / a (NaN where a is 0 or missing)."""
    frame = pd.concat([a.rename("a"), b.rename("b")], axis=1).astype(float)
    frame["delta"] = frame["b"] - frame["a"]
    frame["ratio"] = frame["b"] / frame["a"].where(frame["a"] != 0)
    return frame


__all__ = ["DELTA_COLUMNS", "Comparison", "deltas", "format_ratio", "format_value"]
