"""Figures of the op-by-op comparison (analysis.compare.ops) and of the merged liveness
overlay (analysis.compare.overlay). Colours are Okabe-Ito (colour-blind safe): A blues,
solid; B oranges, dashed. Plain Plotly, no Dash."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.analysis.compare.ops import time_unit
from popviz.figures.lod import minmax_indices
from popviz.figures.style import base_layout, byte_unit, empty_figure
from popviz.vocab import naming_of

if TYPE_CHECKING:  # figures draw what analysis built; no import at run time
    from popviz.analysis.compare.ops import OpDiff

# Okabe-Ito: one hue family per side, shades per device; dash tells the sides apart too
SIDE_SHADES = {"A": ["#0072B2", "#56B4E9", "#009E73", "#004B75"],
               "B": ["#D55E00", "#E69F00", "#CC79A7", "#8A3C00"]}
SIDE_DASH = {"A": "solid", "B": "dash"}
FASTER, SLOWER = "#0072B2", "#D55E00"  # B takes less / more time than A
PIXELS = 800


def _fmt(value: Any, scale: float = 1.0, digits: str = ",.4g") -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return format(float(value) * scale, digits)


def ops_diff_figure(diff: OpDiff, top: int = 20) -> go.Figure:
    """Diverging bars of B - A time for the `top` groups with the largest difference (a
    group one side never ran counts as 0 there); hover gives both sides' figures."""
    by = {"op": "op type", "class": "op class", "module": f"module (depth {diff.depth})",
          "pass": "pass"}.get(diff.by, diff.by)
    title = f"Op time, B - A, by {by} (top {top} differences)"
    frame = diff.table.head(top)
    if frame.empty:
        return empty_figure("Neither profile records op times.", title)
    scale, unit = time_unit(diff.per)
    a = frame["a_seconds"].fillna(0.0).to_numpy(float)
    b = frame["b_seconds"].fillna(0.0).to_numpy(float)
    delta = (b - a) * scale
    only = np.where(frame["a_seconds"].isna(), "only in B",
                    np.where(frame["b_seconds"].isna(), "only in A", ""))
    custom = np.stack([
        [_fmt(v, scale) for v in frame["a_seconds"]], [_fmt(v, scale) for v in frame["b_seconds"]],
        [_fmt(v, 1.0, ".2f") + "x" if np.isfinite(v) else "-" for v in frame["ratio"]],
        [_fmt(v, 1.0, ",.6g") for v in frame["a_count"]],
        [_fmt(v, 1.0, ",.6g") for v in frame["b_count"]], only], axis=1)
    fig = go.Figure(go.Bar(
        y=frame["group"].astype(str), x=delta, orientation="h",
        marker={"color": [SLOWER if d > 0 else FASTER for d in delta]}, customdata=custom,
        hovertemplate="<b>%{y}</b> %{customdata[5]}<br>A %{customdata[0]}, B %{customdata[1]} "
        f"{unit}<br>B - A %{{x:,.4g}} {unit} (B / A %{{customdata[2]}})"
        "<br>calls per step: A %{customdata[3]}, B %{customdata[4]}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", automargin=True, title_text="")
    fig.update_xaxes(title_text=f"B - A ({unit}; right: B slower, left: B faster)",
                     zeroline=True, zerolinecolor="#444")
    return base_layout(fig, title, height=max(320, 26 * len(frame) + 140))


def liveness_overlay_figure(overlay: pd.DataFrame, sides: pd.DataFrame,
                            pixels: int = PIXELS) -> go.Figure:
    """Both sides' live memory on x = fraction of the step: per device (IPU / rank), or
    one whole-device peak curve per side (overlay.curve == 'peak')."""
    peak = bool(len(overlay)) and bool((overlay["curve"] == "peak").all())
    title = "Merged liveness: A solid, B dashed" + (" (whole-device peak)" if peak else "")
    if overlay.empty:
        return empty_figure("Neither profile has a liveness report.", title)
    info = sides.set_index("side")
    div, unit = byte_unit(float(overlay["total_bytes"].max()))
    fig = go.Figure()
    for side in ("A", "B"):
        words = naming_of(info.loc[side].to_dict() if side in info.index else None)
        name = str(info.loc[side, "name"]) if side in info.index else side
        for k, (curve, g) in enumerate(overlay[overlay["side"] == side].groupby(
                "curve", sort=False)):
            y = g["total_bytes"].to_numpy(float) / div
            keep = minmax_indices(y, pixels)
            dev = f"fullest {words.device}" if curve == "peak" else words.label(int(curve))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
            held = [words.label(i) for i in g["ipu"].to_numpy()[keep]]
            fig.add_trace(go.Scatter(
                x=g["x"].to_numpy(float)[keep], y=y[keep], mode="lines",
                line={"color": SIDE_SHADES[side][k % 4], "dash": SIDE_DASH[side],
                      "width": 2 if curve == "peak" else 1.6,
                      "shape": "hv" if curve == "peak" else "linear"},
                name=f"{side}: {name} · {dev}", legendgroup=side,
                customdata=np.stack([held, g["step"].to_numpy()[keep]], axis=1).astype(object),
                hovertemplate=f"{side} %{{customdata[0]}}<br>fraction of step %{{x:.3f}}"
                + ("" if curve == "peak" else " (step %{customdata[1]})")
                + f"<br>%{{y:,.1f}} {unit}<extra></extra>"))
    fig.update_xaxes(title_text="fraction of the step (each run's own steps, 0 = first, "
                     "1 = last)", range=[0, 1])
    fig.update_yaxes(title_text=f"live memory ({unit})", rangemode="tozero")
    fig = base_layout(fig, title, height=420)
    fig.update_layout(hovermode="closest", margin={"r": 20},
                      legend={"orientation": "h", "y": -0.22, "x": 0, "xanchor": "left",
                              "yanchor": "top"})
    return fig


__all__ = ["liveness_overlay_figure", "ops_diff_figure", "time_unit"]
