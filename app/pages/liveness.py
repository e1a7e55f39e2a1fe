"""`/liveness`: always-live + not-always-live per step per IPU, bumps, capacity; click a
step for the variables live there and a link to the trace at it; a step x tile heat map
of one IPU. `&t0=&t1=` (a range picked on /trace) opens each panel on its steps there."""

from __future__ import annotations

from typing import Any

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz import analysis, figures
from popviz.analysis.links import padded, step_span, steps_in_range
from popviz.analysis.liveness import merged_variables
from popviz.analysis.liveness_sections import liveness_layers, phase_bands, section_bumps
from popviz.analysis.memory import always_live_from_liveness, always_live_text
from popviz.analysis.stash import stash_line, stash_variable_name
from popviz.figures.liveness_sections import liveness_sections_figure
from popviz.figures.lod import StepPyramid
from popviz.figures.style import fmt_bytes
from popviz.metrics import peak_liveness
from popviz.vocab import ipu_label

from .. import links
from ..cache import Entry
from ..common import (
    AppContext,
    axis_range,
    capacity_per_ipu,
    downloads,
    gpu_timed,
    graph,
    insights,
    message,
    naming,
    profile_of,
    table,
    title_of,
    triggered,
)
from ..trace_stats import run_window

PATH = "/liveness"
TITLE = "Liveness"
NEEDS_PROFILE = True
HEAT_ROWS = 400
# a job of more devices draws the panels of this many, the fullest (a panel per rank of
# 1,024: 24 s to build and 190 px each to scroll; 16 panels: 0.3 s)
MAX_PANELS = 16


