"""`/memory`: every tile of one IPU by category, a tile map, per-IPU totals, OOM tiles in
red; click a tile (bar or map) for its breakdown."""

from __future__ import annotations

from typing import Any

import dash
import numpy as np
import pandas as pd
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz import analysis, figures
from popviz.analysis.memory import always_live_by_ipu, always_live_text
from popviz.analysis.stash import stash_variable_name
from popviz.analysis.tile_contents import (
    flat_per_ipu,
    live_on_tile,
    on_tile,
    placed,
    row_to_step,
    row_width,
    tile_peaks,
    with_tile_peaks,
)
from popviz.figures.memory import TILE_MAP_COLUMNS
from popviz.figures.memory_counters import allocated_over_time
from popviz.figures.style import fmt_bytes
from popviz.vocab import ipu_label

from .. import alloc_view
from ..cache import Entry
from ..common import (
    AppContext,
    downloads,
    graph,
    insights,
    message,
    naming,
    profile_of,
    table,
    title_of,
    triggered,
)
from ..trace_stats import compute_link

PATH = "/memory"
TITLE = "Memory"
NEEDS_PROFILE = True
PEAK_BLOCK = 2048  # steps of tile liveness read at a time for the per-tile peaks


def _peaks(entry: Entry, ipu: int) -> tuple[np.ndarray, np.ndarray]:
    """(peak bytes, peak row) per tile of one IPU from the tile liveness, read once."""
    def build() -> tuple[np.ndarray, np.ndarray]:
        shape = entry.profile.array_shape("tile_liveness")
        if len(shape) != 3 or not 0 <= ipu < shape[0]:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        # in blocks of steps: a long program's whole IPU is 100+ MB
        peak = np.full(shape[2], -1, dtype=np.int64)
        row = np.zeros(shape[2], dtype=np.int64)
        for a in range(0, shape[1], PEAK_BLOCK):
            top, at = tile_peaks(entry.profile.tile_liveness(ipu, a, a + PEAK_BLOCK))
            better = top > peak  # the first step of the peak wins a tie
            peak[better], row[better] = top[better], at[better] + a
        return np.maximum(peak, 0), row
    return entry.get(("tile_peaks", ipu), build)


def tile_table(entry: Entry, ipu: int) -> pd.DataFrame:
    """The tile memory as drawn: an IPU whose stored not-always-live peak is one flat
    value takes each tile's own peak from the tile liveness."""
    tm = entry.profile.tile_memory
    if not flat_per_ipu(tm, ipu):
        return tm
    return entry.get(("tile_table", ipu), lambda: with_tile_peaks(tm, ipu, _peaks(entry, ipu)[0]))


def tiles(ctx: AppContext, entry: Entry, ipu: int = 0) -> Any:
    return figures.tile_memory_figure(tile_table(entry, ipu), ipu)


def tile_map(ctx: AppContext, entry: Entry, ipu: int = 0) -> Any:
    return figures.tile_map_figure(tile_table(entry, ipu), ipu)


def totals(ctx: AppContext, entry: Entry) -> Any:
    return figures.ipu_totals_figure(insights(entry)["ipu_totals"])


FIGURES = {"tile_memory": tiles, "tile_map": tile_map, "ipu_totals": totals}


def contents(entry: Entry, ipu: int, tile: int) -> list[Any]:
    """What is on the tile (any tile, not only an overflowing one): its not-always-live
    peak and the step of it, and the variables there."""
    p = entry.profile
    peak, row = _peaks(entry, ipu)
    step, head = -1, f"{ipu_label(ipu)} tile {tile}"
    if 0 <= tile < peak.size:
        step = row_to_step(int(row[tile]), int(p.array_shape("tile_liveness")[1]),
                           p.liveness, ipu)
        head += (f": not-always-live peak {fmt_bytes(int(peak[tile]))} at step {step}")
    if placed(p.variables) and step >= 0:
        return [html.H4(head, id="mem-tile-head"), *_placed(entry, ipu, tile, step)]
    found = live_on_tile(p.variables, p.oom, ipu, tile, step)
    if found.empty:
        return [html.H4(head, id="mem-tile-head"), html.P(
            "No per-variable data in this profile, so nothing to list.", className="hint")]
    source = str(found["source"].iloc[0])
    note = (f"What is on it ({source}; this profile records no per-tile placement of "
            "every variable (format before 1.3), so these are the largest candidates, each "
            "spread over its op's tiles):" if source.startswith("live")
            else f"What is on it ({source}):")
    shown = found.drop(columns=["source"]).assign(
        size=[fmt_bytes(b) if b == b else "" for b in found["bytes"]])
    shown["name"] = [stash_variable_name(n) for n in shown["name"]]
    return [html.H4(head, id="mem-tile-head"), html.P(note, className="hint"),
            table("mem-tile-vars", shown[["name", "category", "size", "bytes"]].dropna(
                axis=1, how="all"), page_size=12)]


