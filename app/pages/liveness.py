"""`/liveness`: always-live + not-always-live per step per IPU, bumps, capacity; click a
step for the variables live there; a step x tile heat map of one IPU."""

from __future__ import annotations

from typing import Any

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz import analysis, figures
from popviz.analysis.liveness_sections import liveness_layers, phase_bands, section_bumps
from popviz.analysis.memory import always_live_from_liveness, always_live_text
from popviz.analysis.stash import stash_line, stash_variable_name
from popviz.figures.liveness_sections import liveness_sections_figure
from popviz.figures.lod import StepPyramid
from popviz.figures.style import fmt_bytes
from popviz.vocab import ipu_label

from ..cache import Entry
from ..common import (
    AppContext,
    axis_range,
    capacity_per_ipu,
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

PATH = "/liveness"
TITLE = "Liveness"
NEEDS_PROFILE = True
HEAT_ROWS = 400


def sections(entry: Entry) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(layers, phase bands, section bumps), built once per profile."""
    def build() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        p = entry.profile
        layers = liveness_layers(p.liveness, p.variables)
        bands = phase_bands(p.liveness, p.ops)
        return layers, bands, section_bumps(layers, bands)
    return entry.get("liveness_sections", build)


def liveness(ctx: AppContext, entry: Entry, lo: float | None = None,
             hi: float | None = None) -> Any:
    layers, bands, found = sections(entry)
    click = None if len(entry.profile.variables) else \
        "click a step for its not-always-live memory (no per-variable data)"
    return liveness_sections_figure(layers, bands, found, capacity_per_ipu(entry), lo, hi,
                                    naming=naming(entry), **({"click": click} if click else {}))


def _steps(entry: Entry) -> int:
    shape = entry.profile.array_shape("tile_liveness")
    return int(shape[1]) if len(shape) == 3 else 0


def _pyramid(entry: Entry, ipu: int) -> StepPyramid:
    return entry.get(f"pyramid{ipu}", lambda: StepPyramid(
        lambda a, b: entry.profile.tile_liveness(ipu, a, b), _steps(entry)))


def tiles(ctx: AppContext, entry: Entry, ipu: int = 0, lo: float | None = None,
          hi: float | None = None) -> Any:
    shape = entry.profile.array_shape("tile_liveness")
    if len(shape) != 3 or ipu >= shape[0]:
        return figures.tile_liveness_figure(pd.DataFrame().to_numpy())
    pyramid = _pyramid(entry, ipu)
    if hi is None:  # an IPU's own program ends before the longest one's
        live = entry.profile.liveness
        own = live.loc[live["ipu"] == ipu, "step"]
        hi = float(own.max()) if len(own) else None
    matrix, first, stride = pyramid.view(0 if lo is None else lo,
                                         pyramid.steps if hi is None else hi + 1)
    return figures.tile_liveness_figure(matrix, first, stride, rows=HEAT_ROWS,
                                        title=f"Not-always-live memory per tile · {ipu_label(ipu)}")


FIGURES = {"liveness": liveness, "tile_liveness": tiles}


LIVE_COLUMNS = ["name", "category", "size", "bytes", "first_step", "last_step"]


def live_variables(entry: Entry, ipu: int, step: int) -> tuple[str, pd.DataFrame]:
    """The heading and table of what is live at a step, from the data the curve is drawn
    from: a profile without per-variable data (an import) says so, with the curve's bytes."""
    p, words = entry.profile, naming(entry)
    where = f"{words.label(ipu)}, step {step}"
    has_vars = not p.variables.empty and bool((p.variables["ipu"] == ipu).any())
    if not has_vars:
        curve = analysis.step_memory(p.liveness, ipu, step)
        size = fmt_bytes(curve) if curve is not None else "no data"
        head = (f"{where}: {size} not-always-live, from "
                f"{analysis.liveness_source(p.meta, ipu)}; this profile has no "
                "per-variable data, so there is no variable list")
        return head, pd.DataFrame()  # no columns: no table is drawn
    live = analysis.variables_live_at(p.variables, ipu, step)
    head = (f"{where}: {len(live)} not-always-live variables, "
            f"{fmt_bytes(live['bytes'].sum()) if len(live) else '0 B'}")
    live = live.assign(size=[fmt_bytes(b) for b in live["bytes"]],
                       name=[stash_variable_name(n) for n in live["name"]])[LIVE_COLUMNS]
    return head, live


def _box(entry: Entry, live: pd.DataFrame) -> Any:
    return table("live-vars", live, words=naming(entry)) if len(live.columns) else []


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    if entry.profile.liveness.empty:
        return html.Div([html.H2(title_of(entry)), message(
            "This profile has no liveness report (measured runs do not record one).", "info")])
    peaks = insights(entry)["peaks"]
    ipu, step = (int(peaks["ipu"].iloc[0]), int(peaks["peak_step"].iloc[0])) if len(peaks) \
        else (0, 0)
    head, live = live_variables(entry, ipu, step)
    shape = entry.profile.array_shape("tile_liveness")
    ipus = list(range(shape[0])) if len(shape) == 3 else []
    heat: list[Any] = []
    if ipus:
        heat = [html.H3("Per tile"),
                dcc.Dropdown(id="live-ipu", options=[{"label": ipu_label(i), "value": i}
                                                     for i in ipus],
                             value=ipus[0], clearable=False, className="picker"),
                graph("tile-live-graph", tiles(ctx, entry, ipus[0]))]
    hint = ("Always-live: the rank's parameters, gradients and optimiser state; "
            "not-always-live: the activations it stashes for the backward pass, per compute "
            "action. Black triangles mark bumps. " + (
                "Click the curve to list the stashed micro-batches."
                if len(entry.profile.variables) else "Click the curve for the "
                "not-always-live memory at a step (no per-variable data here).")
            if naming(entry).measured else
            "Stacked: always-live (as on the memory page), activations (stashed, "
            "recomputed, inputs) and temporaries "
            "(one op's working memory, shown apart so the activation curve is visible). "
            "Bands: forward, backward, recompute (sections numbered: R3 recomputes section "
            "3 just before its backward B3) and optimiser (folded out of the opening view). "
            "Black triangles: one bump per section whose activations rise and fall. The "
            "y-axis fits the data; the IPU's memory is drawn when on scale, named when not. "
            "Click the curve to list live variables.")
    always = always_live_from_liveness(entry.profile.liveness)
    stashed = "" if naming(entry).measured else stash_line(entry.profile.stages,
                                                           naming(entry).label)
    return html.Div([
        html.H2(title_of(entry)),
        html.P(hint, className="hint"),
        *([html.P(always_live_text(always, naming(entry).label), id="always-live",
                  className="hint")] if always and not naming(entry).measured else []),
        *([html.P(stashed, id="live-stash", className="hint")] if stashed else []),
        graph("live-graph", liveness(ctx, entry)),
        html.H3(head, id="live-vars-head"),
        html.Div(_box(entry, live), id="live-vars-box"),
        *heat,
        downloads(entry.rel, ["liveness", "variables"],
                  list(FIGURES) if ipus else ["liveness"]),  # no tiles: no tile heat map
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("live-graph", "figure"), Input("live-graph", "relayoutData"),
                  State("url", "search"), prevent_initial_call=True)
    def zoom(relayout: dict | None, search: str) -> Any:
        wanted = axis_range(relayout, "x")
        if wanted is None:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        return liveness(ctx, entry) if wanted == "auto" else liveness(ctx, entry, *wanted)

    @app.callback(Output("live-vars-head", "children"), Output("live-vars-box", "children"),
                  Input("live-graph", "clickData"), State("url", "search"),
                  prevent_initial_call=True)
    def click(click: dict | None, search: str) -> tuple[str, Any]:
        point = (click or {}).get("points", [{}])[0]
        custom = point.get("customdata")
        if "x" not in point or not isinstance(custom, list) or len(custom) < 4:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        head, live = live_variables(entry, int(custom[3]), round(float(point["x"])))
        return head, _box(entry, live)

    @app.callback(Output("tile-live-graph", "figure"), Input("live-ipu", "value"),
                  Input("tile-live-graph", "relayoutData"), State("url", "search"),
                  prevent_initial_call=True)
    def heat(ipu: int, relayout: dict | None, search: str) -> Any:
        entry = ctx.cache.get(profile_of(search))
        source = triggered()  # None when called directly (tests, bench): use the relayout
        from_zoom = source == "tile-live-graph" or (source is None and relayout is not None)
        wanted = axis_range(relayout, "y") if from_zoom else "auto"
        if wanted is None:
            raise PreventUpdate
        if wanted == "auto":
            return tiles(ctx, entry, int(ipu))
        return tiles(ctx, entry, int(ipu), *wanted)

    return {"zoom": zoom, "click": click, "heat": heat}
