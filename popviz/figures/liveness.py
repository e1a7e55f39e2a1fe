"""Liveness: always-live baseline plus not-always-live memory per program step per IPU,
bumps marked, the IPU's capacity as a line; a step x tile heat map for one IPU."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from popviz.figures.lod import maxpool2d, minmax_indices
from popviz.figures.style import CAPACITY_COLOUR, MiB, base_layout, empty_figure
from popviz.vocab import MODELLED, Naming

PIXELS = 1000


def step_axis_title(liveness: pd.DataFrame, naming: Naming) -> str:
    """What one step of a liveness table is: a program step (modelled), a compute action
    (a measured run's per-action memory) or one allocator event (an import: trace memory
    events or a CUDA snapshot, which carry their `time`)."""
    if not naming.measured:
        return "program step"
    if "time" in liveness.columns:
        return "memory event on the rank (an allocation or free)"
    return "compute action on the rank"


def liveness_figure(liveness: pd.DataFrame, bumps: pd.DataFrame | None = None,
                    capacity_bytes: float | None = None, start: float | None = None,
                    end: float | None = None, pixels: int = PIXELS,
                    title: str = "Liveness", naming: Naming = MODELLED) -> go.Figure:
    """One panel per IPU (shared step axis). Each line keeps the min and max of every pixel
    bucket of the visible step range, so no bump disappears. `layout.meta["points"]` is the
    number of points drawn per IPU (keyed by its label, e.g. 'IPU0' or 'rank 0'). A
    measured profile's step is a compute action of the rank, an import's an allocator
    event (`step_axis_title`)."""
    if liveness.empty:
        return empty_figure("This profile has no liveness report.", title)
    ipus = sorted(int(i) for i in liveness["ipu"].unique())
    # room for each panel's title above it (few panels: more of the height is gap)
    fig = make_subplots(rows=len(ipus), cols=1, shared_xaxes=True,
                        vertical_spacing=min(0.08, 0.3 / len(ipus)),
                        subplot_titles=[naming.label(i) for i in ipus])
    points: dict[str, int] = {}
    for row, ipu in enumerate(ipus, start=1):
        g = liveness[liveness["ipu"] == ipu].sort_values("step")
        steps = g["step"].to_numpy()
        a = 0 if start is None else int(np.searchsorted(steps, start, side="left"))
        b = len(steps) if end is None else int(np.searchsorted(steps, end, side="right"))
        a, b = max(0, a - 1), min(len(steps), b + 1)  # one step beyond each edge
        steps = steps[a:b]
        base = g["always_live_bytes"].to_numpy(dtype=float)[a:b] / MiB
        total = base + g["not_always_live_bytes"].to_numpy(dtype=float)[a:b] / MiB
        keep = minmax_indices(total, pixels)
        labels = g["label"].astype(str).to_numpy()[a:b][keep] if "label" in g else None
        phases = g["phase"].astype(str).to_numpy()[a:b][keep] if "phase" in g else None
        custom = np.stack([labels if labels is not None else np.full(len(keep), ""),
                           phases if phases is not None else np.full(len(keep), ""),
                           total[keep] - base[keep], np.full(len(keep), ipu)],
                          axis=1).astype(object)  # the IPU lets a click find its panel
        dev = naming.label(ipu)
        points[dev] = len(keep)
        first = row == 1
        fig.add_trace(go.Scatter(
            x=steps[keep], y=base[keep], name="always-live", legendgroup="always",
            showlegend=first, mode="lines", line={"color": "#3b75af", "width": 1},
            fill="tozeroy", fillcolor="rgba(59,117,175,0.35)", customdata=custom,
            hovertemplate="step %{x}: always-live %{y:,.1f} MiB<extra>" + dev
            + "</extra>"), row=row, col=1)
        fig.add_trace(go.Scatter(
            x=steps[keep], y=total[keep], name="always-live + not-always-live",
            legendgroup="total", showlegend=first, mode="lines",
            line={"color": "#ef8636", "width": 1.5}, fill="tonexty",
            fillcolor="rgba(239,134,54,0.35)", customdata=custom,
            hovertemplate="step %{x} · %{customdata[1]} · %{customdata[0]}<br>total "
            "%{y:,.1f} MiB (not-always-live %{customdata[2]:,.1f} MiB)<extra>" + dev
            + "</extra>"), row=row, col=1)
        if bumps is not None and not bumps.empty:
            bp = bumps[bumps["ipu"] == ipu]
            if start is not None:
                bp = bp[bp["step"] >= start]
            if end is not None:
                bp = bp[bp["step"] <= end]
            if len(bp):
                fig.add_trace(go.Scatter(
                    x=bp["step"], y=bp["total_bytes"] / MiB, mode="markers", name="bump",
                    legendgroup="bump", showlegend=first,
                    marker={"symbol": "triangle-down", "size": 10, "color": "#c53a32"},
                    # same layout as the curves' customdata: a click on a bump finds its IPU
                    customdata=np.stack([bp["label"].astype(str), bp["phase"].astype(str),
                                         bp["prominence"] / MiB, np.full(len(bp), ipu)],
                                        axis=1).astype(object),
                    hovertemplate="bump at step %{x}: %{y:,.1f} MiB<br>%{customdata[0]} "
                    "(prominence %{customdata[2]:,.1f} MiB)<extra>" + dev
                    + "</extra>"), row=row, col=1)
        if capacity_bytes:
            fig.add_hline(y=capacity_bytes / MiB, line={"color": CAPACITY_COLOUR, "dash": "dash",
                                                        "width": 1.5}, row=row, col=1)
        fig.update_yaxes(title_text="MiB", row=row, col=1, rangemode="tozero")
    if capacity_bytes:  # one legend entry for the capacity lines
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{naming.device} capacity "
                                 f"({capacity_bytes / MiB:,.0f} MiB)",
                                 line={"color": CAPACITY_COLOUR, "dash": "dash"}))
    fig.update_xaxes(title_text=step_axis_title(liveness, naming), row=len(ipus), col=1)
    if start is not None and end is not None:
        fig.update_xaxes(range=[start, end])
    fig.update_layout(uirevision="liveness", hovermode="closest",
                      meta={"points": points, "range": [start, end]})
    return base_layout(fig, title + " · click a step to list the variables live there",
                       height=max(320, 60 + 190 * len(ipus)))


def tile_liveness_figure(matrix: np.ndarray, step_start: int = 0, step_stride: int = 1,
                         rows: int = 400, cols: int = 400,
                         title: str = "Not-always-live memory per tile") -> go.Figure:
    """Heat map of a steps x tiles array (bytes); max-pooled so every hot cell stays hot."""
    if matrix.size == 0:
        return empty_figure("This profile has no per-tile liveness.", title)
    pooled, kr, kc = maxpool2d(matrix, rows, cols)
    y = step_start + np.arange(pooled.shape[0]) * kr * step_stride
    x = np.arange(pooled.shape[1]) * kc
    fig = go.Figure(go.Heatmap(
        z=pooled / 1024.0, x=x, y=y, colorscale="Viridis", colorbar={"title": "KiB"},
        hovertemplate="tiles %{x}+ · step %{y}: max %{z:,.1f} KiB<extra></extra>"))
    fig.update_xaxes(title_text=f"tile (blocks of {kc})" if kc > 1 else "tile")
    fig.update_yaxes(title_text="program step" + (f" (blocks of {kr * step_stride})"
                                                  if kr * step_stride > 1 else ""),
                     autorange="reversed")
    fig.update_layout(meta={"row_block": int(kr * step_stride), "col_block": int(kc)})
    return base_layout(fig, title, height=420)
