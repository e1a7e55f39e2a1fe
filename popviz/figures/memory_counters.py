"""A measured run's allocated memory over time, per rank, from the liveness table its
trace's own memory events made (torch.profiler's [memory] events: the caching allocator's
allocated bytes after each allocation and free): what /memory shows for an import without
a CUDA memory snapshot. Each rank's curve keeps every peak however long the run (the
largest value of each of at most MAX_POINTS buckets), and its peak is marked."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from popviz.figures.style import empty_figure
from popviz.vocab import Naming

MAX_POINTS = 4000  # per rank


def _bucket_max(t: np.ndarray, y: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `points` (time, value) pairs: each bucket's largest value, at its time."""
    if len(t) <= points:
        return t, y
    edges = np.linspace(0, len(t), points + 1).astype(np.int64)
    keep = np.array([a + int(np.argmax(y[a:b])) for a, b in itertools.pairwise(edges)
                     if b > a])
    return t[keep], y[keep]


def allocated_over_time(liveness: pd.DataFrame, naming: Naming) -> go.Figure:
    """One line per rank of allocated MiB against time (ns from the run's start), its peak
    starred."""
    title = f"Allocated memory per {naming.device} (the trace's memory events)"
    if liveness.empty or "time" not in liveness.columns:
        return empty_figure("This run's trace has no memory events.", title)
    fig = go.Figure()
    peaks = {}
    palette = plotly.colors.qualitative.Plotly
    ordered = liveness.sort_values(["ipu", "time"], kind="stable").groupby("ipu")
    for k, (ipu, rows) in enumerate(ordered):
        colour = palette[k % len(palette)]  # a rank's star in its line's colour
        t = rows["time"].to_numpy(np.float64)
        y = (rows["always_live_bytes"] + rows["not_always_live_bytes"]).to_numpy(np.float64)
        at = int(np.argmax(y))
        peaks[int(ipu)] = float(y[at])  # type: ignore[arg-type]  # pandas-stubs: a label is any scalar
        tx, ty = _bucket_max(t, y, MAX_POINTS)
        label = naming.label(ipu)
        fig.add_trace(go.Scattergl(x=tx, y=ty / 2**20, mode="lines", name=label,
                                   line={"shape": "hv", "color": colour}, legendgroup=label,
                                   hovertemplate=f"{label}<br>%{{x:,.0f}} ns<br>"
                                   "%{y:,.1f} MiB<extra></extra>"))
        fig.add_trace(go.Scatter(x=[t[at]], y=[y[at] / 2**20], mode="markers",
                                 marker={"symbol": "star", "size": 12, "color": colour},
                                 legendgroup=label,
                                 showlegend=False, name=f"{label} peak",
                                 hovertemplate=f"{label} peak<br>%{{y:,.1f}} MiB at "
                                 "%{x:,.0f} ns<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="time (ns)", yaxis_title="MiB allocated",
                      meta={"peaks": peaks}, height=380)
    return fig


__all__ = ["MAX_POINTS", "allocated_over_time"]
