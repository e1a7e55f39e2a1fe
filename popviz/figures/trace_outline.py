"""The op a link points at (`&op=`), outlined on /trace at any zoom: a box around each
place it runs, never narrower than MIN_FRACTION of the window (an op of zero cycles is a
point, and a box of zero width is not drawn at all); zoomed out past the op level, a
marker in the op lane for each of MARKER_COLUMNS columns of the window it runs in."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.figures.trace import HIGHLIGHT
from popviz.vocab import Naming

MIN_FRACTION = 0.004  # a few pixels of any window: an outline is never thinner
MARKER_COLUMNS = 120  # zoomed out: at most this many markers per lane, apart


def widened(start: np.ndarray, end: np.ndarray, lo: float, hi: float,
            fraction: float = MIN_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """(base, width) of boxes around [start, end], each at least `fraction` of [lo, hi]
    wide, about its centre."""
    width = np.maximum(end - start, fraction * (hi - lo))
    return (start + end) / 2 - width / 2, width


def op_outline(places: pd.DataFrame, lo: float, hi: float, row_of: dict, naming: Naming,
               name: str, boxes: bool, height: float) -> list[go.Scatter | go.Bar]:
    """The outline of one op's `places` (ipu, start, end: trace_detail.op_occurrences) in
    the op lane. `boxes`: the op level is drawn (each place boxed); else one marker per
    column (MARKER_COLUMNS across the window) the op runs in."""
    places = places[[(int(i), "ops") in row_of for i in places["ipu"]]]
    if places.empty:
        return []
    rows = np.array([row_of[(int(i), "ops")] for i in places["ipu"]])
    start, end = places["start"].to_numpy(float), places["end"].to_numpy(float)
    unit = naming.unit
    if boxes:
        base, width = widened(start, end, lo, hi)
        custom = np.stack([start, end, end - start], axis=1)
        return [go.Bar(
            name=f"{name} (selected op)", orientation="h", y=rows, base=base, x=width,
            width=height, marker={"color": "rgba(0,0,0,0)",
                                  "line": {"width": 3, "color": HIGHLIGHT}},
            customdata=custom, cliponaxis=True, showlegend=False,
            hovertemplate=(f"<b>{name}</b> (selected op)<br>%{{customdata[0]:,.0f}} → "
                           f"%{{customdata[1]:,.0f}} {unit} (duration "
                           f"%{{customdata[2]:,.0f}} {unit})<extra></extra>"))]
    # zoomed out: the places merged per column, so a run of 1,024 passes is at most a
    # hundred and twenty markers, apart
    column = np.floor((start + end) / 2 - lo) // max((hi - lo) / MARKER_COLUMNS, 1e-12)
    frame = pd.DataFrame({"row": rows, "column": column, "at": (start + end) / 2})
    merged = frame.groupby(["row", "column"], sort=True).agg(
        at=("at", "first"), n=("at", "size")).reset_index()
    # in the legend: the markers say what they are where the op's own bar is not drawn
    return [go.Scatter(
        name=f"{name} (selected op; zoom in to see it)", x=merged["at"], y=merged["row"],
        mode="markers", marker={"symbol": "diamond", "size": 8, "color": HIGHLIGHT,
                                "line": {"width": 1, "color": "#222"}},
        customdata=merged["n"], showlegend=True, cliponaxis=True,
        hovertemplate=(f"<b>{name}</b> (selected op) runs here (%{{customdata}} time(s)) "
                       f"around %{{x:,.0f}} {unit}; zoom in to see it<extra></extra>"))]


__all__ = ["MIN_FRACTION", "op_outline", "widened"]
