"""A measured run's allocated memory over time, per rank, from the liveness table its
trace's own memory events made (torch.profiler's [memory] events: the caching allocator's
allocated bytes after each allocation and free): what /memory shows for an import without
a CUDA memory snapshot. Each rank's curve keeps every peak however long the run (the
largest value of each of at most MAX_POINTS buckets), and its peak is marked. A job of
more than MAX_LINES ranks draws the MAX_LINES with the highest peak as lines and every
rank as one band (the least and the most any rank held, on a common time grid): 1,024
lines and their legend took Chromium 44 s to draw."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from popviz.figures.style import base_layout, empty_figure
from popviz.vocab import Naming

MAX_POINTS = 4000  # per rank
MAX_LINES = 16  # ranks drawn as lines; a job of more adds the band of all of them
BAND_POINTS = 1000  # the band's common time grid


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
    peaks: dict[int, float] = {}
    palette = plotly.colors.qualitative.Plotly
    ordered = liveness.sort_values(["ipu", "time"], kind="stable")
    series = {int(ipu): (rows["time"].to_numpy(np.float64),  # type: ignore[arg-type]  # pandas-stubs: a label is any scalar
                         (rows["always_live_bytes"] + rows["not_always_live_bytes"])
                         .to_numpy(np.float64))
              for ipu, rows in ordered.groupby("ipu", sort=True)}
    drawn = sorted(series)
    if len(series) > MAX_LINES:
        fullest = sorted(series, key=lambda i: -float(series[i][1].max()))[:MAX_LINES]
        drawn = sorted(fullest)
        _add_band(fig, series, naming)
        title += (f": the {MAX_LINES} of {len(series):,} with the highest peak, and the band "
                  f"every {naming.device} stays within")
    for k, ipu in enumerate(drawn):
        colour = palette[k % len(palette)]  # a rank's star in its line's colour
        t, y = series[ipu]
        at = int(np.argmax(y))
        peaks[ipu] = float(y[at])
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
    # from 0, as the other memory charts: autorange would start near the run's floor and
    # hide how much of the peak is held all along
    fig.update_layout(xaxis_title="time (ns)", yaxis_title="MiB allocated",
                      yaxis_rangemode="tozero", meta={"peaks": peaks})
    # the other pages' white plot and title, not Plotly's default grey
    return base_layout(fig, title, height=380)


def _add_band(fig: go.Figure, series: dict[int, tuple[np.ndarray, np.ndarray]],
              naming: Naming) -> None:
    """The least and the most every rank held over each of BAND_POINTS time buckets (a
    rank's value holds from one event to its next, as the lines' steps draw it; before its
    first event its trace does not say, so it is left out there)."""
    start = min(float(t[0]) for t, _ in series.values())
    end = max(float(t[-1]) for t, _ in series.values())
    edges = np.linspace(start, end, BAND_POINTS + 1)
    low = np.full(BAND_POINTS, np.inf)
    high = np.full(BAND_POINTS, -np.inf)
    for t, y in series.values():
        # each bucket: the value held at its start and every value set inside it
        at_start = np.searchsorted(t, edges[:-1], side="right") - 1
        held = np.where(at_start >= 0, y[np.maximum(at_start, 0)], np.nan)
        inside = np.searchsorted(edges, t, side="right") - 1
        ok = (inside >= 0) & (inside < BAND_POINTS)
        top = np.where(np.isnan(held), -np.inf, held)
        np.maximum.at(top, inside[ok], y[ok])
        bottom = np.where(np.isnan(held), np.inf, held)
        np.minimum.at(bottom, inside[ok], y[ok])
        high = np.maximum(high, top)
        low = np.minimum(low, bottom)
    mid = (edges[:-1] + edges[1:]) / 2
    low[~np.isfinite(low)] = np.nan  # a bucket before every rank's first event (none)
    high[~np.isfinite(high)] = np.nan
    label = f"all {len(series):,} {naming.devices}"
    fig.add_trace(go.Scatter(x=mid, y=low / 2**20, mode="lines", line={"width": 0},
                               legendgroup="band", showlegend=False, name=f"{label}: least",
                               hovertemplate="least any holds<br>%{y:,.1f} MiB<extra></extra>"))
    fig.add_trace(go.Scatter(x=mid, y=high / 2**20, mode="lines", line={"width": 0},
                               fill="tonexty", fillcolor="rgba(120,120,120,0.25)",
                               legendgroup="band", name=f"{label}: least to most",
                               hovertemplate="most any holds<br>%{y:,.1f} MiB<extra></extra>"))


__all__ = ["MAX_LINES", "MAX_POINTS", "allocated_over_time"]