def sections(entry: Entry) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(layers, phase bands, section bumps) of the devices drawn, built once per profile."""
    def build() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        p, shown = entry.profile, _ipus(entry)
        live, ops, variables = p.liveness, p.ops, p.variables
        if len(shown) < _count(entry):
            live = live[live["ipu"].isin(shown)]
            ops = ops[ops["ipu"].isin(shown)] if "ipu" in ops else ops
            if "ipu" in variables:
                variables = variables[variables["ipu"].isin(shown)]
        layers = liveness_layers(live, variables)
        bands = phase_bands(live, ops)
        return layers, bands, section_bumps(layers, bands)
    return entry.get("liveness_sections", build)


def liveness(ctx: AppContext, entry: Entry, lo: float | None = None,
             hi: float | None = None, ranges: dict[int, tuple[float, float]] | None = None
             ) -> Any:
    layers, bands, found = sections(entry)
    click = None if len(entry.profile.variables) else \
        "click a step for its not-always-live memory (no per-variable data)"
    extra: dict[str, Any] = {"click": click} if click else {}
    return liveness_sections_figure(layers, bands, found, capacity_per_ipu(entry), lo, hi,
                                    naming=naming(entry), ranges=ranges, **extra)


def _count(entry: Entry) -> int:
    live = entry.profile.liveness
    return int(live["ipu"].nunique()) if len(live) else 0


def _ipus(entry: Entry) -> list[int]:
    """The devices drawn, in order: all of them, or the MAX_PANELS with the highest peak."""
    def build() -> list[int]:
        peaks = peak_liveness(entry.profile.liveness)
        if len(peaks) <= MAX_PANELS:
            return sorted(int(i) for i in peaks.index)
        fullest = peaks.sort_values(ascending=False, kind="stable").index[:MAX_PANELS]
        return sorted(int(i) for i in fullest)
    return entry.get("liveness_shown", build)


def shown_note(entry: Entry) -> str:
    """What a job of more devices than panels draws, or ""."""
    total, shown = _count(entry), _ipus(entry)
    if len(shown) >= total:
        return ""
    words = naming(entry)
    return (f"{total:,} {words.devices}: the {len(shown)} with the highest peak are drawn "
            f"({', '.join(words.label(i) for i in shown)}); every {words.device}'s peak "
            "is on /stages and /memory.")


def panel_ranges(relayout: dict | None, ipus: list[int],
                 held: dict[str, list[float]] | None) -> dict[str, list[float]] | None:
    """The steps each IPU's panel shows after a zoom, pan or reset: `held` (the last
    ones, a small store) updated from the axes the event touched (xaxis -> the first
    IPU, xaxis2 -> the second, ...); None when it touched no x-axis."""
    out = dict(held or {})
    touched = False
    relayout = relayout or {}
    for key, value in relayout.items():
        name, _, rest = key.partition(".")
        if not name.startswith("xaxis"):
            continue
        index = int(name[5:] or 1) - 1
        if not 0 <= index < len(ipus):
            continue
        ipu = str(ipus[index])
        if rest == "autorange" and value is True:
            out.pop(ipu, None)
            touched = True
        elif rest == "range" and isinstance(value, list) and len(value) == 2:
            out[ipu] = sorted([float(value[0]), float(value[1])])
            touched = True
        elif rest == "range[0]" and f"{name}.range[1]" in relayout:
            out[ipu] = sorted([float(value), float(relayout[f"{name}.range[1]"])])
            touched = True
    return out if touched else None


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
    live = merged_variables(analysis.variables_live_at(p.variables, ipu, step))
    head = (f"{where}: {len(live)} not-always-live variables, "
            f"{fmt_bytes(live['bytes'].sum()) if len(live) else '0 B'}")
    live = live.assign(size=[fmt_bytes(b) for b in live["bytes"]],
                       name=[stash_variable_name(n) for n in live["name"]])[LIVE_COLUMNS]
    return head, live


def _box(entry: Entry, live: pd.DataFrame) -> Any:
    return table("live-vars", live, words=naming(entry)) if len(live.columns) else []


GPU_LIVENESS = ("A GPU plan: bytes PyTorch's caching allocator holds after each op, "
                "replayed in the order the schedule runs them. Always-live: parameters and "
                "optimiser state; not-always-live: the rest of max_memory_allocated "
                "(activations, gradients, temporaries); the liveness table's "
                "reserved_bytes is max_memory_reserved. Click the curve to list live "
                "tensors.")


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
    hint = (GPU_LIVENESS if naming(entry).gpu_plan else
            ("Always-live: the least the rank held over the recording (its parameters, "
             "gradients and optimiser state); " if gpu_timed(entry) else
             "Always-live: the least the rank held over the recording; on a CPU the "
             "trace's memory events count only what was allocated after the profiler "
             "started, so the parameters allocated before are not in it; ") +
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
    stashed = "" if not naming(entry).has_tiles else stash_line(entry.profile.stages,
                                                           naming(entry).label)
    return html.Div([
        html.H2(title_of(entry)),
        html.P(hint, className="hint"),
        *([html.P(always_live_text(always, naming(entry).label), id="always-live",
                  className="hint")] if always and naming(entry).has_tiles else []),
        *([html.P(stashed, id="live-stash", className="hint")] if stashed else []),
        *([html.P(note, id="live-shown", className="hint")] if (note := shown_note(entry))
          else []),
        html.Div(id="live-linked", className="status"),
        graph("live-graph", liveness(ctx, entry)),
        dcc.Store(id="live-ranges", data={}),
        html.Div(id="live-init", style={"display": "none"}),
        html.Div(id="live-to-trace", className="downloads"),
        html.H3(head, id="live-vars-head"),
        html.Div(_box(entry, live), id="live-vars-box"),
        *heat,
        # no variables table (an import keeps none): no CSV of only its header
        downloads(entry.rel, ["liveness"] + (["variables"] if len(entry.profile.variables)
                                             else []),
                  list(FIGURES) if ipus else ["liveness"],  # no tiles: no tile heat map
                  words=naming(entry)),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    def zoom_to(relayout: dict | None, search: str,
                held: dict | None = None) -> tuple[Any, dict]:
        """Each IPU's panel zooms on its own steps (each IPU counts its own); the steps
        shown per IPU go to a small store the heat map follows (never the figure)."""
        entry = ctx.cache.get(profile_of(search))
        ranges = panel_ranges(relayout, _ipus(entry), held)
        if ranges is None:
            raise PreventUpdate
        return liveness(ctx, entry, ranges={int(k): (v[0], v[1]) for k, v in
                                            ranges.items()}), ranges

    @app.callback(Output("live-graph", "figure"), Output("live-ranges", "data"),
                  Input("live-graph", "relayoutData"), State("live-ranges", "data"),
                  State("url", "search"), prevent_initial_call=True)
    def zoom_cb(relayout: dict | None, held: dict | None, search: str) -> tuple[Any, dict]:
        return zoom_to(relayout, search, held)

    def zoom(relayout: dict | None, search: str, held: dict | None = None) -> Any:
        return zoom_to(relayout, search, held)[0]

    def click_at(click: dict | None, search: str) -> tuple[str, Any, Any]:
        point = (click or {}).get("points", [{}])[0]
        custom = point.get("customdata")
        if "x" not in point or not isinstance(custom, list) or len(custom) < 4:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        ipu = int(custom[3])
        head, live = live_variables(entry, ipu, round(float(point["x"])))
        # the heat map below follows the clicked IPU (when the profile has one)
        shape = entry.profile.array_shape("tile_liveness")
        has_heat = len(shape) == 3 and ipu < shape[0]
        return head, _box(entry, live), ipu if has_heat else None

    @app.callback(Output("live-vars-head", "children"), Output("live-vars-box", "children"),
                  Input("live-graph", "clickData"), State("url", "search"),
                  prevent_initial_call=True)
    def click_cb(click: dict | None, search: str) -> tuple[str, Any]:
        head, box, ipu = click_at(click, search)
        # the IPU picker exists only where there are tiles: a declared Output on a page
        # without it is a Dash error, so it is set only when it is there
        if ipu is not None:
            dash.set_props("live-ipu", {"value": ipu})
        return head, box

    def click(click: dict | None, search: str) -> tuple[str, Any]:
        return click_at(click, search)[:2]

    def heat(ipu: int, relayout: dict | None, search: str, held: dict | None = None) -> Any:
        """The heat map of the picked IPU over the steps its liveness panel shows; its own
        zoom (steps on y) refines that."""
        entry = ctx.cache.get(profile_of(search))
        source = triggered()  # None when called directly (tests, bench): use the relayout
        from_zoom = source == "tile-live-graph" or (source is None and relayout is not None)
        wanted = axis_range(relayout, "y") if from_zoom else "auto"
        if wanted is None:
            raise PreventUpdate
        if wanted == "auto":
            span = (held or {}).get(str(int(ipu)))
            if span:
                return tiles(ctx, entry, int(ipu), max(0.0, span[0]), span[1])
            return tiles(ctx, entry, int(ipu))
        return tiles(ctx, entry, int(ipu), *wanted)

    @app.callback(Output("tile-live-graph", "figure"), Input("live-ipu", "value"),
                  Input("tile-live-graph", "relayoutData"), Input("live-ranges", "data"),
                  State("url", "search"), prevent_initial_call=True)
    def heat_cb(ipu: int, relayout: dict | None, held: dict | None, search: str) -> Any:
        return heat(ipu, relayout, search, held)

    @app.callback(Output("live-to-trace", "children"), Input("live-graph", "clickData"),
                  State("url", "search"), prevent_initial_call=True)
    def to_trace(click: dict | None, search: str) -> Any:
        """The clicked step (its device and step alone) as a link to the trace at it."""
        point = (click or {}).get("points", [{}])[0]
        custom = point.get("customdata")
        if "x" not in point or not isinstance(custom, list) or len(custom) < 4:
            raise PreventUpdate
        return step_link(ctx.cache.get(profile_of(search)), int(custom[3]),
                         round(float(point["x"])))

    @app.callback(Output("live-graph", "figure", allow_duplicate=True),
                  Output("live-ranges", "data", allow_duplicate=True),
                  Output("live-linked", "children"), Input("live-init", "children"),
                  State("url", "search"), prevent_initial_call="initial_duplicate")
    def from_trace(_init: Any, search: str) -> tuple[Any, dict, str]:
        """With `&t0=&t1=`: each panel on its steps in that trace range."""
        window = links.window_of(search)
        if window is None:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        return linked_view(ctx, entry, window[0], window[1])

    return {"zoom": zoom, "click": click, "heat": heat, "zoom_to": zoom_to,
            "click_at": click_at, "to_trace": to_trace, "from_trace": from_trace}


def step_link(entry: Entry, ipu: int, step: int) -> Any:
    trace = entry.profile.trace
    span = step_span(entry.profile.liveness, trace, ipu, step)
    if span is None:
        return html.Span(f"Step {step} has no place on the trace.", className="hint")
    t0, t1 = padded(span, trace)
    words = naming(entry)
    return [html.Span(f"{words.label(ipu)}, step {step}: ", className="label"),
            links.link(f"open the Trace there ({t0:,.0f} to {t1:,.0f} {words.unit})",
                       links.href("/trace", entry.rel, t0, t1, ipu), "live-trace-link")]


def linked_view(ctx: AppContext, entry: Entry, t0: float, t1: float
                ) -> tuple[Any, Any, str]:
    """(figure, ranges store, note) of the steps each device had in [t0, t1]."""
    found = steps_in_range(entry.profile.liveness, entry.profile.trace, t0, t1)
    words = naming(entry)
    lo, hi = run_window(entry)
    if hi > lo and (t1 < lo or t0 > hi):  # a hand-made URL: say so, not its 100 digits
        return dash.no_update, dash.no_update, (
            f"The range linked is outside the run ({lo:,.0f} to {hi:,.0f} {words.unit}): "
            "showing every step.")
    if hi > lo:  # what of the range the run holds (a range past its ends, in readable digits)
        t0, t1 = max(t0, lo), min(t1, hi)
    span = f"{t0:,.0f} to {t1:,.0f} {words.unit}"
    if not found:
        return dash.no_update, dash.no_update, f"No liveness step in {span} (the range " \
            "linked from the trace): showing every step."
    ranges = {str(i): [lo - 0.5, hi + 0.5] for i, (lo, hi) in found.items()}
    fig = liveness(ctx, entry, ranges={int(k): (v[0], v[1]) for k, v in ranges.items()})
    steps = "; ".join(f"{words.label(i)} steps {lo:,} to {hi:,}" for i, (lo, hi) in
                      sorted(found.items()))
    return fig, ranges, f"The range linked from the trace, {span}: {steps}."
