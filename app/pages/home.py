"""`/`: every profile under the served directory, rescanned on each visit and every 5 s."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html

from ..common import AppContext, profile_query

PATH = "/"
TITLE = "Profiles"
NEEDS_PROFILE = False
FIGURES: dict[str, Any] = {}
REFRESH_MS = 5000


def _number(value: Any, fmt: str) -> str:
    try:
        return format(float(value), fmt)
    except (TypeError, ValueError):
        return ""


def listing(ctx: AppContext) -> html.Div | html.Table:
    rows = ctx.cache.listing()
    if not rows:
        return html.Div(f"No .h5 profiles under {ctx.root.name}/ yet; this list refreshes "
                        "by itself.",
                        className="message info")
    head = html.Tr([html.Th(h) for h in ("profile", "kind", "run", "model", "target",
                                         "IPUs / ranks", "memory", "throughput (samples/s)",
                                         "latency (ms)")])
    body = []
    for r in rows:
        if r.get("checking"):
            body.append(html.Tr([html.Td(r["profile"]),
                                 html.Td("checking the file in a separate process ...",
                                         colSpan=8, className="status")],
                                className="checking"))
            continue
        if r.get("error"):
            body.append(html.Tr([html.Td(r["profile"]),
                                 html.Td(r["error"], colSpan=8, className="error")],
                                className="broken"))
            continue
        fits = r["fits"]
        body.append(html.Tr([
            html.Td(dcc.Link(r["profile"], href="/summary" + profile_query(r["profile"]))),
            html.Td(r["kind"]), html.Td(r["run"]), html.Td(r["model"]), html.Td(r["target"]),
            html.Td(str(r["ipus"])),
            html.Td(fits, className="ok" if fits == "fits" else "bad" if "OOM" in fits else ""),
            html.Td(_number(r["throughput"], ",.1f")), html.Td(_number(r["latency_ms"], ",.3f")),
        ]))
    return html.Table([html.Thead(head), html.Tbody(body)], className="listing",
                      id="profile-table")


def layout(ctx: AppContext, entry: Any = None) -> html.Div:
    return html.Div([
        html.H2("Profiles"),
        html.P(["Serving ", html.Code(ctx.root.name + "/"), ". Open a profile to see its summary, "
                "trace, liveness, memory, stages, exchange and operations.",
                " Or ", dcc.Link("compare two layouts", href="/compare", id="home-compare"), "."]),
        dcc.Interval(id="home-refresh", interval=REFRESH_MS),
        html.Div(listing(ctx), id="home-list"),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("home-list", "children"), Input("home-refresh", "n_intervals"),
                  prevent_initial_call=True)
    def refresh(_: int | None) -> html.Div | html.Table:
        return listing(ctx)

    return {"refresh": refresh}
