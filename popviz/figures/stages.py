"""Pipeline stages: compute / exchange / idle per IPU (rank when measured), bubble fraction,
stash, AMP (modelled profiles only)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from popviz.analysis.advice import amp_for
from popviz.analysis.balance import ipu_balance, stage_balance, stages_take_turns
from popviz.analysis.stash import stash_column
from popviz.figures.style import CATEGORY_COLOURS, MiB, base_layout, empty_figure
from popviz.metrics import stash
from popviz.vocab import IMBALANCE_LIMIT, MEASURED, MODELLED, Naming

_PARTS = [("forward_cycles", "forward", "F"), ("backward_cycles", "backward", "B"),
          ("recompute_cycles", "recompute", "R"), ("optimiser_cycles", "weight update", "WU"),
          ("other_cycles", "other compute", "compute"),
          ("exchange_cycles", "exchange", "exchange"), ("idle_cycles", "idle", "idle"),
          ("untraced_cycles", "untraced (no event)", "untraced")]
# a measured rank's time no event covers: hatched grey, as /compare draws it
UNTRACED_BAR = {"color": "#ffffff", "line": {"color": "#8a8a8a", "width": 1},
                "pattern": {"shape": "/", "fgcolor": "#8a8a8a"}}
_COLOURS = {**CATEGORY_COLOURS, "untraced": "#b0b0b0"}
# a chart of more bars than this (a job's ranks) draws each series as one stepped area
# (bars a pixel wide: Chromium took 1.4 s for 1,024 stacked bars, and a label a bar
# overlapped), its figures in the hover
LABELLED_BARS = 64


def _bars(labels: list[str], y: Any, name: str, colour: str, hover: str,
          stack: str | None = None, marker: dict | None = None,
          **bar: Any) -> go.Bar | go.Scatter:
    """A bar a label, or past LABELLED_BARS one stepped area (stacked in `stack`);
    `marker`: the bars' own (else `colour`); `bar`: what both take (customdata,
    showlegend)."""
    if len(labels) <= LABELLED_BARS:
        return go.Bar(x=labels, y=y, name=name, marker=marker or {"color": colour},
                      hovertemplate=hover, **bar)
    area = {"stackgroup": stack} if stack else {"fill": "tozeroy"}
    return go.Scatter(x=labels, y=y, name=name, mode="lines", hovertemplate=hover,
                      line={"shape": "hvh", "width": 1, "color": colour},
                      fillcolor=colour, **area, **bar)


def ipu_time_figure(stages: pd.DataFrame, unit: str = "cycles",
                    title: str | None = None, naming: Naming | None = None,
                    sharded: bool = False) -> go.Figure:
    """Stacked compute (by pass) / exchange / idle bars per IPU, bubble fraction on top
    (`sharded`: the idle share, a sharded run has no pipeline to bubble). A measured
    profile's stage times are ns per recorded step (the mean); its time no event covers
    is a bar of its own, untraced, not compute."""
    naming = naming or (MEASURED if unit == "ns" else Naming(unit=unit))
    unit = naming.unit
    title = title or f"Time per {naming.device}"
    if stages.empty:
        return empty_figure("This profile has no stage table.", title)
    bal = ipu_balance(stages)
    labels = [naming.label(i) for i in bal["ipu"]]
    fig = go.Figure()
    for col, name, colour in _PARTS:
        if col in bal.columns and bal[col].sum() > 0:
            fig.add_trace(_bars(labels, bal[col], name, _COLOURS[colour],
                                "%{x}: %{y:,.0f} " + unit + "<extra>" + name + "</extra>",
                                stack="time",
                                marker=UNTRACED_BAR if colour == "untraced" else None))
    idle = [f"{b:.0%} idle" for b in bal["bubble_fraction"]]
    if len(labels) <= LABELLED_BARS:
        fig.add_trace(go.Scatter(
            x=labels, y=bal["total_cycles"], mode="text", showlegend=False, hoverinfo="skip",
            text=idle, textposition="top center"))
    else:  # no room for a label a bar: the idle share in the top part's hover
        top = fig.data[-1] if fig.data else None
        if top is not None:
            top.customdata = idle
            top.hovertemplate = top.hovertemplate.replace("<extra>", " (%{customdata})<extra>")
    fig.update_yaxes(title_text=f"{unit} per step" if naming.in_ns else unit,
                     tickformat=",d")
    base_layout(fig, title + (" (idle share on top: the shards take turns)" if sharded
                              else " (bubble fraction on top)"), height=380)
    # six categories do not fit in one row above the plot: list them on the right
    fig.update_layout(barmode="stack", legend={"orientation": "v", "x": 1.02, "y": 1,
                                               "xanchor": "left", "yanchor": "top"})
    return fig


def stage_load_figure(stages: pd.DataFrame, title: str = "Load per stage",
                      naming: Naming = MODELLED, sharded: bool = False) -> go.Figure:
    """Busy time of each stage relative to the mean: the bottleneck stands out in red, but
    only when it is one (above the advice's imbalance limit), so a balanced run is not
    painted as a problem. A sharded run's stages take turns (`sharded`): none waits for
    the heaviest, so none is red."""
    if stages.empty:
        return empty_figure("This profile has no stage table.", title)
    bal = stage_balance(stages)
    top = bal["busy_cycles"].idxmax()
    one_device = stages_take_turns(bal)  # never empty here: one stage is one device too
    unbalanced = float(bal["relative_load"].max()) > IMBALANCE_LIMIT and not one_device \
        and not sharded
    colours = ["#c53a32" if i == top and unbalanced else "#3b75af" for i in bal.index]
    labels = [f"stage {s} ({naming.label(i)})" for s, i in zip(bal["stage"], bal["ipu"])]
    hover = "%{x}: %{y:.2f}x the mean busy time<extra></extra>"
    if len(labels) <= LABELLED_BARS:
        fig = go.Figure(go.Bar(x=labels, y=bal["relative_load"], marker={"color": colours},
                               text=[f"{x:.2f}x" for x in bal["relative_load"]],
                               # inside the bar's top: an outside label of a bar near the
                               # mean (0.97x) sat on the mean line
                               textposition="inside", insidetextanchor="end",
                               textfont={"color": "white"}, showlegend=False,
                               hovertemplate=hover))
    else:  # one area, the bottleneck a red point on it when it is one
        fig = go.Figure(_bars(labels, bal["relative_load"], "load", "#3b75af", hover,
                              showlegend=False))
        if unbalanced:
            at = list(bal.index).index(top)
            fig.add_trace(go.Scatter(x=[labels[at]], y=[bal["relative_load"].iloc[at]],
                                     mode="markers", marker={"color": "#c53a32", "size": 9},
                                     showlegend=False, hovertemplate=hover))
    # under the bars, so a bar's label near 1.00x is not struck through; its name right of
    # the plot, where no bar reaches (inside, it sat on the line and the last bar)
    fig.add_hline(y=1.0, line={"color": "#555", "dash": "dot"}, layer="below",
                  annotation_text="mean", annotation_position="right",
                  annotation_font={"color": "#555"})
    fig.update_yaxes(title_text="busy / mean busy", rangemode="tozero")
    note = (f"one stage, on {naming.label(bal['ipu'].iloc[0])}" if len(bal) == 1
            else f"all on {naming.label(bal['ipu'].iloc[0])}: they run in turn" if one_device
            else "sharded: they run in turn" if sharded
            else "red: bottleneck" if unbalanced
            else f"busiest within {IMBALANCE_LIMIT - 1:.0%} of the mean")
    base_layout(fig, f"{title} ({note})", height=340)
    fig.update_layout(margin={"r": 50})  # room for the mean line's name
    return fig


def stash_figure(stages: pd.DataFrame, title: str = "Stash and peak memory per stage",
                 naming: Naming = MODELLED) -> go.Figure:
    """Stash and peak liveness per stage. A measured run's traces show no stash (not
    none: unknown), so its figure is the peak alone, with no empty stash bars."""
    if stages.empty or "stash_bytes" not in stages.columns:
        return empty_figure("This profile has no stash figures.", title)
    s = stages.sort_values("stage")
    labels = [f"stage {a} ({naming.label(b)})" for a, b in zip(s["stage"], s["ipu"])]
    if naming.measured:
        peak = _bars(labels, s["peak_bytes"] / MiB, "peak liveness", "#ef8636",
                     "%{x}: peak %{y:,.1f} MiB<extra></extra>", showlegend=False)
        fig = go.Figure(peak)
        fig.update_yaxes(title_text="MiB")
        return base_layout(fig, "Peak memory per stage (a run's traces show no stash)",
                           height=340)
    held = stash(s)  # the metrics core's definition: depth x bytes per micro-batch
    stash_part = _bars(labels, held["stash_bytes"] / MiB, "stash", "#8e6bbf",
                       "%{x}: stash %{customdata}<extra></extra>",
                       customdata=stash_column(s, measured=naming.measured))
    peak_part = _bars(labels, s["peak_bytes"] / MiB, "peak liveness", "#ef8636",
                      "%{x}: peak %{y:,.1f} MiB<extra></extra>")
    # grouped bars: stash first; areas: the smaller one drawn over the larger
    fig = go.Figure([peak_part, stash_part] if len(labels) > LABELLED_BARS
                    else [stash_part, peak_part])
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="MiB")
    return base_layout(fig, title, height=340)


AMP_NOT_MEASURED = ("availableMemoryProportion is an IPU compiler option: a measured run has "
                    "none.")
AMP_NOT_GPU = "availableMemoryProportion is an IPU compiler option: a GPU has none."


def amp_note(naming: Naming) -> str:
    """Why a profile without AMP shows none, in its words."""
    return AMP_NOT_GPU if naming.gpu_plan else AMP_NOT_MEASURED


def amp_figure(stages: pd.DataFrame, meta: dict, title: str = "availableMemoryProportion",
               naming: Naming = MODELLED) -> go.Figure:
    """AMP per stage (the stage table's `amp`, else the options in meta); a measured
    profile has no AMP, so it gets a note instead of the default."""
    if not naming.has_amp:
        return empty_figure(amp_note(naming), title)
    if stages.empty:
        return empty_figure("This profile has no stage table.", title)
    s = stages.sort_values("stage")
    amps = (s["amp"].astype(float).tolist() if "amp" in s.columns
            else [amp_for(meta, int(i)) for i in s["ipu"]])
    labels = [f"stage {a} ({naming.label(b)})" for a, b in zip(s["stage"], s["ipu"])]
    fig = go.Figure(go.Bar(x=labels, y=amps, marker={"color": "#519e3e"}, showlegend=False,
                           # inside the bar: above it the default's label would collide
                           text=[f"{a:g}" for a in amps], textposition="inside",
                           insidetextanchor="end", textfont={"color": "#fff"},
                           hovertemplate="%{x}: AMP %{y:g}<extra></extra>"))
    fig.add_hline(y=0.6, line={"color": "#555", "dash": "dot"}, annotation_text="default 0.6")
    fig.update_yaxes(title_text="AMP", range=[0, 1])
    return base_layout(fig, title + " per stage", height=300)
