"""`/`: every profile under the served directory, a page of PAGE_ROWS at a time,
rescanned on each visit and every 5 s (20 s past BIG_FOLDER profiles).

A refresh costs little at thousands of profiles: one scan serves every open tab
(`ProfileCache.listing(max_age_s=)`), only the shown page is rendered, and when that page
is what the tab already shows (its digest, kept in the tab) nothing is sent (204)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from ..cache import LISTING_MAX_AGE_S, Entry
from ..common import AppContext, profile_query

PATH = "/"
TITLE = "Profiles"
NEEDS_PROFILE = False
FIGURES: dict[str, Any] = {}
REFRESH_MS = 5000
BIG_FOLDER = 1000  # past this many profiles the list refreshes every BIG_REFRESH_MS
BIG_REFRESH_MS = 20000
PAGE_ROWS = 100
SCAN_MAX_AGE_S = LISTING_MAX_AGE_S  # a scan this recent serves another tab's refresh


def _number(value: Any, fmt: str) -> str:
    try:
        return format(float(value), fmt)
    except (TypeError, ValueError):
        return ""


def _page_of(rows: list[dict[str, Any]], page: Any) -> tuple[int, list[dict[str, Any]]]:
    """The page number (clamped) and its rows."""
    last = max(0, (len(rows) - 1) // PAGE_ROWS)
    number = min(max(int(page) if isinstance(page, int) else 0, 0), last)
    return number, rows[number * PAGE_ROWS:(number + 1) * PAGE_ROWS]


def digest(rows: list[dict[str, Any]], page: int) -> str:
    """What a tab shows of the listing: the same digest, nothing to send."""
    shown = _page_of(rows, page)
    text = json.dumps([len(rows), shown[0], shown[1]], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _pager(count: int, page: int) -> tuple[str, bool, bool, dict[str, str]]:
    """The pager's text, whether previous / next are disabled, and its style (hidden
    while everything fits on one page)."""
    last = max(0, (count - 1) // PAGE_ROWS)
    first_row = page * PAGE_ROWS + 1
    text = f" profiles {first_row:,}-{min(count, first_row + PAGE_ROWS - 1):,} of {count:,} "
    return text, page == 0, page >= last, {} if count > PAGE_ROWS else {"display": "none"}


def listing(ctx: AppContext, page: int = 0,
            rows: list[dict[str, Any]] | None = None) -> html.Div | html.Table:
    """The table of one page of the listing."""
    if rows is None:
        rows = _rows(ctx, page)
    page, shown = _page_of(rows, page)
    if not rows:
        return html.Div(f"No .h5 profiles under {ctx.root.name}/ yet; this list refreshes "
                        "by itself.", className="message info")
    head = html.Tr([html.Th(h) for h in ("profile", "kind", "run", "model", "target",
                                         "IPUs / ranks", "memory", "throughput (samples/s)",
                                         "latency (ms)")])
    body = []
    for r in shown:
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


def _rows(ctx: AppContext, page: int) -> list[dict[str, Any]]:
    """The listing, page `page`'s files read first (ProfileCache.listing)."""
    return ctx.cache.listing(max_age_s=SCAN_MAX_AGE_S,
                             shown=(page * PAGE_ROWS, (page + 1) * PAGE_ROWS))


def layout(ctx: AppContext, entry: Entry | None = None) -> html.Div:
    rows = _rows(ctx, 0)
    text, prev_off, next_off, style = _pager(len(rows), 0)
    return html.Div([
        html.H2("Profiles"),
        html.P(["Serving ", html.Code(ctx.root.name + "/"), ". Open a profile to see its summary, "
                "trace, liveness, memory, stages, exchange and operations.",
                " Or ", dcc.Link("compare two layouts", href="/compare", id="home-compare"), "."]),
        dcc.Interval(id="home-refresh",
                     interval=REFRESH_MS if len(rows) <= BIG_FOLDER else BIG_REFRESH_MS),
        dcc.Store(id="home-page", data=0),
        dcc.Store(id="home-digest", data=digest(rows, 0)),
        html.Div([html.Button("previous", id="home-prev", n_clicks=0, disabled=prev_off),
                  html.Span(text, id="home-range", className="label"),
                  html.Button("next", id="home-next", n_clicks=0, disabled=next_off)],
                 id="home-pager", className="pager", style=style),
        html.Div(listing(ctx, 0, rows), id="home-list"),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("home-list", "children"), Output("home-range", "children"),
                  Output("home-prev", "disabled"), Output("home-next", "disabled"),
                  Output("home-pager", "style"), Output("home-page", "data"),
                  Output("home-digest", "data"), Input("home-refresh", "n_intervals"),
                  Input("home-prev", "n_clicks"), Input("home-next", "n_clicks"),
                  State("home-page", "data"), State("home-digest", "data"),
                  prevent_initial_call=True)
    def refresh(_: int | None, _prev: int | None = None, _next: int | None = None,
                page: Any = 0, shown: str | None = None) -> tuple[Any, ...]:
        """The shown page, another on previous / next; nothing (204) when unchanged."""
        page = page if isinstance(page, int) else 0
        moved = {"home-prev": -1, "home-next": 1}.get(_trigger(), 0)
        rows = _rows(ctx, max(0, page + moved))
        page = _page_of(rows, page + moved)[0]
        now = digest(rows, page)
        if now == shown and not moved:
            raise PreventUpdate
        return (listing(ctx, page, rows), *_pager(len(rows), page), page, now)

    return {"refresh": refresh}


def _trigger() -> Any:
    try:
        return dash.ctx.triggered_id
    except Exception:  # called outside a Dash request (tests)
        return None
