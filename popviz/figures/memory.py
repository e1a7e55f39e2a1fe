"""Memory per tile by category, a tile map, per-IPU totals, a histogram, one tile."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.analysis.memory import memory_categories, with_utilisation
from popviz.figures.style import (
    CAPACITY_COLOUR,
    OOM_COLOUR,
    KiB,
    MiB,
    base_layout,
    empty_figure,
    memory_colour,
    pretty,
)
from popviz.vocab import ipu_label

TILE_MAP_COLUMNS = 64  # tiles per row of the tile map
# below this share of the capacity, drawing the capacity would flatten the data to a line
# at the bottom: the axis fits the data and the capacity is named in the title instead
FAR_BELOW = 0.25


def far_below(top: float, capacity: float) -> bool:
    """True when `top` is under FAR_BELOW of `capacity` (a capacity line would squash it)."""
    return capacity > 0 and top < FAR_BELOW * capacity


def tile_memory_figure(tile_memory: pd.DataFrame, ipu: int,
                       title: str = "Memory per tile") -> go.Figure:
    """Stacked bars of every tile of one IPU by category; OOM tiles marked in red."""
    tm = tile_memory[tile_memory["ipu"] == ipu].sort_values("tile")
    if tm.empty:
        return empty_figure(f"No tile memory for {ipu_label(ipu)}.", title)
    fig = go.Figure()
    tiles = tm["tile"].to_numpy()
    # stacked step areas, one SVG path per category: 1472 tiles x 4 categories as bars
    # would be ~6000 rects for the browser to lay out
    for i, cat in enumerate(memory_categories(tile_memory)):
        colour = memory_colour(cat, i)
        fig.add_trace(go.Scatter(x=tiles, y=tm[cat].to_numpy() / KiB, name=pretty(cat),
                                 stackgroup="tiles", mode="lines",
                                 line={"color": colour, "width": 0, "shape": "hvh"},
                                 fillcolor=colour,
                                 hovertemplate="tile %{x}: %{y:,.1f} KiB<extra>" + pretty(cat)
                                 + "</extra>"))
    cap = float(tm["capacity_bytes"].max()) / KiB
    top = float(tm["total_bytes"].max()) / KiB
    if far_below(top, cap):
        title += f" (tile capacity {cap:,.0f} KiB is off the scale)"
        fig.update_yaxes(range=[0, top * 1.15])
    else:
        # the label on the emptier end of the IPU, on a white ground, with room above the
        # fuller of the line and the curve: over-full tiles drew their curve across it
        edge = max(1, len(tm) // 20)
        totals = tm["total_bytes"].to_numpy(np.float64)
        side = "top left" if totals[:edge].max() <= totals[-edge:].max() else "top right"
        fig.add_hline(y=cap, line={"color": CAPACITY_COLOUR, "dash": "dash", "width": 1.5},
                      annotation_text=f"tile capacity {cap:,.0f} KiB",
                      annotation_position=side,
                      annotation_bgcolor="rgba(255, 255, 255, 0.85)")
        fig.update_yaxes(range=[0, max(cap, top) * 1.12])
    over = tm[tm["total_bytes"] > tm["capacity_bytes"]]
    if len(over):
        fig.add_trace(go.Scatter(
            x=over["tile"], y=over["total_bytes"] / KiB, mode="markers",
            name=f"out of memory ({len(over)} tiles)",
            marker={"symbol": "x", "size": 9, "color": OOM_COLOUR},
            hovertemplate="tile %{x} OUT OF MEMORY: %{y:,.1f} KiB<extra></extra>"))
    fig.update_layout(clickmode="event", hovermode="x unified")
    fig.update_xaxes(title_text="tile", range=[-0.5, len(tiles) - 0.5])
    fig.update_yaxes(title_text="KiB")
    return base_layout(fig, f"{title} · {ipu_label(ipu)} · click a tile for its breakdown")


def tile_map_figure(tile_memory: pd.DataFrame, ipu: int,
                    columns: int = TILE_MAP_COLUMNS, title: str = "Tile map") -> go.Figure:
    """Utilisation of each tile laid out in a grid; OOM tiles crossed out."""
    tm = with_utilisation(tile_memory[tile_memory["ipu"] == ipu].sort_values("tile"))
    if tm.empty:
        return empty_figure(f"No tile memory for {ipu_label(ipu)}.", title)
    n = int(tm["tile"].max()) + 1
    rows = -(-n // columns)
    z = np.full(rows * columns, np.nan)
    z[tm["tile"].to_numpy()] = tm["utilisation"].to_numpy() * 100
    # a profile that fits: colours span the tiles' own range (on 0-100% tiles between 30%
    # and 60% are one flat blue); one that overflows keeps 0-100% so full reads as full
    zmin, zmax = 0.0, 100.0
    top = float(np.nanmax(z)) if np.isfinite(z).any() else 0.0
    low = float(np.nanmin(z)) if np.isfinite(z).any() else 0.0
    if 0 < top <= 100 and top - low > 0:
        zmin, zmax = float(np.floor(low)), float(np.ceil(top))
        zmax = zmax if zmax > zmin else zmin + 1
        title += f" (colours from {zmin:g}% to {zmax:g}% used)"
    tile_ids = np.arange(rows * columns).astype(float)
    tile_ids[n:] = np.nan
    fig = go.Figure(go.Heatmap(
        z=z.reshape(rows, columns), customdata=tile_ids.reshape(rows, columns),
        colorscale=[[0, "#f7fbff"], [0.5, "#6baed6"], [1, "#08306b"]] if zmin > 0 else
        [[0, "#f7fbff"], [0.5, "#6baed6"], [0.85, "#08306b"], [1, "#08306b"]],
        zmin=zmin, zmax=zmax, colorbar={"title": "% used"}, xgap=1, ygap=1,
        hovertemplate="tile %{customdata:.0f}: %{z:.1f}% of capacity<extra></extra>"))
    over = tm[tm["bytes_over"] > 0]
    if len(over):
        t = over["tile"].to_numpy()
        fig.add_trace(go.Scatter(x=t % columns, y=t // columns, mode="markers",
                                 name="out of memory", customdata=t,
                                 marker={"symbol": "x", "size": 8, "color": OOM_COLOUR},
                                 hovertemplate="tile %{customdata} OUT OF MEMORY"
                                 "<extra></extra>"))
    fig.update_xaxes(title_text=f"column (tile number = row × {columns} + column)",
                     showgrid=False)
    # the ticks name each row by its first tile, so the title says so
    fig.update_yaxes(title_text=f"first tile of the row ({columns} a row)",
                     range=[rows - 0.5, -0.5],
                     showgrid=False, scaleanchor="x", constrain="domain",
                     tickvals=list(range(0, rows, max(1, rows // 6))),
                     ticktext=[f"{r * columns}" for r in range(0, rows, max(1, rows // 6))])
    fig.update_xaxes(range=[-0.5, columns - 0.5], constrain="domain")
    return base_layout(fig, f"{title} · {ipu_label(ipu)}", height=200 + 12 * rows)


def ipu_totals_figure(totals: pd.DataFrame, title: str = "Memory per IPU") -> go.Figure:
    """Stacked bars per IPU by category with each IPU's capacity (from `ipu_totals`)."""
    if totals.empty:
        return empty_figure("No tile memory in this profile.", title)
    labels = [ipu_label(i) for i in totals["ipu"]]
    skip = {"ipu", "total_bytes", "capacity_bytes", "utilisation", "max_tile_utilisation",
            "oom_tiles"}
    fig = go.Figure()
    for i, cat in enumerate(c for c in totals.columns if c not in skip):
        fig.add_trace(go.Bar(x=labels, y=totals[cat] / MiB, name=pretty(cat),
                             marker={"color": memory_colour(cat, i)},
                             hovertemplate="%{x}: %{y:,.1f} MiB<extra>" + pretty(cat)
                             + "</extra>"))
    cap, top = float(totals["capacity_bytes"].max()), float(totals["total_bytes"].max())
    if far_below(top, cap):
        title += f" ({cap / MiB:,.0f} MiB capacity each is off the scale)"
    else:
        # drawn over the bars, dark with a white edge: visible inside an out-of-memory bar
        fig.add_trace(go.Scatter(x=labels, y=totals["capacity_bytes"] / MiB, mode="markers",
                                 name="capacity",
                                 marker={"symbol": "line-ew-open", "size": 44,
                                         "color": "#111", "line": {"width": 3}},
                                 hovertemplate="%{x} capacity %{y:,.0f} MiB<extra></extra>"))
        fig.add_trace(go.Scatter(x=labels, y=totals["capacity_bytes"] / MiB, mode="markers",
                                 showlegend=False, hoverinfo="skip",
                                 marker={"symbol": "line-ew-open", "size": 40,
                                         "color": CAPACITY_COLOUR, "line": {"width": 1.5}}))
    text = [f"{u:.0%}" + (f" · {o} OOM tiles" if o else "")
            for u, o in zip(totals["utilisation"], totals["oom_tiles"])]
    fig.add_trace(go.Scatter(x=labels, y=totals["total_bytes"] / MiB, mode="text", text=text,
                             textposition="top center", showlegend=False, hoverinfo="skip"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="MiB")
    base_layout(fig, title, height=380)
    # six categories and the capacity do not fit beside the title: list them on the right
    fig.update_layout(legend={"orientation": "v", "x": 1.02, "y": 1, "xanchor": "left",
                              "yanchor": "top"}, margin={"r": 170})
    return fig


def memory_histogram(tile_memory: pd.DataFrame, title: str = "Tile memory histogram"
                     ) -> go.Figure:
    """How many tiles hold how much memory, one colour per IPU, capacity marked."""
    if tile_memory.empty:
        return empty_figure("No tile memory in this profile.", title)
    fig = go.Figure()
    cap = float(tile_memory["capacity_bytes"].max()) / KiB
    fullest = float(tile_memory["total_bytes"].max()) / KiB
    far = far_below(fullest, cap)
    top = fullest if far else max(cap, fullest)
    if far:
        title += f" (tile capacity {cap:,.0f} KiB is off the scale)"
    for ipu, g in tile_memory.groupby("ipu", sort=True):
        fig.add_trace(go.Histogram(x=g["total_bytes"] / KiB, name=ipu_label(ipu), opacity=0.85,
                                   xbins={"start": 0, "end": top * 1.02, "size": top / 60},
                                   hovertemplate="%{x} KiB: %{y} tiles<extra>IPU" + str(ipu)
                                   + "</extra>"))
    if not far:
        fig.add_vline(x=cap, line={"color": CAPACITY_COLOUR, "dash": "dash"},
                      annotation_text="tile capacity", annotation_position="top left")
    fig.update_layout(barmode="group", bargap=0.05)  # overlaid, IPU1 would hide IPU0
    fig.update_xaxes(title_text=f"memory per tile (KiB, bins of {top / 60:,.1f} KiB)")
    fig.update_yaxes(title_text="tiles")
    return base_layout(fig, title, height=340)


def tile_breakdown_figure(breakdown: pd.DataFrame, ipu: int, tile: int,
                          capacity_bytes: float) -> go.Figure:
    """One tile's bytes per category against its capacity."""
    title = f"{ipu_label(ipu)} tile {tile}"
    if breakdown.empty:
        return empty_figure("No categories for this tile.", title)
    fig = go.Figure(go.Bar(
        x=breakdown["bytes"] / KiB, y=[pretty(c) for c in breakdown["category"]],
        orientation="h", marker={"color": [memory_colour(c, i) for i, c in
                                           enumerate(breakdown["category"])]},
        hovertemplate="%{y}: %{x:,.1f} KiB<extra></extra>", showlegend=False))
    total = breakdown["bytes"].sum()
    state = "OUT OF MEMORY" if total > capacity_bytes else f"{total / capacity_bytes:.0%} used"
    fig.update_xaxes(title_text="KiB")
    fig.update_yaxes(autorange="reversed")
    return base_layout(fig, f"{title}: {total / KiB:,.1f} of {capacity_bytes / KiB:,.0f} KiB "
                       f"({state})", height=260)