def _placed(entry: Entry, ipu: int, tile: int, step: int) -> list[Any]:
    """The tile's own variables at `step`, each with its bytes on this tile (the profile
    records every variable's tile range)."""
    p = entry.profile
    width = row_width(int(p.array_shape("tile_liveness")[1]), p.liveness, ipu)
    found = on_tile(p.variables, p.table("always_live_variables"), ipu, tile, step, width)
    if found.empty:
        return [html.P("Nothing is on this tile at its peak.", className="hint")]
    total = float(found["bytes"].sum())
    note = (f"What is on it at step {step}: {len(found):,} variables, {fmt_bytes(int(total))} "
            "on this tile (always-live and live at that step; code, vertex state and "
            "exchange buffers are in the breakdown above). Bytes: on this tile; of: the "
            "whole variable, spread over its tiles.")
    shown = pd.DataFrame({
        "name": [stash_variable_name(n) for n in found["name"]],
        "category": found["category"], "live": found["live"],
        "size": [fmt_bytes(round(b)) for b in found["bytes"]],
        "bytes": found["bytes"].round().astype(np.int64),
        "of": [fmt_bytes(int(b)) for b in found["variable_bytes"]],
        "tiles": found["tiles"]})
    return [html.P(note, className="hint"), table("mem-tile-vars", shown, page_size=12)]


def breakdown(entry: Entry, ipu: int, tile: int) -> list[Any]:
    tm = tile_table(entry, ipu)
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
            out.append(message(f"Out of memory by {fmt_bytes(row.bytes_over)}; largest "  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                               f"variables: {row.variables}", "oom"))
    return out + contents(entry, ipu, tile)


def _first_tile(entry: Entry, ipu: int) -> int:
    tm = tile_table(entry, ipu)
    on = tm[tm["ipu"] == ipu]
    return int(on.loc[on["total_bytes"].idxmax(), "tile"]) if len(on) else 0  # type: ignore[call-overload, index]  # pandas-stubs: a cell is any scalar


NO_TILES_GPU = ("A GPU has no tiles: its memory is the Liveness page's curve (the caching "
                "allocator's allocated bytes per op) and the Summary's fit against device "
                "memory.")


def _counters(entry: Entry) -> list[Any]:
    """A measured run without a CUDA memory snapshot: the allocated bytes its trace's own
    memory events give, per rank over time (the snapshot's allocator view needs a
    snapshot: `popviz import --memory-snapshot`)."""
    words = naming(entry)
    live = entry.profile.liveness
    if not words.measured or alloc_view.available(entry) or live.empty \
            or "time" not in live.columns:
        return []
    # a flag or call in a `flag` element never wraps (a break after the first '-' of
    # '--memory-snapshot' read as a lone '-' and another flag, '-memory-snapshot')
    if not compute_link(entry)[1]:  # a CPU run: no CUDA allocator, so no snapshot of one
        return [html.P("This is what the run's own memory events say: the bytes PyTorch's "
                       "CPU allocator held over time per rank, the peak starred.",
                       className="hint"),
                graph("mem-counters", allocated_over_time(live, words))]
    return [html.P(["Without a memory snapshot, this is what the run's own memory events "
                    "say: the bytes allocated over time per rank, the peak starred (an import "
                    "of a CUDA run can add a ",
                    html.Code("torch.cuda.memory._snapshot()", className="flag"), " with ",
                    html.Code("--memory-snapshot", className="flag"),
                    " for the allocator's blocks and stacks)."],
                   className="hint"),
            graph("mem-counters", allocated_over_time(live, words))]


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    tm = entry.profile.tile_memory
    if tm.empty:
        counters = _counters(entry)
        below = (" Its CUDA memory snapshot's allocator is below." if alloc_view.available(
            entry) else " Below: the bytes it allocated over time." if counters else
            " Its trace recorded no memory events (torch.profiler records them with "
            "profile_memory=True).")
        return html.Div([html.H2(title_of(entry)),
                         message(NO_TILES_GPU if naming(entry).gpu_plan else
                                 "This measured run has no per-tile memory (that is what "
                                 "popviz models for a compiled plan)." + below, "info"),
                         *counters,
                         alloc_view.section(entry)])
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
        downloads(entry.rel, ["tile_memory", "oom"], list(FIGURES), words=naming(entry)),
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

    return {"pick_ipu": pick_ipu, "pick_tile": pick_tile, **alloc_view.register(app, ctx)}



