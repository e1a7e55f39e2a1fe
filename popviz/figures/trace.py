"""Execution trace: one row per IPU, events coloured by kind and pass, cycles on x.

Level of detail: when at most `max_events` events are visible every event is its own
segment with full hover; otherwise each IPU row is cut into `pixels` buckets and each
bucket is shared among the categories that ran in it, in proportion to their time but
with a minimum width (a short exchange stays visible), contiguous equal segments merged.
The app rebuilds the figure for the visible range on zoom."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.figures.lod import CATEGORIES, TraceIndex, category_codes, composition_segments
from popviz.figures.style import CATEGORY_COLOURS, CATEGORY_NAMES, base_layout, empty_figure

MAX_EVENTS = 3000
PIXELS = 500  # buckets per IPU row when zoomed out; each holds a few sub-segments


def _bar(name: str, ipus: list[str], base: np.ndarray, width: np.ndarray,
         custom: np.ndarray, hover: str) -> go.Bar:
    return go.Bar(
        name=CATEGORY_NAMES[name], orientation="h", y=ipus, base=base, x=width,
        marker={"color": CATEGORY_COLOURS[name], "line": {"width": 0}}, width=0.72,
        customdata=custom, hovertemplate=hover, legendgroup=name,
    )


def _events(index: TraceIndex, lo: float, hi: float, unit: str) -> list[go.Bar]:
    rows = np.concatenate([index.visible_rows(i, lo, hi) for i in index.ipus])
    ev = index.frame.iloc[np.sort(rows)]
    codes = category_codes(ev)
    hover = ("<b>%{customdata[0]}</b><br>IPU %{customdata[5]} · stage %{customdata[1]} · "
             "micro-batch %{customdata[2]} · pass %{customdata[3]}<br>"
             f"%{{base:,.0f}} → %{{customdata[4]:,.0f}} {unit} "
             f"(%{{x:,.0f}} {unit})<extra>%{{fullData.name}}</extra>")
    bars = []
    for k, name in enumerate(CATEGORIES):
        sel = ev[codes == k]
        if sel.empty:
            continue
        custom = np.stack([
            sel["op"].astype(str).to_numpy() if "op" in sel else np.full(len(sel), ""),
            sel["stage"].to_numpy() if "stage" in sel else np.full(len(sel), -1),
            sel["microbatch"].to_numpy() if "microbatch" in sel else np.full(len(sel), -1),
            sel["pass"].astype(str).to_numpy() if "pass" in sel else np.full(len(sel), ""),
            sel["end"].to_numpy(), sel["ipu"].to_numpy()], axis=1).astype(object)
        bars.append(_bar(name, [f"IPU{i}" for i in sel["ipu"]],
                         sel["start"].to_numpy(dtype=float),
                         (sel["end"] - sel["start"]).to_numpy(dtype=float), custom, hover))
    return bars


def _buckets(index: TraceIndex, lo: float, hi: float, pixels: int, unit: str) -> list[go.Bar]:
    edges = np.linspace(lo, hi, pixels + 1)
    parts = []
    for ipu in index.ipus:
        seg = composition_segments(index.occupancy(ipu, edges), edges)
        seg["events"] = index.count_between(ipu, seg["start"].to_numpy(), seg["end"].to_numpy())
        seg["ipu"] = ipu
        parts.append(seg)
    segs = pd.concat(parts, ignore_index=True)
    hover = ("<b>%{fullData.name}</b><br>around %{base:,.0f} → %{customdata[2]:,.0f} "
             f"{unit}<br>"
             "%{customdata[0]:,} events nearby · zoom in for single events"
             "<extra>IPU%{customdata[3]}</extra>")
    bars = []
    for k, name in enumerate(CATEGORIES):
        sel = segs[segs["category"] == k]
        if sel.empty:
            continue
        custom = np.stack([sel["events"].to_numpy(), sel["share"].to_numpy(),
                           sel["end"].to_numpy(), sel["ipu"].to_numpy()], axis=1)
        bars.append(_bar(name, [f"IPU{i}" for i in sel["ipu"]], sel["start"].to_numpy(),
                         (sel["end"] - sel["start"]).to_numpy(), custom, hover))
    return bars


def trace_figure(trace: pd.DataFrame | TraceIndex, start: float | None = None,
                 end: float | None = None, pixels: int = PIXELS, max_events: int = MAX_EVENTS,
                 unit: str = "cycles", title: str = "Execution trace") -> go.Figure:
    """The trace for [start, end) (the whole run by default). `layout.meta` says which
    level of detail was drawn: {"mode": "events"|"buckets", "visible_events": n}."""
    index = trace if isinstance(trace, TraceIndex) else TraceIndex(trace)
    if len(index) == 0:
        return empty_figure("This profile has no trace events.", title)
    lo = index.start if start is None else max(float(start), index.start)
    hi = index.end if end is None else min(float(end), index.end)
    if hi <= lo:
        lo, hi = index.start, index.end
    visible = index.count_visible(lo, hi)
    mode = "events" if visible <= max_events else "buckets"
    bars = _events(index, lo, hi, unit) if mode == "events" else _buckets(index, lo, hi,
                                                                          pixels, unit)
    fig = go.Figure(bars)
    labels = [f"IPU{i}" for i in index.ipus]
    fig.update_layout(barmode="overlay", bargap=0.1, uirevision="trace",
                      meta={"mode": mode, "visible_events": int(visible),
                            "range": [lo, hi]})
    fig.update_xaxes(title_text=unit, range=[lo, hi], showgrid=True, tickformat=",d")
    fig.update_yaxes(categoryorder="array", categoryarray=labels, autorange="reversed",
                     fixedrange=True, title_text="")
    detail = (f"{visible:,} events" if mode == "events"
              else f"{visible:,} events in {pixels} buckets per IPU")
    base_layout(fig, f"{title} · {detail}", height=max(260, 90 + 55 * len(labels)))
    return fig
