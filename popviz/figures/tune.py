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
    # near in the plot's own frame: both axes run from zero (tune_figure), so two plans
    # 0.1% apart print on one spot however far apart they are relative to each other
    span_x = max(float(np.ptp(x)), float(np.abs(x).max(initial=0.0)), 1.0)
    span_y = max(float(np.ptp(y)), float(np.abs(y).max(initial=0.0)), 1.0)
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
    plans = plans.assign(label=point_labels(plans)).reset_index(drop=True)
    # two clusters a little more than `near` apart print their labels into each other
    # ("now, #2" over "#1"): each label moved off the others and off every marker
    sizes = [16 if p == "now" else 11 for p in plans["plan"]]
    xs, ys = (plans["peak_bytes"] / MiB).to_numpy(float), plans["throughput"].to_numpy(float)
    where = unclash([(np.array([x]), np.array([y]), [text], [size], ["top center"])
                     for x, y, text, size in zip(xs, ys, plans["label"], sizes, strict=True)],
                    ranges=((0.0, float(xs.max())), (0.0, float(ys.max()))))  # from zero
    plans = plans.assign(position=[w[0] for w in where])
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
            text=sel["label"], textposition=sel["position"].tolist(), name=name,
            marker=marker,
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
    lines: dict[int, pd.DataFrame] = {int(ipu): _merged(g.sort_values("amp"))  # type: ignore[arg-type]  # pandas-stubs: a group key is any scalar
                                      for ipu, g in steps.groupby("ipu", sort=True)}
    where = unclash([(g["temp_bytes"].to_numpy(np.float64) / KiB,
                      g["cycles"].to_numpy(np.float64) / 1e6,
                      [str(t) for t in g["label"]], [16 if f else 8 for f in g["in_force"]],
                      _apart(g, sides[ipu], spans)) for ipu, g in lines.items()])
    for (ipu, g), positions in zip(lines.items(), where, strict=True):
        custom = np.stack([g["label"].to_numpy(), g["serial_ops"].to_numpy(),
                           g["over_amp_ops"].to_numpy()], axis=1)
        fig.add_trace(go.Scatter(
            x=g["temp_bytes"] / KiB, y=g["cycles"] / 1e6, mode="lines+markers+text",
            name=f"IPU{ipu}", text=g["label"],
            textposition=positions,
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


# unclash's picture of the plot, in pixels: a narrow plot (the page gives it more on most
# screens, so a label judged clear here is clear there) and a 12 px font's digits
PLOT_PX = (900.0, 310.0)
CHAR_PX, TEXT_PX, GAP_PX = 7.0, 14.0, 2.0
POSITIONS = ("top center", "bottom center", "middle right", "middle left", "top right",
             "top left", "bottom right", "bottom left")
Box = tuple[float, float, float, float]  # x0, x1, y0, y1 in pixels, y up


def label_box(x: float, y: float, text: str, size: float, position: str) -> Box:
    """Where Plotly draws a marker's text at `position`, in pixels (see PLOT_PX)."""
    w, h, r = len(text) * CHAR_PX, TEXT_PX, size / 2 + GAP_PX
    vert, horiz = position.split()
    x0 = {"center": x - w / 2, "right": x + r, "left": x - r - w}[horiz]
    y0 = {"middle": y - h / 2, "top": y + r, "bottom": y - r - h}[vert]
    return x0, x0 + w, y0, y0 + h


def _overlap(a: Box, b: Box) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0])) * \
        max(0.0, min(a[3], b[3]) - max(a[2], b[2]))


def unclash(lines: list[tuple[np.ndarray, np.ndarray, list[str], list[int], list[str]]],
            ranges: tuple[tuple[float, float], tuple[float, float]] | None = None
            ) -> list[list[str]]:
    """Each line's label positions, moved where a label would print over another line's
    label, marker or segment (two IPUs' AMP 0.1 points a few KiB apart): per line (x, y,
    texts, marker sizes, preferred positions); each label keeps its preferred position
    when that is clear, else takes the first of POSITIONS that is, else the least
    covered. Judged in pixels of a PLOT_PX plot over the points' own range, or over
    `ranges` ((x0, x1), (y0, y1)) where the axes are set otherwise (from zero)."""
    xs = np.concatenate([ln[0] for ln in lines]) if lines else np.zeros(0)
    ys = np.concatenate([ln[1] for ln in lines]) if lines else np.zeros(0)
    if not len(xs):
        return [list(ln[4]) for ln in lines]

    def scale(v: np.ndarray, px: float, axis: tuple[float, float] | None) -> np.ndarray:
        lo, hi = axis if axis is not None else (float(v.min()), float(v.max()))
        pad = (hi - lo) * 0.05 or 1.0  # about Plotly's autorange padding
        return (v - lo + pad) / (hi - lo + 2 * pad) * px

    sx = scale(xs, PLOT_PX[0], ranges[0] if ranges else None)
    sy = scale(ys, PLOT_PX[1], ranges[1] if ranges else None)
    cuts = np.cumsum([0] + [len(ln[0]) for ln in lines])
    points = [(sx[cuts[k]:cuts[k + 1]], sy[cuts[k]:cuts[k + 1]]) for k in range(len(lines))]
    # obstacles: every marker, and each segment as a row of small dots
    blocked: list[Box] = []
    for (px_, py_), ln in zip(points, lines, strict=True):
        for x, y, size in zip(px_, py_, ln[3], strict=True):
            blocked.append((x - size / 2, x + size / 2, y - size / 2, y + size / 2))
        for k in range(1, len(px_)):
            n = max(2, int(np.hypot(px_[k] - px_[k - 1], py_[k] - py_[k - 1]) / 4))
            for t in np.linspace(0, 1, n)[1:-1]:
                x = px_[k - 1] + t * (px_[k] - px_[k - 1])
                y = py_[k - 1] + t * (py_[k] - py_[k - 1])
                blocked.append((x - 1.5, x + 1.5, y - 1.5, y + 1.5))
    out = []
    for (px_, py_), ln in zip(points, lines, strict=True):
        chosen = []
        for x, y, text, size, want in zip(px_, py_, ln[2], ln[3], ln[4], strict=True):
            own = (x - size / 2, x + size / 2, y - size / 2, y + size / 2)
            options = [want, *(p for p in POSITIONS if p != want)]
            costs = []
            for pos in options:
                box = label_box(x, y, text, size, pos)
                costs.append(sum(_overlap(box, b) for b in blocked if b != own))
                if costs[-1] == 0:
                    break
            pick = options[int(np.argmin(costs))]
            chosen.append(pick)
            blocked.append(label_box(x, y, text, size, pick))
        out.append(chosen)
    return out
