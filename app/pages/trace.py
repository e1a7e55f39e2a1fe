"""`/trace`: one row per IPU (rank when measured); zoom or pan redraws the visible range on
the server."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, html
from dash.exceptions import PreventUpdate

from popviz import figures

from ..cache import Entry
from ..common import (
    AppContext,
    downloads,
    graph,
    message,
    naming,
    profile_of,
    title_of,
    trace_index,
    x_range,
)

PATH = "/trace"
TITLE = "Trace"
NEEDS_PROFILE = True


def trace(ctx: AppContext, entry: Entry, lo: float | None = None,
          hi: float | None = None) -> Any:
    return figures.trace_figure(trace_index(entry), lo, hi, naming=naming(entry))


FIGURES = {"trace": trace}


def _status(fig: Any, unit: str = "cycles") -> str:
    meta = fig.layout.meta or {}
    if not meta:
        return ""
    lo, hi = meta["range"]
    mode = ("every event drawn" if meta["mode"] == "events"
            else "each bucket split by the time each kind ran in it; zoom in for single events")
    return f"{meta['visible_events']:,} events in {lo:,.0f} to {hi:,.0f} {unit}: {mode}."


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    if entry.profile.trace.empty:
        return html.Div([html.H2(title_of(entry)),
                         message("This profile has no trace events.", "info")])
    fig = trace(ctx, entry)
    words = naming(entry)
    rows = ("One row per rank (process); times in ns from the first recorded step. "
            if words.measured else "One row per IPU; times in cycles. ")
    return html.Div([
        html.H2(title_of(entry)),
        html.P(rows + "Drag to zoom, shift-drag or scroll to pan, double-click to reset. Colours: "
               "forward, backward, recompute and weight-update compute; exchange; sync; "
               "host I/O; idle.", className="hint"),
        html.Div(_status(fig, words.unit), id="trace-status", className="status"),
        graph("trace-graph", fig),
        downloads(entry.rel, ["trace"], list(FIGURES)),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("trace-graph", "figure"), Output("trace-status", "children"),
                  Input("trace-graph", "relayoutData"), State("url", "search"),
                  prevent_initial_call=True)
    def zoom(relayout: dict | None, search: str) -> tuple[Any, str]:
        wanted = x_range(relayout)
        if wanted is None:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        fig = trace(ctx, entry) if wanted == "auto" else trace(ctx, entry, *wanted)
        return fig, _status(fig, naming(entry).unit)

    return {"zoom": zoom}
