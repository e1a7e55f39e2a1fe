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
# a bump this close to the peak's star (px) has its label as a note beside the star, its
# edge STAR_CLEAR_PX from the nearer marker's middle (the star is 14 px across, 16 with
# its white rim)
ON_STAR_PX = 4.0
STAR_CLEAR_PX = 11
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
        first, last = float(band.first_step), float(band.last_step)  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
        a, b = max(first - 0.5, lo), min(last + 0.5, hi)
        if fits(a, b, str(band.label)):
            close()
            out.append(((a + b) / 2, str(band.label)))
        else:
            run.append((a, b, str(band.label)))
    close()
    return out


def _visible(bands: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    return bands[(bands["last_step"] >= lo) & (bands["first_step"] <= hi)]


def _hover_head(steps: np.ndarray, phase: np.ndarray, label: np.ndarray) -> list[str]:
    """'step 12 · forward · conv1' with the fields a step has (no empty ' ·  · ')."""
    return [" · ".join([f"step {int(x)}"] + [str(v) for v in (p, lab)
                                              if str(v) and str(v) != "nan"])
            for x, p, lab in zip(steps, phase, label, strict=True)]


def _own_range(layers: pd.DataFrame, bands: pd.DataFrame, ipu: int
               ) -> tuple[float, float, tuple[int, int, float] | None]:
    """An IPU's opening view over its own steps: to its own end, its trailing optimiser
    folded; (lo, hi, the folded steps or None)."""
    mine = bands[bands["ipu"] == ipu] if len(bands) else bands
    steps = layers.loc[layers["ipu"] == ipu, "step"]
    hidden = folded_steps(mine)
    if hidden is not None:
        return -0.5, hidden[2], hidden
    return float(steps.min()), float(steps.max()), None


def liveness_sections_figure(layers: pd.DataFrame, bands: pd.DataFrame,
                             bumps: pd.DataFrame, capacity_bytes: float | None = None,
                             start: float | None = None, end: float | None = None,
                             pixels: int = PIXELS, naming: Naming = MODELLED,
                             title: str = "Liveness by section",
                             click: str = "click a step to list the variables live there",
                             ranges: dict[int, tuple[float, float]] | None = None
                             ) -> go.Figure:
    """One panel per IPU, each on its own x-axis (each IPU counts its own steps).
    `layers` from liveness_layers, `bands` from phase_bands, `bumps` from section_bumps.
    start/end set every panel's steps; `ranges` (IPU -> steps) single panels; a panel
    given neither opens on its own program with its trailing optimiser folded. A star
    marks each IPU's peak. `layout.meta`: points per IPU, range (the first panel's),
    ranges, folded, capacity_on_scale, bands drawn."""
    if layers.empty:
        return empty_figure("This profile has no liveness report.", title)
    ipus = sorted(int(i) for i in layers["ipu"].unique())
    spans: dict[int, tuple[float, float]] = {}
    hidden_of: dict[int, tuple[int, int, float]] = {}
    for ipu in ipus:
        if start is not None or end is not None:
            own = _own_range(layers, pd.DataFrame(columns=["ipu"]), ipu)
            spans[ipu] = (own[0] if start is None else float(start),
                          own[1] if end is None else float(end))
        elif ranges and ipu in ranges:
            spans[ipu] = (float(ranges[ipu][0]), float(ranges[ipu][1]))
        else:
            lo_i, hi_i, hidden = _own_range(layers, bands, ipu)
            spans[ipu] = (lo_i, hi_i)
            if hidden is not None:
                hidden_of[ipu] = hidden
    folded = bool(hidden_of)
    fig = make_subplots(rows=len(ipus), cols=1, shared_xaxes=False,
                        vertical_spacing=min(0.1, 0.36 / len(ipus)),
                        subplot_titles=[naming.label(i) for i in ipus])
    y0, y1, cap_on = fitted_range(layers, capacity_bytes)
    points: dict[str, int] = {}
    drawn_bands = 0
    band_shapes: list[dict[str, object]] = []
    band_notes: list[dict[str, object]] = []  # the bands' labels, added at once too
    axes: dict[str, dict[str, object]] = {}  # each panel's x and y axis
    for row, ipu in enumerate(ipus, start=1):
        lo, hi = spans[ipu]
        g = layers[layers["ipu"] == ipu].sort_values("step")
        whole = g
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
        empty = np.full(len(g), "", dtype=object)
        custom[:, 0] = _hover_head(
            x, (g["phase"].astype(str).to_numpy() if "phase" in g else empty)[keep],
            (g["label"].astype(str).to_numpy() if "label" in g else empty)[keep])
        custom[:, 1] = ""
        custom[:, 2] = g["not_always_live_bytes"].to_numpy(float)[keep] / MiB
        custom[:, 3] = ipu  # a click finds its IPU
        for col, name, line, fill in LAYERS:
            y = g[col].to_numpy(float)[keep] / MiB
            fig.add_trace(go.Scatter(
                x=x, y=y, name=name, legendgroup=col, showlegend=row == 1, mode="lines",
                stackgroup=f"ipu{ipu}", line={"color": line, "width": 1}, fillcolor=fill,
                customdata=custom,
                hovertemplate=f"%{{customdata[0]}}<br>"
                f"{name}: %{{y:,.1f}} MiB<extra>{dev}</extra>"), row=row, col=1)
        mine = bands[bands["ipu"] == ipu]
        shown = _visible(mine, lo, hi)
        axis = "" if row == 1 else str(row)
        # one list, added once below: add_vrect per band re-validates every shape so far
        # (847 bands of a 2-rank run folded onto one panel took minutes)
        band_shapes += [{"type": "rect", "xref": f"x{axis}", "yref": f"y{axis} domain",
                         "x0": first - 0.5, "x1": last + 0.5, "y0": 0, "y1": 1,
                         "fillcolor": BAND_COLOURS.get(phase, "rgba(0,0,0,0.05)"),
                         "line": {"width": 0}, "layer": "below"}
                        for first, last, phase in zip(
                            shown["first_step"].tolist(), shown["last_step"].tolist(),
                            shown["phase"].tolist(), strict=True)]
        drawn_bands += len(shown)
        band_notes += [{"x": x_label, "y": 0.99, "xref": f"x{axis}", "yref": f"y{axis} domain",
                        "yanchor": "top", "text": text, "showarrow": False,
                        "font": {"size": 10, "color": "#444"}, "name": "band-label"}
                       for x_label, text in band_labels(mine, lo, hi, pixels)]
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
            # under the band labels, or beside the triangle, away from the peak's star
            # when it is near (the two overlapped)
            star = _peak_step(whole)
            where: list[str] | str = "bottom center"
            texts = [str(t) for t in bp["label"]]
            if star is not None and hi > lo:
                per_step = pixels / (hi - lo)  # px, as band_labels reckons them
                # near: the star (7 px across its middle) within half the label's width
                # (10 px text, about 6.5 px a character) and a little
                where = [("middle left" if star >= b else "middle right")
                         if abs(star - b) * per_step <= 9 + 3.3 * len(text)
                         else "bottom center"
                         for b, text in zip(bp["step"].astype(float), texts, strict=True)]
                # on the star (a bump's top is often the peak itself): a label beside the
                # triangle starts inside the star (8 px each side of its middle), so it is
                # a note clear of both markers instead
                for k, (b, y_b) in enumerate(zip(bp["step"].astype(float), ys, strict=True)):
                    if abs(star - b) * per_step < ON_STAR_PX and np.isfinite(y_b):
                        # on the star's far side (left when on it) if the panel has
                        # room there, else the other: a note past the outer marker clears
                        # both either way
                        need = (STAR_CLEAR_PX + 6.5 * len(texts[k])) / per_step
                        left = star >= b
                        if (min(star, b) - lo < need) if left else (hi - max(star, b) < need):
                            left = not left
                        band_notes.append({
                            "x": min(star, b) if left else max(star, b), "y": y_b,
                            "xref": f"x{axis}", "yref": f"y{axis}", "text": texts[k],
                            "xanchor": "right" if left else "left",
                            "xshift": -STAR_CLEAR_PX if left else STAR_CLEAR_PX,
                            "yanchor": "middle", "showarrow": False,
                            "font": {"size": 10}, "name": "bump-label"})
                        texts[k] = ""
            fig.add_trace(go.Scatter(
                x=bp["step"], y=ys, mode="markers+text", name="section bump",
                legendgroup="bump", showlegend=row == 1, text=texts,
                textposition=where, textfont={"size": 10},
                marker={"symbol": "triangle-down", "size": 11, "color": "#222"},
                customdata=bcustom,
                hovertemplate="section %{customdata[0]}: activations peak at step %{x}<br>"
                "rise %{customdata[1]:,.1f} MiB, fall %{customdata[2]:,.1f} MiB"
                f"<extra>{dev}</extra>"), row=row, col=1)
        if len(whole):  # the IPU's peak (always-live + not-always-live), starred
            total_all = (whole["always_live_bytes"] + whole["not_always_live_bytes"]) \
                .to_numpy(float)
            at = int(np.argmax(total_all))
            step = float(whole["step"].iloc[at])
            if lo <= step <= hi:
                head = _hover_head(np.array([step]), np.array(
                    [whole["phase"].iloc[at] if "phase" in whole else ""]), np.array(
                    [whole["label"].iloc[at] if "label" in whole else ""]))[0]
                fig.add_trace(go.Scatter(
                    x=[step], y=[total_all[at] / MiB], mode="markers", name="peak",
                    legendgroup="peak", showlegend=row == 1,
                    marker={"symbol": "star", "size": 14, "color": "#c53a32",
                            "line": {"color": "white", "width": 1}},
                    customdata=[[head, "", whole["not_always_live_bytes"].iloc[at] / MiB,
                                 ipu]],
                    hovertemplate=f"peak · %{{customdata[0]}}<br>%{{y:,.1f}} MiB in all"
                    f"<extra>{dev}</extra>"), row=row, col=1)
        axes[f"xaxis{axis}"] = {"range": [lo, hi]}  # set at once below, as the shapes
        if capacity_bytes and cap_on:
            band_shapes.append({"type": "line", "xref": f"x{axis} domain", "x0": 0, "x1": 1,
                                "yref": f"y{axis}", "y0": capacity_bytes / MiB,
                                "y1": capacity_bytes / MiB,
                                "line": {"color": CAPACITY_COLOUR, "dash": "dash",
                                         "width": 1.5}})
        axes[f"yaxis{axis}"] = {"title": {"text": "MiB"}, "range": [y0 / MiB, y1 / MiB]}
    fig.update_layout(axes)  # per panel: one update, not a scan of every axis per panel
    if band_shapes:
        fig.update_layout(shapes=[*fig.layout.shapes, *band_shapes])
    if band_notes:  # one list: add_annotation per label re-validates every one so far
        fig.update_layout(annotations=[*fig.layout.annotations, *band_notes])
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
    height = max(360, 130 + 210 * len(ipus))
    if folded:
        texts = []
        for ipu, (first, last, _) in sorted(hidden_of.items()):
            steps_text = f"step {first:,}" if first == last else f"steps {first:,}–{last:,}"
            texts.append(steps_text if len(ipus) == 1 else
                         f"{naming.label(ipu)} {steps_text}")
        one = len(hidden_of) == 1 and next(iter(hidden_of.values()))[0] == \
            next(iter(hidden_of.values()))[1]
        # at the foot of the bottom margin (78 px): a fixed paper offset fell off the
        # figure when several IPUs made it tall
        fig.add_annotation(
            text=f"optimiser {'; '.join(texts)} folded out of view (pan right or zoom out "
            f"to see {'it' if one else 'them'})",
            xref="paper", yref="paper", x=1, y=-(78 - 6) / (height - 105 - 78),
            xanchor="right",
            yanchor="bottom", showarrow=False, font={"size": 11, "color": "#555"},
            name="fold-note")
    fig.update_xaxes(title_text="compute action on the rank" if naming.measured
                     else f"program step (each {naming.device} counts its own)" if len(ipus) > 1
                     else "program step", row=len(ipus), col=1)
    first_span = spans[ipus[0]]
    fig.update_layout(uirevision="liveness", hovermode="closest",
                      meta={"points": points, "range": list(first_span),
                            "ranges": {str(i): list(v) for i, v in spans.items()},
                            "folded": folded,
                            "capacity_on_scale": bool(capacity_bytes and cap_on),
                            "bands": drawn_bands})
    base_layout(fig, f"{title} · {click}" if click else title, height)
    # title on the first line, legend on the second, then the first panel's title
    fig.update_layout(margin={"t": 105, "b": 78},
                      title={"y": 1 - 12 / height, "yref": "container", "yanchor": "top"},
                      legend={"y": 1 - 42 / height, "yref": "container", "yanchor": "top",
                              "x": 1, "xanchor": "right"})
    return fig


def _peak_step(whole: pd.DataFrame) -> float | None:
    """The step of a device's peak (always-live + not-always-live), where its star goes."""
    if not len(whole):
        return None
    total = (whole["always_live_bytes"] + whole["not_always_live_bytes"]).to_numpy(float)
    return float(whole["step"].iloc[int(np.argmax(total))])
