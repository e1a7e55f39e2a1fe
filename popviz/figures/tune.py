"""The plans of `popviz tune`: throughput against peak memory, the Pareto front drawn, the
current layout starred, plans that do not fit crossed out, the IPU's memory as a line; and
what each AMP step trades per IPU (conv / matmul cycles against temporary memory)."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.figures.style import CAPACITY_COLOUR, KiB, MiB, base_layout, empty_figure

FITS = "#3f9142"
NO_FIT = "#9aa5b1"
FRONT = "#3b75af"


def _custom(plans: pd.DataFrame, over: str = "") -> np.ndarray:
    out = np.empty((len(plans), 7), dtype=object)
    out[:, 0] = plans["splits"].to_numpy()
    out[:, 1] = plans["amp"].to_numpy()
    out[:, 2] = ["on" if r else "off" for r in plans["recomputation"]]
    out[:, 3] = plans["schedule"].to_numpy()
    out[:, 4] = plans["vs_now"].to_numpy()
    out[:, 5] = ["fits" if f else f"does NOT fit ({n} tiles{over})" for f, n in
                 zip(plans["fits"], plans["oom_tiles"], strict=True)]
    out[:, 6] = plans["plan"].to_numpy()  # the hover names the point even when its label
    return out                            # is carried by a neighbour


def point_labels(plans: pd.DataFrame, near: float = 0.04) -> list[str]:
    """One label per cluster of plans drawn on top of each other (within `near` of each
    axis' span, in the table's order): the first point of a cluster carries "#1, #2", the
    others none, so labels never print over each other (issue 21)."""
    x = plans["peak_bytes"].to_numpy(dtype=float)
    y = plans["throughput"].to_numpy(dtype=float)
    span_x = max(float(np.ptp(x)), float(np.abs(x).max(initial=0.0)) * 0.05, 1.0)
    span_y = max(float(np.ptp(y)), float(np.abs(y).max(initial=0.0)) * 0.05, 1.0)
    names = [str(n) for n in plans["plan"]]
    labels = [""] * len(names)
    anchors: list[int] = []
    for i in range(len(names)):
        home = next((a for a in anchors if abs(x[a] - x[i]) <= near * span_x
                     and abs(y[a] - y[i]) <= near * span_y), None)
        if home is None:
            anchors.append(i)
            labels[i] = names[i]
        else:
            labels[home] += f", {names[i]}"
    return labels


def tune_figure(plans: pd.DataFrame, capacity_bytes: float | None = None,
                title: str = "Plans: throughput against peak memory",
                max_tile_fill: float = 1.0) -> go.Figure:
    """Scatter of `plans` (advise.plans.plans_table); below a `max_tile_fill` of 1 the
    legend and hovers name the ceiling the plans' fits were judged by."""
    if plans.empty:
        return empty_figure("No plans.", title)
    hover = ("<b>%{customdata[6]}</b> · %{customdata[5]}<br>%{y:,.0f} samples/s "
             "(%{customdata[4]:.2f}x now) · peak %{x:,.0f} MiB on the fullest IPU<br>"
             "splits %{customdata[0]}<br>AMP %{customdata[1]} · recomputation "
             "%{customdata[2]} · %{customdata[3]}<extra></extra>")
    fig = go.Figure()
    plans = plans.assign(label=point_labels(plans))
    ceiling = max_tile_fill < 1.0
    over = f" > {max_tile_fill:.0%}" if ceiling else ""
    front = plans[plans["pareto"]].sort_values("peak_bytes")
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=front["peak_bytes"] / MiB, y=front["throughput"],
                                 mode="lines", name="Pareto front (fits, nothing better on "
                                 "both)", line={"color": FRONT, "width": 1.5, "dash": "dot"},
                                 hoverinfo="skip"))
    for name, sel, marker in (
            ("fits" + (f" (every tile <= {max_tile_fill:.0%})" if ceiling else ""),
             plans[plans["fits"] & (plans["plan"] != "now")],
             {"color": FITS, "size": 11, "symbol": "circle"}),
            ("does not fit", plans[~plans["fits"] & (plans["plan"] != "now")],
             {"color": NO_FIT, "size": 11, "symbol": "x"}),
            ("now (this profile)", plans[plans["plan"] == "now"],
             {"color": "#222", "size": 16, "symbol": "star"})):
        if sel.empty:
            continue
        fig.add_trace(go.Scatter(
            x=sel["peak_bytes"] / MiB, y=sel["throughput"], mode="markers+text",
            text=sel["label"], textposition="top center", name=name, marker=marker,
            customdata=_custom(sel, over), hovertemplate=hover))
    peak = float(plans["peak_bytes"].max())
    x_title = "peak memory of the fullest IPU (MiB)"
    if capacity_bytes and capacity_bytes > 2 * peak:
        # off scale: named in the axis title, where no point or legend can cover it
        x_title += f" · IPU memory {capacity_bytes / MiB:,.0f} MiB is off the scale"
    elif capacity_bytes:
        fig.add_vline(x=capacity_bytes / MiB, line={"color": CAPACITY_COLOUR, "dash": "dash"})
        fig.add_annotation(x=capacity_bytes / MiB, y=1, yref="paper", xanchor="right",
                           yanchor="top", showarrow=False,
                           text=f"IPU memory {capacity_bytes / MiB:,.0f} MiB",
                           font={"color": CAPACITY_COLOUR, "size": 11})
    fig.update_xaxes(title_text=x_title, rangemode="tozero")
    fig.update_yaxes(title_text="samples/s", rangemode="tozero")
    return base_layout(fig, title, height=460)


