"""The trace with lanes: per IPU (rank when measured) one lane each for compute, the ops
inside compute, sync (and waiting for it), exchange and host I/O; an overview strip of the
whole run under it with the shown window marked.

Level of detail, all on the server: buckets when more than `max_events` events are
visible (as `trace_figure`); single events with labels where they fit when fewer; and,
when the visible passes hold at most `max_ops` ops, the ops lane shows each op laid out in
its pass in modelled order (see popviz.analysis.trace_detail)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go

from popviz.analysis.trace_detail import (
    PassOps,
    count_ops,
    op_events,
    op_occurrences,
)
from popviz.figures.lod import CATEGORIES, TraceIndex, share_of_row
from popviz.figures.style import (
    CATEGORY_COLOURS,
    CATEGORY_NAMES,
    add_row_lines,
    base_layout,
    empty_figure,
)
from popviz.figures.trace import (
    MAX_EVENTS,
    drop_unfitting_labels,
    reset_to_run,
)
from popviz.figures.trace_bars import LANE_HEIGHT, LANE_OF, module_bars, op_bars, pass_bars
from popviz.figures.trace_outline import op_outline
from popviz.vocab import Naming

MAX_OPS = 3000  # op bars drawn at once; more means zoom in further
LANE_PIXELS = 400  # buckets per lane when zoomed out (docs/app.md says so too)
OVERVIEW_BUCKETS = 240  # buckets per device in the whole-run strip
LANE_PX = 26
OVERVIEW_PX = 70  # the whole-run strip, at least
OVERVIEW_ROW_PX = 14  # ... and a readable row per device, up to 16 of them
OVERVIEW_MAX_PX = 16 * OVERVIEW_ROW_PX
WINDOW_BOX_MIN = 0.005  # the shown window's box on the strip: at least this share wide
LANES = ("compute", "ops", "sync", "exchange", "host I/O")


def overview_px(devices: int) -> int:
    """Height of the whole-run strip: 70 px (four IPUs' rows of 17 px) and 14 px a row
    past five devices, so sixteen are not squeezed into 4 px each."""
    return min(OVERVIEW_MAX_PX, max(OVERVIEW_PX, OVERVIEW_ROW_PX * devices))


def window_box(lo: float, hi: float, first: float, last: float) -> tuple[float, float]:
    """The shown window's box on the strip: [lo, hi], widened about its centre to
    WINDOW_BOX_MIN of the run where it is narrower (a window of 0.02% of a long run was a
    box under a pixel wide), kept inside the run."""
    span = max(last - first, 0.0)
    width = max(hi - lo, WINDOW_BOX_MIN * span)
    if width <= hi - lo or span <= 0:
        return lo, hi
    x0 = min(max((lo + hi - width) / 2, first), last - width)
    return x0, x0 + width


@dataclass
class LaneView:
    """What the figure drew, for the status line and tests."""

    mode: str  # "events" | "buckets"
    visible_events: int
    ops_drawn: int
    ops_hidden: int  # ops in view not drawn (too many: zoom in)
    lanes: list[tuple[int, str]] = field(default_factory=list)


def lanes_of(index: TraceIndex, with_ops: bool, modules: int = 0) -> list[tuple[int, str]]:
    """(device, lane) rows, top to bottom: only lanes a device has events in (so the rows
    stay put while zooming), and with the ops `modules` rows of module nesting between
    compute and ops (flame). Read off the index's per-category arrays: no pass over the
    events."""
    levels = [f"module {k}" for k in range(1, modules + 1)] if with_ops else []
    order = (LANES[0], *levels, *LANES[1:])
    out = []
    for i in index.ipus:
        cats = index.lanes[i].cat_start
        present = {LANE_OF[CATEGORIES[k]] for k in range(len(CATEGORIES)) if len(cats[k])}
        if with_ops and "compute" in present:
            present |= {"ops", *levels}
        out += [(i, lane) for lane in order if lane in present]
    return out


def _bucket_strips(index: TraceIndex, lo: float, hi: float, pixels: int, naming: Naming,
                   row_of: dict) -> list[go.Scatter]:
    """Per lane a 100%-stacked strip of the categories drawn in it (see trace_figure)."""
    edges = np.linspace(lo, hi, pixels + 1)
    x = np.repeat(edges, 2)[1:-1]
    polys: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for ipu in index.ipus:
        occ = index.occupancy(ipu, edges)
        for lane in LANES:
            if (ipu, lane) not in row_of:
                continue
            ks = [k for k, c in enumerate(CATEGORIES) if LANE_OF[c] == lane]
            if not ks:
                continue
            frac = share_of_row(occ[ks], edges)
            width = np.where(np.diff(edges) > 0, np.diff(edges), 1.0)
            busy = np.minimum(occ[ks].sum(axis=0) / width, 1.0)  # lane's share of the bucket
            top = np.cumsum(frac * busy, axis=0)
            row = row_of[(ipu, lane)]
            for j, k in enumerate(ks):
                if not (frac[j] > 0).any():
                    continue
                y_top = row + LANE_HEIGHT / 2 - LANE_HEIGHT * np.repeat(top[j], 2)
                y_bot = row + LANE_HEIGHT / 2 - LANE_HEIGHT * np.repeat(
                    top[j] - frac[j] * busy, 2)
                polys.setdefault(k, []).append((np.concatenate([x, x[::-1], [np.nan]]),
                                                np.concatenate([y_top, y_bot[::-1],
                                                                [np.nan]])))
    out = []
    for k, parts in sorted(polys.items()):
        name = CATEGORIES[k]
        out.append(go.Scatter(
            name=CATEGORY_NAMES[name], x=np.round(np.concatenate([p[0] for p in parts])),
            y=np.round(np.concatenate([p[1] for p in parts]), 3), mode="lines", fill="toself",
            fillcolor=CATEGORY_COLOURS[name], line={"width": 0}, hoverinfo="skip",
            legendgroup=name))
    return out


def _overview(index: TraceIndex, naming: Naming,
              buckets: int = OVERVIEW_BUCKETS) -> go.Heatmap:
    """The whole run as one thin heat strip per device: the share of each bucket spent
    computing (a few hundred numbers however long the run)."""
    edges = np.linspace(index.start, index.end, buckets + 1)
    width = np.where(np.diff(edges) > 0, np.diff(edges), 1.0)
    compute = [k for k, c in enumerate(CATEGORIES) if LANE_OF[c] == "compute"]
    z = np.array([np.minimum(index.occupancy(i, edges)[compute].sum(axis=0) / width, 1.0)
                  for i in index.ipus])
    return go.Heatmap(
        z=np.round(z, 3), x=(edges[:-1] + edges[1:]) / 2, y=list(range(len(index.ipus))),
        xaxis="x2", yaxis="y2", zmin=0, zmax=1, showscale=False,
        colorscale=[[0, "#f4f6f8"], [1, CATEGORY_COLOURS["F"]]],
        hovertemplate=(f"{naming.prefix}%{{y}} around %{{x:,.0f}} {naming.unit}: "
                       "computing %{z:.0%} of the time<extra>whole run</extra>"),
        name="whole run", showlegend=False)


def trace_lanes_figure(index: TraceIndex, start: float | None = None,
                       end: float | None = None, naming: Naming | None = None,
                       templates: dict[tuple[int, str], PassOps] | None = None,
                       highlight: str | None = None, overview: bool = True,
                       max_events: int = MAX_EVENTS, max_ops: int = MAX_OPS,
                       pixels: int = LANE_PIXELS, title: str = "Execution trace",
                       flat: bool = False, module_levels: int = 0,
                       highlight_op: int | None = None) -> go.Figure:
    """The trace of [start, end) in lanes. `templates` (analysis.trace_detail.pass_ops)
    gives the op level; `highlight` a module path whose ops are outlined, `highlight_op`
    one op (by op_id, in every pass and micro-batch that runs it). Flame (default):
    the ops in a lane of their own under the passes they nest in; `flat`: one row per
    lane, the ops drawn over their pass in the compute lane. `module_levels`
    (analysis.trace_detail.module_levels) rows of module nesting between a pass and its
    ops in flame mode. `layout.meta`: mode,
    visible_events, range, ops_drawn, ops_hidden, lanes, view (flame|flat)."""
    naming = naming or Naming()
    if len(index) == 0:
        return empty_figure("This profile has no trace events.", title)
    templates = templates or {}
    lo = index.start if start is None else max(float(start), index.start)
    hi = index.end if end is None else min(float(end), index.end)
    if hi <= lo:
        lo, hi = index.start, index.end
    levels = 0 if flat else module_levels
    lanes = lanes_of(index, bool(templates) and not flat, levels)
    row_of = {lane: r for r, lane in enumerate(lanes)}
    if flat:  # the op level on its pass's row
        row_of.update({(i, "ops"): r for (i, lane), r in list(row_of.items())
                       if lane == "compute"})
    visible = index.count_visible(lo, hi)
    view = LaneView("events" if visible <= max_events else "buckets", visible, 0, 0, lanes)
    ev = index.frame
    if view.mode == "events":
        rows = np.concatenate([index.visible_rows(i, lo, hi) for i in index.ipus])
        ev = index.frame.iloc[np.sort(rows)]
        data: list = pass_bars(ev, naming, row_of, lo, hi)
        n_ops = count_ops(ev, templates, lo, hi) if templates else 0
        if 0 < n_ops <= max_ops:  # the exact count of the ops in view
            ops = op_events(ev, templates, lo, hi)
            data += op_bars(ops, naming, row_of, lo, hi, highlight, highlight_op)
            data += module_bars(ops, row_of, levels, lo, hi) if levels else []
            view.ops_drawn = len(ops)
        else:
            view.ops_hidden = n_ops
    else:
        data = _bucket_strips(index, lo, hi, pixels, naming, row_of)
        view.ops_hidden = -1  # not counted: far too many
        # Plotly offers Box Select only beside a selectable trace and the strips are
        # filled lines: two invisible markers keep the range statistics' tool
        data.append(go.Scatter(x=[lo, hi], y=[0, 0], mode="markers", name="select",
                               marker={"opacity": 0, "size": 1}, hoverinfo="skip",
                               showlegend=False))
    if highlight_op is not None and templates:  # drawn last: nothing covers it
        data += op_outline(op_occurrences(ev, templates, highlight_op, lo, hi), lo, hi,
                           row_of, naming, f"op {highlight_op}", boxes=view.ops_drawn > 0,
                           height=LANE_HEIGHT)
    drop_unfitting_labels(data, lo, hi)
    fig = go.Figure(data)
    main_px = LANE_PX * len(lanes)
    ov_px = overview_px(len(index.ipus)) if overview else 0
    height = 140 + main_px + (ov_px + 55 if overview else 0)
    split = (ov_px + 55) / (main_px + ov_px + 55) if overview else 0.0
    if overview:
        fig.add_trace(_overview(index, naming))
        fig.update_layout(
            xaxis2={"domain": [0, 1], "anchor": "y2", "range": [index.start, index.end],
                    "fixedrange": True, "showgrid": False, "tickformat": "~s",
                    "tickfont": {"size": 9}},
            yaxis2={"domain": [0, split - 55 / (main_px + ov_px + 55)], "anchor": "x2",
                    "range": [len(index.ipus) - 0.5, -0.5], "fixedrange": True,
                    "tickvals": list(range(len(index.ipus))),
                    "ticktext": [naming.label(i) for i in index.ipus],
                    "tickfont": {"size": 9}, "showgrid": False, "zeroline": False})
        box_lo, box_hi = window_box(lo, hi, index.start, index.end)
        fig.add_shape(type="rect", xref="x2", yref="y2", x0=box_lo, x1=box_hi, y0=-0.5,
                      y1=len(index.ipus) - 0.5, line={"color": "#222", "width": 1.5},
                      fillcolor="rgba(0,0,0,0.08)")
        fig.add_annotation(text="whole run (shown window boxed)", xref="x2 domain",
                           yref="y2 domain", x=0, y=1.0, yanchor="bottom", xanchor="left",
                           showarrow=False, font={"size": 10, "color": "#555"})
    labels = [f"{naming.label(i)} · {naming.lane(lane)}" if lane == "compute"
              else naming.lane(lane) for i, lane in lanes]
    fig.update_layout(
        barmode="overlay", uirevision="trace-lanes",
        uniformtext={"minsize": 9, "mode": "hide"},  # a label only where it fits
        meta={"mode": view.mode, "visible_events": int(visible), "range": [lo, hi],
              "view": "flat" if flat else "flame",
              "ops_drawn": view.ops_drawn, "ops_hidden": view.ops_hidden,
              "lanes": [f"{naming.label(i)} {lane}" for i, lane in lanes]},
        yaxis={"domain": [split, 1.0]})
    fig.update_layout(xaxis={"title": {"text": naming.time_title}, "range": [lo, hi],
                             "showgrid": True, "tickformat": ",d", "anchor": "y"})
    reset_to_run(fig, index.start, index.end)
    fig.update_layout(yaxis={"tickmode": "array", "tickvals": list(range(len(lanes))),
                             "ticktext": labels, "range": [len(lanes) - 0.5, -0.5],
                             "fixedrange": True, "showgrid": False, "zeroline": False,
                             "tickfont": {"size": 10}})
    # a thin line between devices
    add_row_lines(fig, [(r - 0.5, "#999") for r, (ipu, _lane) in enumerate(lanes)
                        if r and lanes[r - 1][0] != ipu])
    detail = (f"{visible:,} events" if view.mode == "events"
              else f"{visible:,} events in {pixels} buckets per lane")
    base_layout(fig, f"{title} ({'flat' if flat else 'flame'}) · {detail}", height=height)
    fig.update_layout(margin={"l": 110, "r": 20, "t": 100, "b": 40},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0,
                              "xanchor": "left", "font": {"size": 10}},
                      # the title at the top, whatever the height (0.98 of a tall figure
                      # falls under the legend)
                      title={"y": 1.0, "yanchor": "top", "pad": {"t": 10}})
    return fig
