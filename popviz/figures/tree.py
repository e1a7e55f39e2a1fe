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


def program_tree_figure(tree: pd.DataFrame, naming: Naming | None = None,
                        selected: str | None = None, max_depth: int = 4,
                        title: str = "Program tree") -> go.Figure:
    """Icicle of `tree` (analysis.program_tree), box width = cycles (ns when measured).
    `selected` is a node id to open the view on; `max_depth` levels show at once (click a
    box to go deeper)."""
    naming = naming or Naming()
    if tree.empty or float(tree["cycles"].max()) <= 0:
        return empty_figure("No op costs recorded in this profile, so no program tree.",
                            title)
    unit = naming.unit
    share = tree["cycles"] / float(tree.loc[tree["id"] == "model", "cycles"].iloc[0])
    device = "stage" if not naming.measured else "stage (rank)"
    custom = np.empty((len(tree), 8), dtype=object)
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
    hover = ("<b>%{id}</b> (%{customdata[0]})<br>"
             f"%{{value:,.0f}} {unit} · %{{customdata[1]:.1%}} of the step's compute<br>"
             f"by pass ({unit}): %{{customdata[7]}}<br>"
             "FLOPs %{customdata[2]} · written %{customdata[3]} · largest temporary "
             f"%{{customdata[4]}}<br>{device} %{{customdata[5]}} · %{{customdata[6]:,}} ops"
             "<extra></extra>")
    fig = go.Figure(go.Icicle(
        ids=tree["id"], labels=tree["name"], parents=tree["parent"],
        values=tree["cycles"], branchvalues="total", customdata=custom,
        hovertemplate=hover, maxdepth=max_depth, level=selected or None,
        marker={"colors": [stage_colour(s) for s in tree["stages"]],
                "line": {"width": 0.5, "color": "white"}},
        tiling={"orientation": "h"}, sort=False,
        texttemplate="%{label}<br>%{customdata[1]:.1%}", pathbar={"visible": True}))
    base_layout(fig, title, height=620)
    fig.update_layout(margin={"l": 10, "r": 10, "t": 50, "b": 10}, uirevision="tree")
    return fig
