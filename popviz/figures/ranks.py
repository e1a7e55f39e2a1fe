"""A job's ranks as a heat map: one row per rank (ordered by stage, then rank), one column
per part of the step (compute, communication, host, waiting, untraced), the share of the
step as the colour; a straggler's row says how late it is. One trace whatever the number
of ranks, so 1,024 ranks draw as fast as 4."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.analysis.ranks import PARTS
from popviz.figures.style import empty_figure
from popviz.vocab import Naming

PART_TITLES = {"compute": "compute", "exchange": "communication", "host_io": "host I/O",
               "waiting": "waiting", "untraced": "untraced"}
ROW_PX, MIN_PX, MAX_PX = 18, 260, 900


def rank_heatmap(shares: pd.DataFrame, late: pd.DataFrame, naming: Naming) -> go.Figure:
    """`shares` (analysis.ranks.rank_shares) as rows of a heat map; `late` (stragglers)
    marked on their rows."""
    title = f"Share of the step per {naming.device}"
    if shares.empty:
        return empty_figure("This profile has no trace events.", title)
    slow = {int(r["ipu"]): r for r in late.to_dict("records")}
    labels = [(f"{naming.label(i)} · stage {s}" if s >= 0 else naming.label(i))
              + (f" · late +{float(slow[int(i)]['over']):.0%}" if int(i) in slow else "")
              for i, s in zip(shares.index, shares["stage"], strict=True)]
    z = np.column_stack([shares[f"{p}_share"].to_numpy(np.float64) for p in PARTS])
    times = np.column_stack([shares[p].to_numpy(np.float64) for p in PARTS])
    fig = go.Figure(go.Heatmap(
        z=z, x=[PART_TITLES[p] for p in PARTS], y=labels, zmin=0.0, zmax=1.0,
        colorscale="Blues", colorbar={"title": {"text": "share"}, "tickformat": ".0%"},
        customdata=times, hovertemplate=("%{y}<br>%{x}: %{z:.1%} of the step, "
                                         f"%{{customdata:,.0f}} {naming.unit}<extra></extra>")))
    height = int(min(MAX_PX, max(MIN_PX, ROW_PX * len(labels) + 120)))
    fig.update_layout(title=title, height=height, margin={"l": 200, "r": 40},
                      yaxis={"autorange": "reversed", "type": "category"},
                      meta={"ranks": len(labels), "stragglers": sorted(slow)})
    return fig


__all__ = ["PART_TITLES", "rank_heatmap"]
