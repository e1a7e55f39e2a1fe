"""Pipeline stages: compute / exchange / idle per IPU (rank when measured), bubble fraction,
stash, AMP (modelled profiles only)."""

from __future__ import annotations

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
          ("exchange_cycles", "exchange", "exchange"), ("idle_cycles", "idle", "idle")]


def ipu_time_figure(stages: pd.DataFrame, unit: str = "cycles",
                    title: str | None = None, naming: Naming | None = None) -> go.Figure:
    """Stacked compute (by pass) / exchange / idle bars per IPU, bubble fraction on top.
    A measured profile's stage times are ns per recorded step (the mean)."""
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
            fig.add_trace(go.Bar(x=labels, y=bal[col], name=name,
                                 marker={"color": CATEGORY_COLOURS[colour]},
                                 hovertemplate="%{x}: %{y:,.0f} " + unit + "<extra>" + name
                                 + "</extra>"))
    fig.add_trace(go.Scatter(
        x=labels, y=bal["total_cycles"], mode="text", showlegend=False, hoverinfo="skip",
        text=[f"{b:.0%} idle" for b in bal["bubble_fraction"]], textposition="top center"))
    fig.update_yaxes(title_text=f"{unit} per step" if naming.in_ns else unit,
                     tickformat=",d")
    base_layout(fig, title + " (bubble fraction on top)", height=380)
    # six categories do not fit in one row above the plot: list them on the right
    fig.update_layout(barmode="stack", legend={"orientation": "v", "x": 1.02, "y": 1,
                                               "xanchor": "left", "yanchor": "top"})
    return fig


def stage_load_figure(stages: pd.DataFrame, title: str = "Load per stage",
                      naming: Naming = MODELLED) -> go.Figure:
    """Busy time of each stage relative to the mean: the bottleneck stands out in red, but
    only when it is one (above the advice's imbalance limit), so a balanced run is not
    painted as a problem."""
    if stages.empty:
        return empty_figure("This profile has no stage table.", title)
    bal = stage_balance(stages)
    top = bal["busy_cycles"].idxmax()
    one_device = stages_take_turns(bal)  # never empty here: one stage is one device too
    unbalanced = float(bal["relative_load"].max()) > IMBALANCE_LIMIT and not one_device
    colours = ["#c53a32" if i == top and unbalanced else "#3b75af" for i in bal.index]
    labels = [f"stage {s} ({naming.label(i)})" for s, i in zip(bal["stage"], bal["ipu"])]
    fig = go.Figure(go.Bar(x=labels, y=bal["relative_load"], marker={"color": colours},
                           text=[f"{x:.2f}x" for x in bal["relative_load"]],
                           # inside the bar's top: an outside label of a bar near the
                           # mean (0.97x) sat on the mean line
                           textposition="inside", insidetextanchor="end",
                           textfont={"color": "white"}, showlegend=False,
                           hovertemplate="%{x}: %{y:.2f}x the mean busy time<extra></extra>"))
    fig.add_hline(y=1.0, line={"color": "#555", "dash": "dot"}, annotation_text="mean")
    fig.update_yaxes(title_text="busy / mean busy", rangemode="tozero")
    note = (f"all on {naming.label(bal['ipu'].iloc[0])}: they run in turn" if one_device
            else "red: bottleneck" if unbalanced
            else f"balanced within {IMBALANCE_LIMIT - 1:.0%}")
    return base_layout(fig, f"{title} ({note})", height=340)


def stash_figure(stages: pd.DataFrame, title: str = "Stash and peak memory per stage",
                 naming: Naming = MODELLED) -> go.Figure:
    if stages.empty or "stash_bytes" not in stages.columns:
        return empty_figure("This profile has no stash figures.", title)
    s = stages.sort_values("stage")
    labels = [f"stage {a} ({naming.label(b)})" for a, b in zip(s["stage"], s["ipu"])]
    held = stash(s)  # the metrics core's definition: depth x bytes per micro-batch
    fig = go.Figure([
        go.Bar(x=labels, y=held["stash_bytes"] / MiB, name="stash",
               marker={"color": "#8e6bbf"},
               customdata=stash_column(s, measured=naming.measured),
               hovertemplate="%{x}: stash %{customdata}<extra></extra>"),
        go.Bar(x=labels, y=s["peak_bytes"] / MiB, name="peak liveness",
               marker={"color": "#ef8636"},
               hovertemplate="%{x}: peak %{y:,.1f} MiB<extra></extra>"),
    ])
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
