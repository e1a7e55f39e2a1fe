"""`/stages`: compute / exchange / idle per IPU, load per stage, stash and AMP."""

from __future__ import annotations

from typing import Any

import dash
from dash import html

from popviz import analysis, figures

from ..cache import Entry
from ..common import AppContext, downloads, graph, message, table, title_of, unit

PATH = "/stages"
TITLE = "Stages"
NEEDS_PROFILE = True


def ipu_time(ctx: AppContext, entry: Entry) -> Any:
    return figures.ipu_time_figure(entry.profile.stages, unit=unit(entry))


def load(ctx: AppContext, entry: Entry) -> Any:
    return figures.stage_load_figure(entry.profile.stages)


def stash(ctx: AppContext, entry: Entry) -> Any:
    return figures.stash_figure(entry.profile.stages)


def amp(ctx: AppContext, entry: Entry) -> Any:
    return figures.amp_figure(entry.profile.stages, entry.profile.meta or {})


FIGURES = {"ipu_time": ipu_time, "stage_load": load, "stash": stash, "amp": amp}


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    stages = entry.profile.stages
    if stages.empty:
        return html.Div([html.H2(title_of(entry)),
                         message("This profile has no stage table.", "info")])
    bal = analysis.stage_balance(stages)
    shown = bal.drop(columns=[c for c in ("total_cycles",) if c in bal.columns])
    return html.Div([
        html.H2(title_of(entry)),
        html.Div([graph("stages-time", ipu_time(ctx, entry)),
                  graph("stages-load", load(ctx, entry))], className="row two"),
        html.Div([graph("stages-stash", stash(ctx, entry)),
                  graph("stages-amp", amp(ctx, entry))], className="row two"),
        html.H3("Stages"),
        table("stages-table", shown),
        downloads(entry.rel, ["stages"], list(FIGURES)),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    """No callbacks: the page is rebuilt on each visit."""
    return {}
