"""A CUDA memory snapshot's allocator (the /memory page of an import with a snapshot): the
live blocks stacked over time, each a band from its alloc to its free (memory_viz's active
memory timeline), and reserved (segments) against allocated bytes, the gap between them
shaded as fragmentation. Times in ms since the first drawn instant."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.analysis.allocations import OTHER, Timeline
from popviz.figures.style import MiB, base_layout, empty_figure, fmt_bytes

PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2",
           "#ff9da6", "#9d755d", "#bab0ac")
OTHER_COLOUR = "#d0d0d0"
PIXELS = 800  # columns the band edges snap to


def _ms(ns: np.ndarray, origin: int) -> np.ndarray:
    return (np.asarray(ns, dtype=np.int64) - origin) / 1e6


def _polygons(rows: pd.DataFrame, origin: int) -> tuple[np.ndarray, np.ndarray]:
    """Each block's step band as one closed outline (upper edge forward, lower edge back),
    outlines separated by gaps (NaN): one trace fills them all (`fill="toself"`)."""
    rows = rows.sort_values(["block", "start"], kind="stable")
    cut = np.flatnonzero(np.diff(rows["block"].to_numpy())) + 1
    a_all, b_all = _ms(rows["start"].to_numpy(), origin), _ms(rows["end"].to_numpy(), origin)
    up_all = rows["upper"].to_numpy(dtype=float) / MiB
    low_all = rows["lower"].to_numpy(dtype=float) / MiB
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    gap = np.array([np.nan])
    for a, b, up, low in zip(np.split(a_all, cut), np.split(b_all, cut),
                             np.split(up_all, cut), np.split(low_all, cut), strict=True):
        xs += [np.column_stack([a, b]).ravel(), np.column_stack([b, a])[::-1].ravel(), gap]
        ys += [np.repeat(up, 2), np.repeat(low[::-1], 2), gap]
    return np.round(np.concatenate(xs), 4), np.round(np.concatenate(ys), 3)


def _on_pixels(bands: pd.DataFrame, window: tuple[int, int], pixels: int) -> pd.DataFrame:
    """Band edges snapped to `pixels` columns over the window: steps narrower than a column
    cannot be seen, and each costs four outline points."""
    lo, hi = window
    step = max((hi - lo) / pixels, 1.0)
    out = bands.copy()
    for c in ("start", "end"):
        out[c] = (lo + np.round((out[c].to_numpy() - lo) / step) * step).astype(np.int64)
    # a block's rows all vanish only when it lives less than a column: keep one column
    short = out.groupby("block")["end"].transform("max") == out.groupby("block")[
        "start"].transform("min")
    out.loc[short, "end"] = out.loc[short, "start"] + int(step)
    return out[out["end"] > out["start"]]


def _hover_rows(bands: pd.DataFrame, width: int) -> np.ndarray:
    """The rows that carry a hover / click point: each block's longest, and every row at
    least 1/`width` of the window long (a pixel's worth at that width)."""
    span = max(int(bands["end"].max() - bands["start"].min()), 1)
    length = (bands["end"] - bands["start"]).to_numpy()
    longest = bands.assign(length=length).groupby("block")["length"].idxmax().to_numpy()
    keep = np.zeros(len(bands), dtype=bool)
    keep[longest] = True
    keep |= length * width >= span
    return np.flatnonzero(keep)


def block_timeline_figure(timeline: Timeline, labels: dict[int, str] | None = None,
                          title: str = "Live blocks over time (allocation order)",
                          pixels: int = PIXELS, origin: int | None = None) -> go.Figure:
    """One band per block (stacked in allocation order; those above a freed block drop),
    the blocks not drawn alone as one grey band beneath. Hover or click anywhere on a band:
    the point under the cursor carries the block id (`customdata`; -1 = the grey band).
    `origin`: the time (ns) at x = 0, by default the window's start. `layout.meta` =
    {"blocks": drawn, "hidden": in the grey band, "origin_ns": origin}."""
    bands = timeline.bands
    if not bands.empty:
        bands = _on_pixels(bands, timeline.window, pixels).reset_index(drop=True)
    if bands.empty:
        return empty_figure("No allocator blocks in this range.", title)
    origin = int(timeline.window[0]) if origin is None else int(origin)
    labels = labels or {}
    fig = go.Figure()
    ids = bands["block"].to_numpy()
    other = bands[ids == OTHER]
    if len(other):
        x, y = _polygons(other, origin)
        fig.add_trace(go.Scatter(x=x, y=y, fill="toself", mode="lines", line={"width": 0},
                                 fillcolor=OTHER_COLOUR, hoverinfo="skip",
                                 name=f"{timeline.hidden:,} smaller blocks"))
    mine = bands[ids != OTHER]
    for c, colour in enumerate(PALETTE):
        rows = mine[mine["block"].to_numpy() % len(PALETTE) == c]
        if rows.empty:
            continue
        x, y = _polygons(rows, origin)
        fig.add_trace(go.Scatter(x=x, y=y, fill="toself", mode="lines",
                                 line={"width": 0.5, "color": "white"}, fillcolor=colour,
                                 hoverinfo="skip", showlegend=False))
    # the bands' centres carry the hover text and the block id that a click sends back
    hover = bands.iloc[_hover_rows(bands, pixels // 3)]
    ids = hover["block"].to_numpy()
    mid_t = _ms((hover["start"].to_numpy() + hover["end"].to_numpy()) // 2, origin)
    mid_y = (hover["lower"].to_numpy(dtype=float) + hover["upper"].to_numpy(dtype=float)) \
        / 2 / MiB
    size = dict(zip(timeline.shown["block"].to_numpy(), timeline.shown["bytes"].to_numpy(),
                    strict=True))
    stack = dict(zip(timeline.shown["block"].to_numpy(), timeline.shown["stack"].to_numpy(),
                     strict=True))
    text = [f"{timeline.hidden:,} smaller blocks" if b == OTHER else
            f"block {b}: {fmt_bytes(int(size[b]))}<br>{labels.get(int(stack[b]), '')}"
            for b in ids]
    fig.add_trace(go.Scattergl(x=np.round(mid_t, 4), y=np.round(mid_y, 3), mode="markers",
                               # a plain list: a numpy array is sent base64-encoded, and
                               # dcc.Graph's clickData then carries no customdata
                               customdata=[int(b) for b in ids],
                               marker={"size": 6, "opacity": 0}, text=text,
                               hovertemplate="%{text}<extra></extra>", showlegend=False,
                               name="blocks"))
    fig.update_xaxes(title_text="time (ms)", range=list(_ms(np.array(timeline.window),
                                                            origin)))
    fig.update_yaxes(title_text="allocated (MiB)", rangemode="tozero")
    base_layout(fig, title, height=460)
    fig.update_layout(hovermode="closest", hoverdistance=40, clickmode="event",
                      meta={"blocks": len(timeline.shown), "hidden": timeline.hidden,
                            "origin_ns": origin})
    return fig


def allocator_state_figure(series: pd.DataFrame, origin: int | None = None,
                           title: str = "Reserved (segments) vs allocated") -> go.Figure:
    """Reserved and allocated bytes over time, the fragmentation (reserved, cached by the
    allocator but holding no live block) shaded between them."""
    if series.empty:
        return empty_figure("No allocator events.", title)
    origin = int(series["time"].iloc[0]) if origin is None else origin
    x = _ms(series["time"].to_numpy(), origin)
    alloc = series["allocated"].to_numpy(dtype=float) / MiB
    reserved = series["reserved"].to_numpy(dtype=float) / MiB
    frag = series["fragmentation"].to_numpy(dtype=float) / MiB
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=alloc, mode="lines", line={"shape": "hv",
                             "color": PALETTE[0]}, name="allocated (live blocks)",
                             fill="tozeroy", fillcolor="rgba(76,120,168,0.35)"))
    fig.add_trace(go.Scatter(x=x, y=reserved, mode="lines", line={"shape": "hv",
                             "color": PALETTE[1]}, name="reserved (segments)",
                             fill="tonexty", fillcolor="rgba(245,133,24,0.18)",
                             customdata=frag, hovertemplate="reserved %{y:,.1f} MiB<br>"
                             "fragmentation %{customdata:,.1f} MiB<extra></extra>"))
    fig.update_xaxes(title_text="time (ms)", range=[float(x[0]), float(x[-1])])
    fig.update_yaxes(title_text="MiB", rangemode="tozero")
    base_layout(fig, title, height=320)
    fig.update_layout(hovermode="x unified", meta={"origin_ns": origin})
    return fig
