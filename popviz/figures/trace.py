"""Execution trace: one row per IPU (rank when measured), events coloured by kind and pass,
time (cycles, or ns when measured) on x.

Level of detail: when at most `max_events` events are visible every event is its own
segment with full hover; otherwise each IPU row is cut into `pixels` buckets and each
bucket is shared among the categories that ran in it, in proportion to their time but
with a minimum width (a short exchange stays visible), contiguous equal segments merged.
The app rebuilds the figure for the visible range on zoom."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.figures.lod import CATEGORIES, TraceIndex, category_codes, share_of_row
from popviz.figures.style import CATEGORY_COLOURS, CATEGORY_NAMES, base_layout, empty_figure
from popviz.vocab import MEASURED, Naming

MAX_EVENTS = 1500  # above this, bars cost the browser more than they tell
ROW_HEIGHT = 0.76  # of each IPU's row, the rest is the gap between rows
PIXELS = 600  # buckets per IPU row when zoomed out; each holds a few sub-segments
HIGHLIGHT = "#ffd400"  # the outline of a selected op or module


# Labels inside bars: Plotly lays out every bar's text before uniformtext hides what does
# not fit, about 0.5 s for 1,500 labelled bars in Chromium. A label that cannot fit is
# dropped here instead: LABEL_PLOT_PX is a wide plot (wider than most screens give it, so
# nothing that would show is dropped) and LABEL_CHAR_PX a narrow character at
# uniformtext's minimum size.
LABEL_PLOT_PX = 1800
LABEL_CHAR_PX = 4.5


def drawn_part(start: np.ndarray, end: np.ndarray, lo: float,
               hi: float) -> tuple[np.ndarray, np.ndarray]:
    """(base, width) of the part of each bar [start, end] inside the window [lo, hi]: Plotly
    centres a bar's inside label on the bar it is given, so a bar drawn whole that starts
    before the window (or ends after it) would centre its label off-screen. A bar is drawn
    over what is seen of it and its hover says its true start and end (from customdata)."""
    start = np.asarray(start, dtype=float)
    end = np.asarray(end, dtype=float)
    base = np.clip(start, lo, hi)
    return base, np.maximum(np.clip(end, lo, hi) - base, 0.0)


def drop_unfitting_labels(traces: list, lo: float, hi: float,
                          plot_px: float = LABEL_PLOT_PX,
                          char_px: float = LABEL_CHAR_PX) -> None:
    """Blank the text of horizontal bars whose part in [lo, hi] is too narrow for it."""
    span = hi - lo
    if span <= 0:
        return
    for trace in traces:
        if not isinstance(trace, go.Bar) or trace.text is None or trace.base is None \
                or trace.x is None:
            continue
        text = np.asarray(trace.text, dtype=object)
        if text.ndim != 1 or not len(text):
            continue
        start = np.asarray(trace.base, dtype=np.float64)
        end = start + np.asarray(trace.x, dtype=np.float64)
        px = drawn_part(start, end, lo, hi)[1] / span * plot_px
        need = np.fromiter((len(str(t)) for t in text), np.float64, len(text)) * char_px + 4
        trace.text = np.where(px >= need, text, "")


def reset_to_run(fig: go.Figure, lo: float, hi: float) -> None:
    """A double-click (an autorange) shows exactly [lo, hi], the whole run. Plotly pads a
    bar chart's autorange by 5%; and once a user has autoranged, the figure's uirevision
    keeps that padded autorange over a redraw whose range is the one shown before (a
    double-click on the whole run), so the server's exact range alone cannot undo it."""
    fig.update_layout(xaxis={"autorangeoptions": {"minallowed": lo, "maxallowed": hi}})


def _bar(name: str, rows: np.ndarray, base: np.ndarray, width: np.ndarray,
         custom: np.ndarray, hover: str) -> go.Bar:
    return go.Bar(
        name=CATEGORY_NAMES[name], orientation="h", y=rows, base=base, x=width,
        marker={"color": CATEGORY_COLOURS[name], "line": {"width": 0}}, width=ROW_HEIGHT,
        customdata=custom, hovertemplate=hover, legendgroup=name,
    )


def _stack(columns: list) -> np.ndarray:
    """Columns side by side as objects (np.stack would turn the numbers into strings)."""
    out = np.empty((len(columns[0]), len(columns)), dtype=object)
    for j, col in enumerate(columns):
        out[:, j] = np.asarray(col, dtype=object)
    return out


def _events(index: TraceIndex, lo: float, hi: float, naming: Naming,
            row_of: dict[int, int]) -> list[go.Bar]:
    rows = np.concatenate([index.visible_rows(i, lo, hi) for i in index.ipus])
    ev = index.frame.iloc[np.sort(rows)]
    codes = category_codes(ev)
    unit = naming.unit
    hover = (f"<b>%{{customdata[0]}}</b><br>{naming.device} %{{customdata[5]}} · stage "
             "%{customdata[1]} · micro-batch %{customdata[2]} · pass %{customdata[3]}<br>"
             f"%{{base:,.0f}} → %{{customdata[4]:,.0f}} {unit} "
             f"(duration %{{customdata[6]:,.0f}} {unit})<extra>%{{fullData.name}}</extra>")
    bars = []
    for k, name in enumerate(CATEGORIES):
        sel = ev[codes == k]
        if sel.empty:
            continue
        # Plotly's %{x} of an offset bar is its end, so the duration travels in customdata
        custom = _stack([
            sel["op"].astype(str).to_numpy() if "op" in sel else np.full(len(sel), ""),
            sel["stage"].to_numpy() if "stage" in sel else np.full(len(sel), -1),
            sel["microbatch"].to_numpy() if "microbatch" in sel else np.full(len(sel), -1),
            sel["pass"].astype(str).to_numpy() if "pass" in sel else np.full(len(sel), ""),
            sel["end"].to_numpy(), sel["ipu"].to_numpy(),
            (sel["end"] - sel["start"]).to_numpy()])
        bars.append(_bar(name, sel["ipu"].map(row_of).to_numpy(),
                         sel["start"].to_numpy(dtype=float),
                         (sel["end"] - sel["start"]).to_numpy(dtype=float), custom, hover))
    return bars


