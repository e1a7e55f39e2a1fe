"""The plans of `popviz tune`: throughput against peak memory, the Pareto front drawn, the
current layout starred, plans that do not fit crossed out, the IPU's memory as a line."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.figures.style import CAPACITY_COLOUR, MiB, base_layout, empty_figure

FITS = "#3f9142"
NO_FIT = "#9aa5b1"
FRONT = "#3b75af"


def _custom(plans: pd.DataFrame) -> np.ndarray:
    out = np.empty((len(plans), 6), dtype=object)
    out[:, 0] = plans["splits"].to_numpy()
    out[:, 1] = plans["amp"].to_numpy()
    out[:, 2] = ["on" if r else "off" for r in plans["recomputation"]]
    out[:, 3] = plans["schedule"].to_numpy()
    out[:, 4] = plans["vs_now"].to_numpy()
    out[:, 5] = ["fits" if f else f"does NOT fit ({n} tiles)" for f, n in
                 zip(plans["fits"], plans["oom_tiles"], strict=True)]
    return out


def tune_figure(plans: pd.DataFrame, capacity_bytes: float | None = None,
                title: str = "Plans: throughput against peak memory") -> go.Figure:
    """Scatter of `plans` (advise.plans.plans_table)."""
    if plans.empty:
        return empty_figure("No plans.", title)
    hover = ("<b>%{text}</b> · %{customdata[5]}<br>%{y:,.0f} samples/s "
             "(%{customdata[4]:.2f}x now) · peak %{x:,.0f} MiB on the fullest IPU<br>"
             "splits %{customdata[0]}<br>AMP %{customdata[1]} · recomputation "
             "%{customdata[2]} · %{customdata[3]}<extra></extra>")
    fig = go.Figure()
    front = plans[plans["pareto"]].sort_values("peak_bytes")
    if len(front) > 1:
        fig.add_trace(go.Scatter(x=front["peak_bytes"] / MiB, y=front["throughput"],
                                 mode="lines", name="Pareto front (fits, nothing better on "
                                 "both)", line={"color": FRONT, "width": 1.5, "dash": "dot"},
                                 hoverinfo="skip"))
    for name, sel, marker in (
            ("fits", plans[plans["fits"] & (plans["plan"] != "now")],
             {"color": FITS, "size": 11, "symbol": "circle"}),
            ("does not fit", plans[~plans["fits"] & (plans["plan"] != "now")],
             {"color": NO_FIT, "size": 11, "symbol": "x"}),
            ("now (this profile)", plans[plans["plan"] == "now"],
             {"color": "#222", "size": 16, "symbol": "star"})):
        if sel.empty:
            continue
        fig.add_trace(go.Scatter(
            x=sel["peak_bytes"] / MiB, y=sel["throughput"], mode="markers+text",
            text=sel["plan"], textposition="top center", name=name, marker=marker,
            customdata=_custom(sel), hovertemplate=hover))
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