def amp_steps_figure(steps: pd.DataFrame | None,
                     title: str = "What each AMP step trades, per IPU") -> go.Figure:
    """One line per IPU through its AMP steps (popviz.analysis.amp.amp_steps): temporary
    memory of the fullest tile (x) against conv / matmul cycles of one micro-batch (y),
    each point labelled with its AMP, the one in force as a star."""
    if steps is None or steps.empty:
        return empty_figure("No convolution or matmul to re-plan.", title)
    fig = go.Figure()
    sides = _label_sides(steps.groupby("ipu")["cycles"].mean())
    spans = (float(np.ptp(steps["temp_bytes"])) or 1.0, float(np.ptp(steps["cycles"])) or 1.0)
    for ipu, g in steps.groupby("ipu", sort=True):
        g = _merged(g.sort_values("amp"))
        custom = np.stack([g["label"].to_numpy(), g["serial_ops"].to_numpy(),
                           g["over_amp_ops"].to_numpy()], axis=1)
        fig.add_trace(go.Scatter(
            x=g["temp_bytes"] / KiB, y=g["cycles"] / 1e6, mode="lines+markers+text",
            name=f"IPU{ipu}", text=g["label"],
            textposition=_apart(g, sides[ipu], spans),
            cliponaxis=False,  # a label at the axis' end is not cut off
            marker={"size": [16 if f else 8 for f in g["in_force"]],
                    "symbol": ["star" if f else "circle" for f in g["in_force"]]},
            customdata=custom,
            hovertemplate=(f"<b>IPU{ipu}</b> · AMP %{{customdata[0]}}<br>%{{y:.3f}} Mcycles "
                           "· %{x:,.0f} KiB temporary on the fullest tile<br>"
                           "%{customdata[1]} op(s) in serial slices · %{customdata[2]} "
                           "over the bound<extra></extra>")))
    fig.update_xaxes(title_text="temporary memory of the fullest tile (KiB)")
    fig.update_yaxes(title_text="conv / matmul Mcycles per micro-batch")
    return base_layout(fig, title + " (the star: in force)", height=420)


def _label_sides(level: pd.Series) -> dict[Hashable, str]:
    """Where each line's AMP labels go: on the side with more room to the next line
    (by each line's mean height), so labels of lines that run close do not overlap."""
    order = level.sort_values()
    values = order.to_numpy(dtype=float)
    out = {}
    for i, key in enumerate(order.index):
        below = values[i] - values[i - 1] if i > 0 else np.inf
        above = values[i + 1] - values[i] if i + 1 < len(values) else np.inf
        out[key] = "top center" if above >= below else "bottom center"
    return out


def _merged(steps: pd.DataFrame) -> pd.DataFrame:
    """Consecutive AMP steps with the same cycles and temporary memory as one point,
    labelled with their range ('0.3-0.6'): the plans did not change between them."""
    key = steps[["cycles", "temp_bytes"]].ne(steps[["cycles", "temp_bytes"]].shift()).any(
        axis=1).cumsum()
    rows = []
    for _, g in steps.groupby(key, sort=False):
        lo, hi = float(g["amp"].iloc[0]), float(g["amp"].iloc[-1])
        rows.append(g.iloc[0].to_dict() | {
            "label": f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}",
            "in_force": bool(g["in_force"].any())})
    return pd.DataFrame(rows)


def _apart(points: pd.DataFrame, side: str, spans: tuple[float, float],
           near: float = 0.04) -> list[str]:
    """Each point's label position: `side` ("top center" / "bottom center"), except two
    neighbouring points within `near` of the axes' spans in both x and y (AMP 0.15 and 0.2
    a few KiB apart), whose labels go left and right of their markers instead of on top
    of each other."""
    vert = side.split()[0]
    out = [side] * len(points)
    x = points["temp_bytes"].to_numpy(np.float64) / spans[0]
    y = points["cycles"].to_numpy(np.float64) / spans[1]
    for i in range(1, len(points)):
        if abs(x[i] - x[i - 1]) < near and abs(y[i] - y[i - 1]) < near:
            left = i if x[i] < x[i - 1] else i - 1
            out[left], out[i + i - 1 - left] = f"{vert} left", f"{vert} right"
    return out
