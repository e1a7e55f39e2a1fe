"""The program tree as an icicle (a flame view turned on its side): model at the left,
then blocks, layers and ops; each box as wide as its cycles, coloured by the stage (IPU)
its ops ran on. Built from `popviz.analysis.program_tree`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.figures.style import base_layout, empty_figure
from popviz.units import fmt_bytes, known_or
from popviz.vocab import Naming

# one hue per stage (no red: red means out of memory / capacity); several stages: grey
STAGE_COLOURS = ["#3b75af", "#ef8636", "#519e3e", "#8e6bbf", "#17becf", "#bcbd22",
                 "#8d6e63", "#e377c2"]
MIXED = "#9aa5b1"


def stage_colour(stages: str) -> str:
    """The colour of a node from its stages ('2' -> stage 2's hue; '0-1' -> grey)."""
    text = str(stages)
    if text.isdigit():
        return STAGE_COLOURS[int(text) % len(STAGE_COLOURS)]
    return MIXED


def _flops(value: float) -> str:
    for name, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= size:
            return f"{value / size:,.2f} {name}"
    return f"{value:,.0f} FLOP"


def starts_text(stages: str, stage_starts: dict[int, str]) -> str:
    """'stage 1 starts at block2c' for a node's stages ('1', '0-2', '0, 3')."""
    text = str(stages)
    if not text or not stage_starts:
        return ""
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        got = list(range(lo, hi + 1))
    else:
        got = [int(x) for x in text.split(",") if x.strip().isdigit()]
    named = [f"stage {s} starts at {stage_starts[s]}" for s in got if stage_starts.get(s)]
    return "; ".join(named)


def _label(name: str, layers: str, kind: str) -> str:
    """A module's box: its name, with its split name when it runs exactly one that
    differs ('3 · block2b')."""
    if kind != "module" or not layers or "…" in layers or layers == name:
        return name
    return f"{name} · {layers}"


def program_tree_figure(tree: pd.DataFrame, naming: Naming | None = None,
                        selected: str | None = None, max_depth: int = 4,
                        title: str = "Program tree", per_step: str = "",
                        stage_starts: dict[int, str] | None = None) -> go.Figure:
    """Icicle of `tree` (analysis.program_tree), box width = cycles (ns when measured),
    siblings in program order. `per_step` says what the widths add up to when the tree
    was built per step ('1,024 micro-batches and 1 weight update'); without it they are
    the recorded ops' (one micro-batch's, and the hover says so). `stage_starts` (stage
    -> its first split name) names where each node's stage begins. `selected` is a node
    id to open the view on; `max_depth` levels show at once (click a box to go deeper)."""
    naming = naming or Naming()
    if tree.empty or float(tree["cycles"].max()) <= 0:
        return empty_figure("No op costs recorded in this profile, so no program tree.",
                            title)
    unit = naming.unit
    share = tree["cycles"] / float(tree.loc[tree["id"] == "model", "cycles"].iloc[0])
    device = "stage" if naming.has_tiles else f"stage ({naming.device})"
    custom = np.empty((len(tree), 10), dtype=object)
    custom[:, 0] = tree["kind"].to_numpy()
    custom[:, 1] = share.to_numpy()
    custom[:, 2] = [known_or(v, _flops) for v in tree["flops"]]
    custom[:, 3] = [known_or(v, fmt_bytes) for v in tree["bytes_written"]]
    custom[:, 4] = [known_or(v, fmt_bytes) for v in tree["temp_bytes"]]
    custom[:, 5] = tree["stages"].astype(str).to_numpy()
    custom[:, 6] = tree["ops"].to_numpy()
    custom[:, 7] = [f"F {f:,.0f} · B {b:,.0f} · R {r:,.0f} · WU {w:,.0f}" for f, b, r, w in
                    zip(tree["forward_cycles"], tree["backward_cycles"],
                        tree["recompute_cycles"], tree["optimiser_cycles"], strict=True)]
    layers = tree["layers"].astype(str) if "layers" in tree else pd.Series("", index=tree.index)
    custom[:, 8] = [f"split names {v}" if v else "no split names" for v in layers]
    custom[:, 9] = [starts_text(v, stage_starts or {}) or "-" for v in tree["stages"]]
    whole = (f"of the step's compute ({per_step})" if per_step else
             "of the recorded ops' compute (one step)" if naming.in_ns else
             "of one micro-batch's compute (each op once, the optimiser once)")
    hover = ("<b>%{id}</b> (%{customdata[0]}) · %{customdata[8]}<br>"
             f"%{{value:,.0f}} {unit} · %{{customdata[1]:.1%}} {whole}<br>"
             f"by pass ({unit}): %{{customdata[7]}}<br>"
             "FLOPs %{customdata[2]} · written %{customdata[3]} · largest temporary "
             f"%{{customdata[4]}}<br>{device} %{{customdata[5]}} · %{{customdata[6]:,}} ops"
             " · %{customdata[9]}<extra></extra>")
    names = [_label(n, v, k) for n, v, k in zip(tree["name"], layers, tree["kind"],
                                                strict=True)]
    fig = go.Figure(go.Icicle(
        ids=tree["id"], labels=names, parents=tree["parent"],
        values=tree["cycles"], branchvalues="total", customdata=custom,
        hovertemplate=hover, maxdepth=max_depth, level=selected or None,
        marker={"colors": [stage_colour(s) for s in tree["stages"]],
                "line": {"width": 0.5, "color": "white"}},
        tiling={"orientation": "h"}, sort=False,
        texttemplate="%{label}<br>%{customdata[1]:.1%}", pathbar={"visible": True}))
    base_layout(fig, title, height=620)
    fig.update_layout(margin={"l": 10, "r": 10, "t": 50, "b": 10}, uirevision="tree")
    return fig
