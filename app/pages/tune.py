"""`/tune`: run `popviz tune` on the open profile, rank its plans, draw throughput against
peak memory (Pareto), and compare any plan with the current profile on /compare (the plan
is compiled and written under `tune-plans/` in the served directory)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz.advise.plans import plans_table, run_tune, write_plan
from popviz.errors import ProfileError
from popviz.figures.tune import tune_figure

from ..cache import Entry
from ..common import AppContext, capacity_per_ipu, graph, message, profile_of, table, title_of

PATH = "/tune"
TITLE = "Tune"
NEEDS_PROFILE = True
FIGURES: dict[str, Any] = {}
DEFAULT_BUDGET = 16
PLANS_DIR = "tune-plans"
SHOWN = ["plan", "splits", "amp", "recomputation", "schedule", "fits", "throughput",
         "throughput_per_ipu", "vs_now", "step_ms", "idle_fraction", "peak_MiB",
         "fullest_tile", "pareto"]


def _key(budget: int) -> tuple[str, int]:
    return ("tune", int(budget))


def _plan_path(ctx: AppContext, entry: Entry, budget: int, rank: int) -> tuple[str, Any]:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", entry.rel).strip("_")
    rel = f"{PLANS_DIR}/{slug}/budget{budget}/plan{rank}/profile.h5"
    return rel, ctx.root / rel


def results(ctx: AppContext, entry: Entry, budget: int) -> list[Any]:
    """The ranked plans, the Pareto figure and a compare link per plan."""
    try:
        result = entry.get(_key(budget), lambda: run_tune(entry.profile,
                                                          max_compiles=budget))
    except (ProfileError, ValueError) as exc:
        return [message(str(exc))]
    plans = plans_table(result)
    shown = plans.assign(peak_MiB=(plans["peak_bytes"] / 2**20).round(1),
                         throughput=plans["throughput"].round().astype("int64"),
                         throughput_per_ipu=plans["throughput_per_ipu"].round().astype("int64"),
                         step_ms=plans["step_ms"].round(3),
                         vs_now=plans["vs_now"].round(2),
                         fullest_tile=(plans["fullest_tile"] * 100).round(0).astype(int)
                         .astype(str) + " %",
                         idle_fraction=(plans["idle_fraction"] * 100).round(0).astype(int)
                         .astype(str) + " %")[SHOWN]
    links = [html.Span("Compare with this profile: ", className="label")]
    for rank in range(1, len(result.candidates) + 1):
        links.append(html.Button(f"plan #{rank}", id={"type": "tune-compare", "rank": rank},
                                 n_clicks=0, className="download"))
    notes = [html.Li(n) for n in result.notes]
    return [
        html.Div(f"{result.layouts} layouts in {result.compiles} compiles "
                 f"({result.seconds:.1f} s) for {result.num_ipus} IPU(s) on "
                 f"{result.target}. Ranked: fitting first, then throughput, then memory "
                 "headroom.", className="status", id="tune-head"),
        graph("tune-graph", tune_figure(plans, capacity_per_ipu(entry))),
        table("tune-plans", shown, page_size=20),
        html.Div(links, className="downloads", id="tune-links"),
        html.Div(id="tune-go"),
        html.Ul(notes, className="hint") if notes else html.Div(),
        html.H3("train.py flags of each plan"),
        html.Ul([html.Li(f"{p}: train.py ... {a}") for p, a in
                 zip(plans["plan"], plans["train_args"], strict=True)], className="hint"),
    ]


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    if entry.profile.kind != "modelled":
        return html.Div([html.H2(title_of(entry)), message(
            "A measured profile holds no recorded program to re-plan; tune needs a modelled "
            "one (train.py --profile).", "info")])
    cached = entry.derived.get(_key(DEFAULT_BUDGET)) if hasattr(entry, "derived") else None
    return html.Div([
        html.H2(title_of(entry)),
        html.P("Re-plans the recorded program with other split points, AMP per IPU, "
               "recomputation and schedule (popviz tune): every plan is compiled with the "
               "cost model, nothing is run. Each run compiles up to the budget below.",
               className="hint"),
        html.Div([html.Span("compile budget", className="label"),
                  dcc.Input(id="tune-budget", type="number", min=2, max=200, step=1,
                            value=DEFAULT_BUDGET, style={"width": 80}),
                  html.Button("Run tune", id="tune-run", n_clicks=0)],
                 className="row", style={"alignItems": "center"}),
        dcc.Loading(html.Div(results(ctx, entry, DEFAULT_BUDGET) if cached else
                             [message("Press Run tune (about a second per compile).",
                                      "info")], id="tune-results")),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("tune-results", "children"), Input("tune-run", "n_clicks"),
                  State("tune-budget", "value"), State("url", "search"),
                  prevent_initial_call=True)
    def run(clicks: int, budget: int | None, search: str) -> list[Any]:
        if not clicks:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        return results(ctx, entry, max(2, min(200, int(budget or DEFAULT_BUDGET))))

    @app.callback(Output("tune-go", "children"),
                  Input({"type": "tune-compare", "rank": dash.ALL}, "n_clicks"),
                  State("tune-budget", "value"), State("url", "search"),
                  prevent_initial_call=True)
    def compare_plan(clicks: list[int], budget: int | None, search: str) -> Any:
        picked = dash.ctx.triggered_id if clicks and any(clicks) else None
        if not picked:
            raise PreventUpdate
        return link_to_compare(ctx, profile_of(search), int(picked["rank"]),
                               int(budget or DEFAULT_BUDGET))

    return {"run": run, "compare_plan": compare_plan}


def link_to_compare(ctx: AppContext, rel: str, rank: int, budget: int) -> Any:
    """Write plan #rank (once) and navigate to /compare?profile=<plan>&other=<this>."""
    entry = ctx.cache.get(rel)
    result = entry.derived.get(_key(budget))
    if result is None:
        return message("Run tune first.", "info")
    plan_rel, path = _plan_path(ctx, entry, budget, rank)
    if not path.exists():
        try:
            write_plan(entry.profile, result, rank, path)
        except (OSError, ValueError) as exc:
            return message(f"could not write plan #{rank}: {exc}")
    href = "/compare?" + urlencode({"profile": plan_rel, "other": rel})
    return dcc.Location(id="tune-location", href=href, refresh=True)
