"""Liveness by section: per IPU, always-live, activations and temporaries stacked over
program steps, phase bands behind them (forward, backward, recompute, optimiser) with the
recomputation sections numbered, one marker per section bump, the y-axis fitted to the
data (the capacity drawn when on scale, named when not) and the optimiser steps folded out
of the opening view. Built from `popviz.analysis.liveness_sections`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from popviz.analysis.liveness_sections import fitted_range
from popviz.figures.lod import minmax_indices
from popviz.figures.style import CAPACITY_COLOUR, MiB, base_layout, empty_figure
from popviz.vocab import MODELLED, Naming

PIXELS = 1000
BAND_COLOURS = {"forward": "rgba(59,117,175,0.10)", "backward": "rgba(239,134,54,0.12)",
                "recompute": "rgba(142,107,191,0.16)", "optimiser": "rgba(120,120,120,0.10)"}
LAYERS = (("always_live_bytes", "always-live", "#3b75af", "rgba(59,117,175,0.45)"),
          ("activation_bytes", "activations (stash, recomputed, inputs)", "#e07b24",
           "rgba(239,134,54,0.55)"),
          ("temporary_bytes", "temporaries (one op's working memory)", "#9aa5b1",
           "rgba(154,165,177,0.45)"))


def opening_range(bands: pd.DataFrame) -> tuple[float, float] | None:
    """Steps to open on: everything before the trailing optimiser plus a sliver of it (the
    optimiser is folded: its steps would otherwise take a third of the axis). None when
    that hides nothing (no optimiser at the end, or one too short to fold)."""
    hidden = folded_steps(bands)
    if hidden is None:
        return None
    return -0.5, hidden[2]


def folded_steps(bands: pd.DataFrame) -> tuple[int, int, float] | None:
    """(first, last, end): the optimiser steps past the opening view's `end`. Only steps
    after every IPU's last forward/backward step are folded; None when none are."""
    if bands.empty:
        return None
    opt = bands[bands["phase"] == "optimiser"]
    rest = bands[bands["phase"] != "optimiser"]
    if opt.empty or rest.empty:
        return None
    last = float(rest["last_step"].max())
    end = last + max(2.0, 0.03 * last)
    past = opt[opt["last_step"] > end]
    if past.empty:
        return None
    first = max(int(past["first_step"].min()), int(np.floor(end)) + 1)
    return first, int(past["last_step"].max()), end


def band_labels(bands: pd.DataFrame, lo: float, hi: float,
                pixels: int = PIXELS) -> list[tuple[float, str]]:
    """(x, text) of the band labels that fit: a band as wide as its label gets it; runs of
    narrower bands (a pipeline's alternating F and B) share one label ('F/B') when the run
    is wide enough, so no two labels overlap."""
    per_step = pixels / max(hi - lo, 1e-9)

    def fits(a: float, b: float, text: str) -> bool:
        return (b - a) * per_step >= 6.5 * len(text) + 8  # ~10px font

    out: list[tuple[float, str]] = []
    run: list[tuple[float, float, str]] = []

    def close() -> None:
        if run:
            names = list(dict.fromkeys(t for _, _, t in run))
            text = names[0] if len(names) == 1 else "/".join(names)
            if fits(run[0][0], run[-1][1], text):
                out.append(((run[0][0] + run[-1][1]) / 2, text))
            run.clear()

    for band in _visible(bands, lo, hi).itertuples():
        a, b = max(band.first_step - 0.5, lo), min(band.last_step + 0.5, hi)
        if fits(a, b, str(band.label)):
            close()
            out.append(((a + b) / 2, str(band.label)))
        else:
            run.append((a, b, str(band.label)))
    close()
    return out


