"""`popviz compare` as text and as JSON: the verdict and figures of a Comparison
(analysis.compare), or with --ops the op-by-op table of an OpDiff (analysis.compare.ops)."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from popviz.analysis.compare import Comparison, format_ratio, format_value
from popviz.analysis.compare.ops import GROUP_BY, OpDiff, time_unit
from popviz.reporters.table import aligned
from popviz.vocab import naming_from_words

CLI_IPU_METRICS = ("compute_ms", "idle_ms", "peak_bytes", "oom_tiles")


def _fit_word(fits: object) -> str:
    """A side's fit: unknown (no tiles: measured), fits, or does not fit."""
    if fits is None or fits != fits:  # None, or NaN in a DataFrame cell
        return "fit unknown"
    return "fits" if fits else "DOES NOT FIT"


def _rows(frame: pd.DataFrame, label: str) -> list[list[str]]:
    return [[str(r[label]), str(r["unit"]).replace("bytes", "B"),
             *(format_value(r[c], r["unit"]) for c in ("a", "b", "delta")),
             format_ratio(r["ratio"])] for _, r in frame.iterrows()]


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return aligned(head, rows, right=range(2, len(head)))  # label and unit left


def render_text(comp: Comparison) -> str:
    """The comparison as an aligned terminal table: verdict first, then the figures."""
    v = comp.verdict
    sides = comp.sides
    lines = []
    for _, s in sides.iterrows():
        lines.append(f"{s['side']}: {s['name']}  ({s['kind']}, {s['model'] or 'model ?'} on "
                     f"{s['target']} x{s['num_ipus']} x{s['replicas']} replica(s); "
                     f"{_fit_word(s['fits'])})  {s['path']}")
    ask = " Ask one with --judge total or --judge per-device." \
        if v.get("questions_differ") else ""
    lines += ["", v["headline"] + ask]
    lines += [f"  - {r}" for r in v["reasons"]]
    if v["differences"]:
        lines += ["", "Layout differences (A vs B): " + "; ".join(v["differences"])]
    head = ["", "unit", "A", "B", "B - A", "B / A"]
    # what the sides run on, as each states it (IPU, GPU or rank); a mixed pair: devices
    words = {naming_from_words(str(k), str(u)).device
             for k, u in zip(sides["device_kind"], sides["time_unit"], strict=True)}
    device = words.pop() if len(words) == 1 else "device"
    metrics = comp.metrics
    if device == "GPU":  # no tiles, and time in ns: step_ms says it; metric names say GPU
        metrics = metrics[~metrics["metric"].isin(["oom_tiles", "step_cycles"])]
        metrics = metrics.assign(metric=metrics["metric"].str.replace("ipu", "gpu"))
    lines += ["", "Metrics", *_table(["metric", *head[1:]], _rows(metrics, "metric"))]
    tps = comp.time_per_sample
    tps = tps[(tps["a"] != 0) | (tps["b"] != 0)]
    lines += ["", f"Where the {device} time per sample goes "
              f"(sums to 1e6 / throughput per {device})"]
    lines += _table(["category", *head[1:]], _rows(tps, "category"))
    ipus = comp.ipus
    if len(ipus):
        ipus = ipus[ipus["metric"].isin(CLI_IPU_METRICS)]
        if device == "GPU":
            ipus = ipus[ipus["metric"] != "oom_tiles"]
        prefix = device if device in ("IPU", "GPU") else f"{device} "
        ipus = ipus.assign(key=prefix + ipus["ipu"].astype(str) + " " + ipus["metric"])
        lines += ["", f"Per {device}",
                  *_table([f"{device.lower()} metric", *head[1:]], _rows(ipus, "key"))]
    ops = comp.op_classes.head(8)
    if len(ops):
        ops = ops.assign(key=ops["op_class"] + " " + ops["phase"])
        lines += ["", "Compute per sample by op class (largest differences)"]
        lines += _table(["op class", *head[1:]], _rows(ops, "key"))
    return "\n".join(lines)


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
    depth = f" (depth {diff.depth})" if diff.by == "module" else ""
    out = [f"A: {diff.names[0]}", f"B: {diff.names[1]}"]
    if terms:
        out.append("Not like for like: " + "; ".join(terms) + (
            ". Times are per sample." if diff.per == "sample" else "."))
    out += ["",
           f"Op time by {GROUP_BY[diff.by]}{depth}, {unit}; calls per step; temp = largest "
           "temporary of one op. Largest |B - A| first; '-' = not run on that side.",
           *aligned(head, rows, right=range(1, len(head)))]
    shown = len(frame)
    if shown < len(diff.table):
        out.append(f"  ... {len(diff.table) - shown} more (--top 0 prints all)")
    out.append(f"  total: A {_cell(diff.totals['a_seconds'], scale)}, "
               f"B {_cell(diff.totals['b_seconds'], scale)} {unit}")
    return "\n".join(out)


class CompareText:
    """The comparison as aligned terminal tables: verdict first, then the figures."""

    def render(self, result: Comparison) -> str:
        return render_text(result)


class CompareJson:
    def render(self, result: Comparison) -> str:
        return json.dumps(result.to_dict(), indent=2, sort_keys=True)


class OpsText:
    """The op-by-op table: the `top` largest differences (0: all); `terms` (the
    comparison's not-like-for-like terms) head it."""

    def __init__(self, top: int, terms: list[str] | None = None) -> None:
        self.top, self.terms = top, terms

    def render(self, result: OpDiff) -> str:
        return render_ops(result, self.top, self.terms)


class OpsJson:
    """Every row of the op-by-op table (no --top cut)."""

    def render(self, result: OpDiff) -> str:
        return json.dumps(result.to_dict(), indent=2, sort_keys=True)
