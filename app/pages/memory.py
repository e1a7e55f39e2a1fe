"""`/memory`: every tile of one IPU by category, a tile map, per-IPU totals, OOM tiles in
red; click a tile (bar or map) for its breakdown."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz import analysis, figures
from popviz.analysis.memory import always_live_by_ipu, always_live_text
from popviz.figures.memory import TILE_MAP_COLUMNS
from popviz.figures.style import fmt_bytes
from popviz.vocab import ipu_label

from ..cache import Entry
from ..common import (
    AppContext,
    downloads,
    graph,
    insights,
    message,
    naming,
    profile_of,
    title_of,
    triggered,
)

PATH = "/memory"
TITLE = "Memory"
NEEDS_PROFILE = True


def tiles(ctx: AppContext, entry: Entry, ipu: int = 0) -> Any:
    return figures.tile_memory_figure(entry.profile.tile_memory, ipu)


def tile_map(ctx: AppContext, entry: Entry, ipu: int = 0) -> Any:
    return figures.tile_map_figure(entry.profile.tile_memory, ipu)


def totals(ctx: AppContext, entry: Entry) -> Any:
    return figures.ipu_totals_figure(insights(entry)["ipu_totals"])


FIGURES = {"tile_memory": tiles, "tile_map": tile_map, "ipu_totals": totals}


def breakdown(entry: Entry, ipu: int, tile: int) -> list[Any]:
    tm = entry.profile.tile_memory
    try:
        parts = analysis.tile_breakdown(tm, ipu, tile)
    except ValueError as exc:
        return [message(str(exc), "info")]
    cap = float(tm.loc[(tm["ipu"] == ipu) & (tm["tile"] == tile), "capacity_bytes"].iloc[0])
    out: list[Any] = [graph("tile-breakdown-graph",
                            figures.tile_breakdown_figure(parts, ipu, tile, cap))]
    oom = entry.profile.oom
    if len(oom) and "variables" in oom.columns:
        hit = oom[(oom["ipu"] == ipu) & (oom["tile"] == tile)]
        for row in hit.itertuples():
            out.append(message(f"Out of memory by {fmt_bytes(row.bytes_over)}; largest "
                               f"variables: {row.variables}", "oom"))
    return out


def _first_tile(entry: Entry, ipu: int) -> int:
    tm = entry.profile.tile_memory
    on = tm[tm["ipu"] == ipu]
    return int(on.loc[on["total_bytes"].idxmax(), "tile"]) if len(on) else 0


NO_TILES_GPU = ("A GPU has no tiles: its memory is the Liveness page's curve (the caching "
                "allocator's allocated bytes per op) and the Summary's fit against device "
                "memory.")


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    tm = entry.profile.tile_memory
    if tm.empty:
        return html.Div([html.H2(title_of(entry)),
                         message(NO_TILES_GPU if naming(entry).gpu_plan else
                                 "This profile has no per-tile memory (measured runs do not "
                                 "record it).", "info")])
    ipus = sorted(int(i) for i in tm["ipu"].unique())
    fit = insights(entry)["fit"]
    worst = min(fit["oom_by_ipu"]) if fit["oom_by_ipu"] else ipus[0]
    return html.Div([
        html.H2(title_of(entry)),
        html.P(always_live_text(always_live_by_ipu(tm), ipu_label), id="always-live",
               className="hint"),
        graph("mem-totals", totals(ctx, entry)),
        html.Div([html.Span("IPU ", className="label"),
                  dcc.Dropdown(id="mem-ipu", options=[{"label": ipu_label(i), "value": i}
                                                      for i in ipus],
                               value=worst, clearable=False, className="picker")],
                 className="row"),
        graph("mem-tiles", tiles(ctx, entry, worst)),
        html.Div([html.Div(graph("mem-map", tile_map(ctx, entry, worst)), className="half"),
                  html.Div(breakdown(entry, worst, _first_tile(entry, worst)),
                           id="mem-breakdown", className="half")], className="row"),
        downloads(entry.rel, ["tile_memory", "oom"], list(FIGURES)),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("mem-tiles", "figure"), Output("mem-map", "figure"),
                  Output("mem-breakdown", "children", allow_duplicate=True),
                  Input("mem-ipu", "value"), State("url", "search"),
                  prevent_initial_call=True)
    def pick_ipu(ipu: int, search: str) -> tuple[Any, Any, list[Any]]:
        entry = ctx.cache.get(profile_of(search))
        ipu = int(ipu)
        return (tiles(ctx, entry, ipu), tile_map(ctx, entry, ipu),
                breakdown(entry, ipu, _first_tile(entry, ipu)))

    @app.callback(Output("mem-breakdown", "children"), Input("mem-tiles", "clickData"),
                  Input("mem-map", "clickData"), State("mem-ipu", "value"),
                  State("url", "search"), prevent_initial_call=True)
    def pick_tile(bar: dict | None, cell: dict | None, ipu: int, search: str) -> list[Any]:
        from_bars = triggered() == "mem-tiles" or (triggered() is None and bar is not None)
        point = ((bar if from_bars else cell) or {}).get("points", [{}])[0]
        if "x" not in point:
            raise PreventUpdate
        if from_bars:
            tile = int(point["x"])
        else:  # tile map: column x, row y
            tile = int(point["y"]) * TILE_MAP_COLUMNS + int(point["x"])
        return breakdown(ctx.cache.get(profile_of(search)), int(ipu), tile)

    return {"pick_ipu": pick_ipu, "pick_tile": pick_tile}



