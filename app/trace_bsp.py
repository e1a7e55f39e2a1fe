"""The BSP view of a superstep under /trace: a click on a compute (or op) bar, or an IPU and
a superstep typed in, shows tiles x cycles for that superstep (popviz.analysis.superstep,
popviz.figures.superstep). Wiring only.

A click sends the server two numbers (the bar's IPU and end), never the figure: Dash would
post the whole clickData / figure, which is past `popviz serve`'s request limit (issue 21)."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz.analysis.superstep import SuperstepError, has_tiles, superstep_at, superstep_view
from popviz.figures.superstep import superstep_figure

from .cache import Entry
from .common import AppContext, error_text, graph, naming, op_templates, profile_of

HIDDEN = {"display": "none"}

# the clicked bar's IPU and end, from its customdata (popviz.figures.trace_lanes): a pass
# bar (9 fields: ..., end [4], ipu [5], duration, where, start) or an op bar (10 fields:
# ..., ipu [5], end [6], duration, op_id, start); else nothing. The end comes from
# customdata, never from the bar drawn: a bar is drawn over its part in the window only
PICK = """function(click) {
    const p = click && click.points && click.points[0];
    const c = p && p.customdata;
    const none = window.dash_clientside.no_update;
    if (!Array.isArray(c)) { return none; }
    const at = c.length === 9 ? 4 : (c.length === 10 ? 6 : -1);
    if (at < 0) { return none; }
    const ipu = Number(c[5]), t = Number(c[at]);
    return Number.isFinite(ipu) && Number.isFinite(t) ? {ipu: ipu, t: t} : none;
}"""


def available(entry: Entry) -> bool:
    """A BSP view needs a modelled profile: ops that say their tiles, a trace of supersteps."""
    prof = entry.profile
    return (has_tiles(prof.ops, not naming(entry).has_tiles)
            and "superstep" in prof.trace.columns and tiles_per_ipu(entry) > 0)


def tiles_per_ipu(entry: Entry) -> int:
    target = entry.profile.meta.get("target") or {}
    try:
        return int(target.get("tiles_per_ipu") or 0)
    except (TypeError, ValueError):
        return 0


def section(entry: Entry) -> html.Div:
    """The BSP view's controls and (empty until asked) figure, below the trace; hidden
    unless the profile is an IPU plan (Naming.has_tiles): a GPU plan runs kernels and a
    measured run real times, neither BSP supersteps on tiles, so there is nothing to say."""
    pick = dcc.Store(id="trace-bsp-pick")
    if not naming(entry).has_tiles:
        return html.Div([pick, html.Div(id="trace-bsp-status"),
                         dcc.Dropdown(id="trace-bsp-ipu", options=[], style=HIDDEN),
                         dcc.Input(id="trace-bsp-step", type="number", style=HIDDEN)],
                        id="trace-bsp", style=HIDDEN)
    if not available(entry):  # an IPU plan, but one that does not say its tiles
        return html.Div([
            html.H3("BSP view of a superstep"), pick,
            html.Div("The BSP view (tiles x time of one superstep) needs each op's tiles "
                     "and the trace's supersteps, which this profile does not have.",
                     id="trace-bsp-status", className="message info"),
            dcc.Dropdown(id="trace-bsp-ipu", options=[], style=HIDDEN),
            dcc.Input(id="trace-bsp-step", type="number", style=HIDDEN),
        ], id="trace-bsp")  # no view: its callback can never fire here
    trace = entry.profile.trace
    ipus = sorted(int(i) for i in trace["ipu"].unique())
    last = int(trace["superstep"].max())
    return html.Div([
        html.H3("BSP view of a superstep"),
        html.P("Click a compute or op bar in the trace (or pick an IPU and a superstep) to "
               "see its superstep tile by tile: each op computes and exchanges on the tiles "
               "its plan uses while the others idle, then all tiles wait at the sync and "
               "exchange (a Grouped training clock also syncs between its forwards and its "
               "backwards). Modelled from each op's plan: see docs/app.md.",
               className="hint"), pick,
        html.Div([html.Span("IPU ", className="label"),
                  dcc.Dropdown(id="trace-bsp-ipu", clearable=False,
                               options=[{"label": f"IPU {i}", "value": i} for i in ipus],
                               style={"width": "110px", "display": "inline-block",
                                      "verticalAlign": "middle"}),
                  html.Span(f" superstep (0 to {last}) ", className="label"),
                  dcc.Input(id="trace-bsp-step", type="number", min=0, max=last, step=1,
                            debounce=True, style={"width": "90px"})],
                 className="controls"),
        html.Div(id="trace-bsp-status", className="status"),
        # no graph until a superstep is picked: every graph on a page has data
        html.Div(id="trace-bsp-view"),
    ], id="trace-bsp")


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    app.clientside_callback(PICK, Output("trace-bsp-pick", "data"),
                            Input("trace-graph", "clickData"), prevent_initial_call=True)

    @app.callback(Output("trace-bsp-ipu", "value"), Output("trace-bsp-step", "value"),
                  Input("trace-bsp-pick", "data"), State("url", "search"),
                  prevent_initial_call=True)
    def bsp_pick(pick: dict | None, search: str) -> tuple[int, int]:
        """The clicked bar's superstep (its IPU and end time are all that came)."""
        if not isinstance(pick, dict) or "ipu" not in pick or "t" not in pick:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        if not available(entry):
            raise PreventUpdate
        try:
            ipu, t = int(pick["ipu"]), float(pick["t"])
            return ipu, superstep_at(entry.profile.trace, ipu, t)
        except (SuperstepError, TypeError, ValueError):
            raise PreventUpdate from None

    @app.callback(Output("trace-bsp-view", "children"), Output("trace-bsp-status", "children"),
                  Input("trace-bsp-ipu", "value"), Input("trace-bsp-step", "value"),
                  State("url", "search"), prevent_initial_call=True)
    def bsp_show(ipu: Any, step: Any, search: str) -> tuple[Any, str]:
        if ipu is None or step is None:
            raise PreventUpdate
        rel = profile_of(search)
        entry = ctx.cache.get(rel)
        if not available(entry):
            raise PreventUpdate
        try:
            ipu_i, step_i = int(ipu), int(step)
            view = superstep_view(entry.profile.trace, entry.profile.ops,
                                  tiles_per_ipu(entry), ipu_i, step_i, op_templates(entry))
        except (SuperstepError, TypeError, ValueError) as exc:
            return dash.no_update, str(exc)
        except Exception as exc:  # one line on the page, never a traceback
            return dash.no_update, error_text(ctx, exc, rel)
        fig = superstep_figure(view)
        share = fig.layout.meta["share"]
        status = (f"IPU {ipu_i}, superstep {step_i}: {view.start:,.0f} to {view.end:,.0f} "
                  f"cycles ({view.length:,.0f}), {len(view.ops):,} ops; tiles x cycles: "
                  + ", ".join(f"{k} {v:.0%}" for k, v in share.items()) + ".")
        return graph("trace-bsp-graph", fig), status

    return {"bsp_pick": bsp_pick, "bsp_show": bsp_show}