def _buckets(index: TraceIndex, lo: float, hi: float, pixels: int, naming: Naming,
             row_of: dict[int, int]) -> list[go.Scatter]:
    """Each IPU row as a 100%-stacked strip over time: in every bucket, each category gets
    a slice of the row's height in proportion to its time there (never thinner than the
    minimum share, so a short exchange stays visible). One filled polygon per category per
    IPU: a few dozen SVG paths however long the run, unlike one rect per segment."""
    edges = np.linspace(lo, hi, pixels + 1)
    x = np.repeat(edges, 2)[1:-1]  # step outline: each bucket's left and right edge
    polys: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for ipu in index.ipus:
        occ = index.occupancy(ipu, edges)
        frac = share_of_row(occ, edges)
        top = np.cumsum(frac, axis=0)
        events = index.count_between(ipu, edges[:-1], edges[1:])
        row = row_of[ipu]
        for k in np.flatnonzero(frac.sum(axis=1) > 0):
            y_top = row - ROW_HEIGHT / 2 + ROW_HEIGHT * np.repeat(top[k], 2)
            y_bot = row - ROW_HEIGHT / 2 + ROW_HEIGHT * np.repeat(top[k] - frac[k], 2)
            width = np.diff(edges)
            # overlapping events of one kind (measured runs) can sum past the bucket
            share = np.repeat(np.minimum(occ[k] / np.where(width > 0, width, 1.0), 1.0), 2)
            custom = np.stack([share, np.repeat(events, 2), np.full(len(x), ipu)], axis=1)
            polys.setdefault(int(k), []).append((
                np.concatenate([x, x[::-1], [np.nan]]),
                np.concatenate([y_top, y_bot[::-1], [np.nan]]),
                np.concatenate([custom, custom[::-1], [[0, 0, ipu]]])))
    hover = ("<b>%{fullData.name}</b>: %{customdata[0]:.0%} of the time around "
             f"%{{x:,.0f}} {naming.unit}<br>%{{customdata[1]:,}} events in this bucket · "
             f"zoom in for single events<extra>{naming.prefix}%{{customdata[2]}}"
             "</extra>")
    out = []
    for k, parts in sorted(polys.items()):
        name = CATEGORIES[k]
        out.append(go.Scatter(
            name=CATEGORY_NAMES[name], x=np.concatenate([p[0] for p in parts]),
            y=np.concatenate([p[1] for p in parts]),
            customdata=np.concatenate([p[2] for p in parts]), mode="lines",
            fill="toself", fillcolor=CATEGORY_COLOURS[name], line={"width": 0},
            hoveron="points+fills", hovertemplate=hover, legendgroup=name))
    return out


def trace_figure(trace: pd.DataFrame | TraceIndex, start: float | None = None,
                 end: float | None = None, pixels: int = PIXELS, max_events: int = MAX_EVENTS,
                 unit: str = "cycles", title: str = "Execution trace",
                 naming: Naming | None = None) -> go.Figure:
    """The trace for [start, end) (the whole run by default). `layout.meta` says which
    level of detail was drawn: {"mode": "events"|"buckets", "visible_events": n}. `naming`
    names the rows and the time unit (IPUs and cycles by default; a bare unit="ns" means
    a measured profile)."""
    naming = naming or (MEASURED if unit == "ns" else Naming(unit=unit))
    index = trace if isinstance(trace, TraceIndex) else TraceIndex(trace)
    if len(index) == 0:
        return empty_figure("This profile has no trace events.", title)
    lo = index.start if start is None else max(float(start), index.start)
    hi = index.end if end is None else min(float(end), index.end)
    if hi <= lo:
        lo, hi = index.start, index.end
    visible = index.count_visible(lo, hi)
    mode = "events" if visible <= max_events else "buckets"
    labels = [naming.label(i) for i in index.ipus]
    row_of = {ipu: row for row, ipu in enumerate(index.ipus)}
    fig = go.Figure(_events(index, lo, hi, naming, row_of) if mode == "events"
                    else _buckets(index, lo, hi, pixels, naming, row_of))
    fig.update_layout(barmode="overlay", bargap=0.1, uirevision="trace",
                      meta={"mode": mode, "visible_events": int(visible),
                            "range": [lo, hi]})
    fig.update_xaxes(title_text=naming.time_title, range=[lo, hi], showgrid=True,
                     tickformat=",d")
    reset_to_run(fig, index.start, index.end)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(labels))), ticktext=labels,
                     range=[len(labels) - 0.5, -0.5], fixedrange=True, showgrid=False,
                     zeroline=False, title_text="")
    detail = (f"{visible:,} events" if mode == "events"
              else f"{visible:,} events in {pixels} buckets per {naming.device}")
    base_layout(fig, f"{title} · {detail}", height=max(260, 90 + 55 * len(labels)))
    return fig
