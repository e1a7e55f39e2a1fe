"""The BSP view of a superstep as a heat strip: tiles (in rows of buckets) down, cycles
across, each cell coloured by what its tiles did most (compute, exchange, sync, idle), with
the ops laid out in a lane above it (names, tiles and plans on hover). See
popviz.analysis.superstep for how the tiles' timeline is rebuilt from the ops' plans."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from popviz.analysis.superstep import KINDS, Superstep, bucketed
from popviz.figures.style import CATEGORY_COLOURS, base_layout
from popviz.figures.trace_bars import OP_CLASS_COLOURS, short_name

ROWS = 64  # tile rows (1472 tiles: 64 rows of 23)
COLS = 200  # time buckets (the hover text is most of the bytes: 200 keep it under ~0.9 MB)
KIND_COLOURS = {"compute": CATEGORY_COLOURS["compute"], "exchange": CATEGORY_COLOURS["exchange"],
                "sync": CATEGORY_COLOURS["sync"], "idle": CATEGORY_COLOURS["idle"]}


def _scale() -> list[list]:
    """A discrete colour scale: code k (0..3) is KINDS[k]'s colour."""
    n = len(KINDS)
    out: list[list] = []
    for k, kind in enumerate(KINDS):
        out += [[k / n, KIND_COLOURS[kind]], [(k + 1) / n, KIND_COLOURS[kind]]]
    return out


def _op_lane(view: Superstep) -> list[go.Bar]:
    ops = view.ops
    bars: list[go.Bar] = []
    if ops.empty:
        return bars
    classes = ops["op_class"].astype(str)
    hover = ("<b>%{customdata[0]}</b> (%{customdata[1]})<br>module %{customdata[2]} · pass "
             "%{customdata[3]} · micro-batch %{customdata[4]}<br>tiles %{customdata[5]:,} "
             "(%{customdata[6]:,} to %{customdata[7]:,})<br>%{base:,.0f} → "
             "%{customdata[8]:,.0f} cycles (%{customdata[12]:,.0f}; exchange "
             "%{customdata[9]:,.0f})"
             "<br>%{customdata[10]}<extra>op %{customdata[11]}</extra>")
    for cls in sorted(classes.unique()):
        sel = ops[classes == cls]
        custom = np.stack([sel["op"].astype(str), sel["op_class"].astype(str),
                           sel["module"].astype(str), sel["pass"].astype(str),
                           sel["microbatch"], sel["tiles"], sel["tile0"],
                           sel["tile0"] + sel["tiles"] - 1, sel["end"].round(),
                           sel["exchange"].round(), sel["plan"].astype(str),
                           # the duration: %{x} of a horizontal bar with a base is its end
                           sel["op_id"], (sel["end"] - sel["start"]).round()],
                          axis=-1).astype(object)
        bars.append(go.Bar(
            name=f"op: {cls}", orientation="h", y=np.zeros(len(sel)), yaxis="y2",
            base=sel["start"].to_numpy(float),
            x=(sel["end"] - sel["start"]).to_numpy(float),
            marker={"color": OP_CLASS_COLOURS.get(cls, OP_CLASS_COLOURS["other"]),
                    "line": {"width": 0.3, "color": "white"}},
            width=0.8, customdata=custom, hovertemplate=hover, legendgroup=f"op:{cls}",
            text=[short_name(o) for o in sel["op"]], textposition="inside",
            insidetextanchor="middle", cliponaxis=True, showlegend=False))
    return bars


def superstep_figure(view: Superstep, rows: int = ROWS, cols: int = COLS,
                     title: str = "BSP view") -> go.Figure:
    """The heat strip of `view`. `layout.meta`: ipu, superstep, range, tiles, tiles_per_row,
    rows, cols, share (each kind's share of tiles x cycles)."""
    grid = bucketed(view, rows, cols)
    share = grid.share
    code = share.argmax(axis=0)  # what the cell's tiles did most
    pct = np.rint(share * 100).astype(np.int64)
    n_rows, n_cols = code.shape
    # one short string per cell (the shares it has, the op of its column): hover text is
    # most of the figure's bytes, so no per-cell numbers beyond these
    words = np.full((n_rows, n_cols), "", dtype=object)
    for k in np.argsort(-share.sum(axis=(1, 2))):
        part = np.where(pct[k] > 0, KINDS[k] + " " + pct[k].astype(str) + "%", "")
        sep = np.where((words != "") & (part != ""), ", ", "")
        words = words + sep + part
    ops = np.array([short_name(o) for o in grid.op], dtype=object)
    text = words + np.where(ops != "", "<br>op: " + ops, "")[None, :]
    # %{y} and %{x} are the cell's centre (the axes are the cells' edges)
    hover = (f"the {grid.tiles_per_row} tiles around tile %{{y:,.0f}} · around %{{x:,.0f}} "
             "cycles<br>%{text}<extra></extra>")
    tile_edges = np.append(grid.row_tiles, view.tiles)
    heat = go.Heatmap(z=code, x=np.round(grid.edges), y=tile_edges, text=text,
                      zmin=-0.5, zmax=len(KINDS) - 0.5, colorscale=_scale(),
                      showscale=False, hovertemplate=hover, name="tiles")
    # heat maps have no legend entries: one square per kind stands in
    keys = [go.Scatter(x=[None], y=[None], mode="markers", name=kind,
                       marker={"symbol": "square", "size": 12, "color": KIND_COLOURS[kind]})
            for kind in KINDS]
    fig = go.Figure([heat, *_op_lane(view), *keys])
    totals = share.mean(axis=(1, 2))
    words = " · ".join(f"{kind} {totals[k]:.0%}" for k, kind in enumerate(KINDS))
    base_layout(fig, f"{title} · IPU {view.ipu} · superstep {view.superstep} · "
                f"{view.length:,.0f} cycles · {view.tiles:,} tiles in rows of "
                f"{grid.tiles_per_row}<br><sup>{words} of tiles x cycles</sup>", height=620)
    fig.update_layout(
        barmode="overlay", uniformtext={"minsize": 9, "mode": "hide"},
        xaxis={"title": {"text": "cycles"}, "range": [view.start, view.end],
               "tickformat": ",d", "showgrid": False},
        yaxis={"title": {"text": "tile"}, "domain": [0.0, 0.86], "range": [view.tiles, 0],
               "tickformat": ",d", "showgrid": False, "zeroline": False},
        yaxis2={"domain": [0.89, 1.0], "range": [-0.5, 0.5], "fixedrange": True,
                "tickvals": [0], "ticktext": ["ops"], "showgrid": False, "zeroline": False},
        margin={"l": 70, "r": 20, "t": 110, "b": 50},
        meta={"ipu": view.ipu, "superstep": view.superstep, "range": [view.start, view.end],
              "tiles": view.tiles, "tiles_per_row": grid.tiles_per_row, "rows": n_rows,
              "cols": n_cols, "ops": len(view.ops),
              "share": {kind: round(float(totals[k]), 4) for k, kind in enumerate(KINDS)}})
    return fig