def _visible(bands: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    return bands[(bands["last_step"] >= lo) & (bands["first_step"] <= hi)]


def liveness_sections_figure(layers: pd.DataFrame, bands: pd.DataFrame,
                             bumps: pd.DataFrame, capacity_bytes: float | None = None,
                             start: float | None = None, end: float | None = None,
                             pixels: int = PIXELS, naming: Naming = MODELLED,
                             title: str = "Liveness by section",
                             click: str = "click a step to list the variables live there"
                             ) -> go.Figure:
    """One panel per IPU. `layers` from liveness_layers, `bands` from phase_bands, `bumps`
    from section_bumps. Without start/end the view opens with the optimiser folded.
    `layout.meta`: points per IPU, range, capacity_on_scale, bands drawn."""
    if layers.empty:
        return empty_figure("This profile has no liveness report.", title)
    ipus = sorted(int(i) for i in layers["ipu"].unique())
    folded = start is None and end is None and opening_range(bands) is not None
    if folded:
        start, end = opening_range(bands)
    steps_all = layers["step"]
    lo = float(steps_all.min()) if start is None else float(start)
    hi = float(steps_all.max()) if end is None else float(end)
    fig = make_subplots(rows=len(ipus), cols=1, shared_xaxes=True,
                        vertical_spacing=min(0.08, 0.3 / len(ipus)),
                        subplot_titles=[naming.label(i) for i in ipus])
    y0, y1, cap_on = fitted_range(layers, capacity_bytes)
    points: dict[str, int] = {}
    drawn_bands = 0
    for row, ipu in enumerate(ipus, start=1):
        g = layers[layers["ipu"] == ipu].sort_values("step")
        steps = g["step"].to_numpy()
        a = max(0, int(np.searchsorted(steps, lo, side="left")) - 1)
        b = min(len(steps), int(np.searchsorted(steps, hi, side="right")) + 1)
        g = g.iloc[a:b]
        total = (g["always_live_bytes"] + g["not_always_live_bytes"]).to_numpy(float)
        keep = minmax_indices(total, pixels)
        dev = naming.label(ipu)
        points[dev] = len(keep)
        x = g["step"].to_numpy()[keep]
        custom = np.empty((len(keep), 4), dtype=object)
        custom[:, 0] = g["label"].astype(str).to_numpy()[keep] if "label" in g else ""
        custom[:, 1] = g["phase"].astype(str).to_numpy()[keep] if "phase" in g else ""
        custom[:, 2] = g["not_always_live_bytes"].to_numpy(float)[keep] / MiB
        custom[:, 3] = ipu  # a click finds its IPU
        for col, name, line, fill in LAYERS:
            y = g[col].to_numpy(float)[keep] / MiB
            fig.add_trace(go.Scatter(
                x=x, y=y, name=name, legendgroup=col, showlegend=row == 1, mode="lines",
                stackgroup=f"ipu{ipu}", line={"color": line, "width": 1}, fillcolor=fill,
                customdata=custom,
                hovertemplate=f"step %{{x}} · %{{customdata[1]}} · %{{customdata[0]}}<br>"
                f"{name}: %{{y:,.1f}} MiB<extra>{dev}</extra>"), row=row, col=1)
        mine = bands[bands["ipu"] == ipu]
        for band in _visible(mine, lo, hi).itertuples():
            fig.add_vrect(x0=band.first_step - 0.5, x1=band.last_step + 0.5,
                          fillcolor=BAND_COLOURS.get(band.phase, "rgba(0,0,0,0.05)"),
                          line_width=0, layer="below", row=row, col=1)
            drawn_bands += 1
        for x_label, text in band_labels(mine, lo, hi, pixels):
            fig.add_annotation(
                x=x_label, y=0.99, xref=f"x{row if row > 1 else ''}",
                yref=f"y{row if row > 1 else ''} domain", yanchor="top", text=text,
                showarrow=False, font={"size": 10, "color": "#444"}, name="band-label")
        bp = bumps[(bumps["ipu"] == ipu) & (bumps["step"] >= lo) & (bumps["step"] <= hi)] \
            if len(bumps) else bumps
        if len(bp):
            top = g.set_index("step")
            ys = [(top.loc[s, "always_live_bytes"] + top.loc[s, "activation_bytes"]) / MiB
                  if s in top.index else np.nan for s in bp["step"]]
            bcustom = np.empty((len(bp), 4), dtype=object)
            bcustom[:, 0] = bp["label"].to_numpy()
            bcustom[:, 1] = (bp["rise"] / MiB).to_numpy()
            bcustom[:, 2] = (bp["fall"] / MiB).to_numpy()
            bcustom[:, 3] = ipu
            fig.add_trace(go.Scatter(
                x=bp["step"], y=ys, mode="markers+text", name="section bump",
                legendgroup="bump", showlegend=row == 1, text=bp["label"],
                textposition="bottom center", textfont={"size": 10},  # under the band labels
                marker={"symbol": "triangle-down", "size": 11, "color": "#222"},
                customdata=bcustom,
                hovertemplate="section %{customdata[0]}: activations peak at step %{x}<br>"
                "rise %{customdata[1]:,.1f} MiB, fall %{customdata[2]:,.1f} MiB"
                f"<extra>{dev}</extra>"), row=row, col=1)
        if capacity_bytes and cap_on:
            fig.add_hline(y=capacity_bytes / MiB, line={"color": CAPACITY_COLOUR,
                                                        "dash": "dash", "width": 1.5},
                          row=row, col=1)
        fig.update_yaxes(title_text="MiB", range=[y0 / MiB, y1 / MiB], row=row, col=1)
    if capacity_bytes:
        cap_text = f"{naming.device} capacity ({capacity_bytes / MiB:,.0f} MiB)"
        if cap_on:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=cap_text,
                                     line={"color": CAPACITY_COLOUR, "dash": "dash"}))
        else:
            fig.add_annotation(
                text=f"{cap_text} is off scale: peak use is {y1 / 1.12 / capacity_bytes:.0%}"
                " of it", xref="paper", yref="paper", x=1, y=1.0, xanchor="right",
                yanchor="bottom", showarrow=False, font={"size": 11, "color": CAPACITY_COLOUR},
                name="capacity-note")
    hidden = folded_steps(bands) if folded else None
    if hidden is not None:
        first, last, _ = hidden
        steps_text = f"step {first:,}" if first == last else f"steps {first:,}–{last:,}"
        fig.add_annotation(
            text=f"optimiser {steps_text} folded out of view (pan right or zoom out to see "
            f"{'it' if first == last else 'them'})",
            xref="paper", yref="paper", x=1, y=-0.09, xanchor="right", yanchor="top",
            showarrow=False, font={"size": 11, "color": "#555"}, name="fold-note")
    fig.update_xaxes(title_text="compute action on the rank" if naming.measured
                     else "program step", row=len(ipus), col=1)
    fig.update_xaxes(range=[lo, hi])
    fig.update_layout(uirevision="liveness", hovermode="closest",
                      meta={"points": points, "range": [lo, hi], "folded": folded,
                            "capacity_on_scale": bool(capacity_bytes and cap_on),
                            "bands": drawn_bands})
    height = max(360, 110 + 200 * len(ipus))
    base_layout(fig, f"{title} · {click}" if click else title, height)
    # title on the first line, legend on the second, then the first panel's title
    fig.update_layout(margin={"t": 105},
                      title={"y": 1 - 12 / height, "yref": "container", "yanchor": "top"},
                      legend={"y": 1 - 42 / height, "yref": "container", "yanchor": "top",
                              "x": 1, "xanchor": "right"})
    return fig
