"""`popviz compare A B --ops`: the op-by-op table (analysis.compare.ops) as text."""

from __future__ import annotations

import argparse
import math
from typing import Any

from popviz.analysis.compare import format_ratio, format_value
from popviz.analysis.compare.ops import GROUP_BY, PER, OpDiff
from popviz.argtypes import non_negative_int
from popviz.figures.compare_ops import time_unit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("op by op (--ops)")
    group.add_argument("--ops", action="store_true",
                       help="print A vs B time, calls and memory per op group instead, "
                       "largest time difference first")
    group.add_argument("--by", choices=list(GROUP_BY), default="op",
                       help="group ops by op type, op class, module or pass (default: op)")
    group.add_argument("--depth", type=int, default=1, metavar="N",
                       help="module levels kept with --by module (default: 1)")
    group.add_argument("--per", choices=list(PER), default="auto",
                       help="time and bytes written per step of one replica, or per "
                       "sample (default auto: per sample when the two runs' steps hold "
                       "different numbers of samples)")
    group.add_argument("--top", type=non_negative_int, default=20, metavar="N",
                       help="rows printed (default: 20; 0 = all); --json gives all")


def _cell(value: Any, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format_value(float(value) * scale, "")


def render_ops(diff: OpDiff, top: int, terms: list[str] | None = None) -> str:
    scale, unit = time_unit(diff.per)
    frame = diff.table if top <= 0 else diff.table.head(top)
    head = [GROUP_BY[diff.by], f"A {unit}", f"B {unit}", "B - A", "B / A", "A calls",
            "B calls", "A temp", "B temp"]
    rows = [[str(r["group"]), _cell(r["a_seconds"], scale), _cell(r["b_seconds"], scale),
             _cell(r["delta_seconds"], scale), format_ratio(r["ratio"]),
             _cell(r["a_count"]), _cell(r["b_count"]),
             format_value(r["a_temp_bytes"], "bytes"), format_value(r["b_temp_bytes"], "bytes")]
            for _, r in frame.iterrows()]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
    depth = f" (depth {diff.depth})" if diff.by == "module" else ""
    out = [f"A: {diff.names[0]}", f"B: {diff.names[1]}"]
    if terms:
        out.append("Not like for like: " + "; ".join(terms) + (
            ". Times are per sample." if diff.per == "sample" else "."))
    out += ["",
           f"Op time by {GROUP_BY[diff.by]}{depth}, {unit}; calls per step; temp = largest "
           "temporary of one op. Largest |B - A| first; '-' = not run on that side.",
           line(head), *(line(r) for r in rows)]
    shown = len(frame)
    if shown < len(diff.table):
        out.append(f"  ... {len(diff.table) - shown} more (--top 0 prints all)")
    out.append(f"  total: A {_cell(diff.totals['a_seconds'], scale)}, "
               f"B {_cell(diff.totals['b_seconds'], scale)} {unit}")
    return "\n".join(out)
