"""`/trace`: lanes per IPU (rank when measured) for compute, ops, sync, exchange and host
I/O; an import of format 1.2 in Perfetto's layout instead (host threads, GPU idle, CUDA
streams, launch -> kernel arrows); a flame / flat control (nested rows by depth, or one
row per lane); zoom or pan redraws the visible range on the server, down to single ops; a
box selection (or the zoomed window) gives statistics for that range. `&module=PATH`
outlines one module's ops and opens on its first pass (the program tree links here);
`&t0=&t1=` (`&ipu=`) opens on that range (from a liveness step, an op or a tree box), and
the range shown or selected here links on to /operations and /liveness."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz.analysis.links import op_slices
from popviz.analysis.trace_detail import module_levels
from popviz.analysis.trace_threads import (
    FLAME,
    MODES,
    launch_links,
)
from popviz.figures.trace_lanes import trace_lanes_figure
from popviz.figures.trace_threads import counts_in_view, thread_lanes_figure

from .. import links, trace_bsp, trace_find
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
from ..trace_ranks import default_ranks, drawn_ranks, rank_picker
from ..trace_stats import (
    compute_link,
    opening_window,
    stats_panel,
    templates,
    threads,
)

PATH = "/trace"
TITLE = "Trace"
NEEDS_PROFILE = True


def trace(ctx: AppContext, entry: Entry, lo: float | None = None, hi: float | None = None,
          module: str | None = None, mode: str = FLAME, op: int | None = None,
          ranks: list[int] | None = None) -> Any:
    """The trace figure of [lo, hi); `op`: that op outlined (a link's `&op=`); `ranks`:
    only those ranks' lanes (an import of many)."""
    mode = mode if mode in MODES else FLAME
    if threads(entry):
        slices = entry.profile.table("host_slices")
        links = entry.get("launch_links", lambda: launch_links(slices, entry.profile.trace))
        # an op here is its host slice (no modelled op level to outline it in)
        lit = None if op is None else entry.get(
            ("op_slices", op), lambda: op_slices(entry.profile.ops, slices, op))
        return thread_lanes_figure(slices, entry.profile.trace, links, lo, hi, mode=mode,
                                   naming=naming(entry),
                                   kernels=entry.get("kernels",
                                                     lambda: entry.profile.table("kernels")),
                                   ranks=ranks, highlight=lit)
    levels = entry.get("module_levels", lambda: module_levels(entry.profile.ops))
    return trace_lanes_figure(trace_index(entry), lo, hi, naming=naming(entry),
                              templates=templates(entry), highlight=module or None,
                              flat=mode != FLAME, module_levels=levels, highlight_op=op)


FIGURES = {"trace": trace}


def module_window(entry: Entry, module: str) -> tuple[float, float] | None:
    """The span of the first compute event that runs an op of `module` (or its children)."""
    ops = entry.profile.ops
    if not module or "module" not in ops or not {"stage", "pass"} <= set(ops.columns):
        return None
    mods = ops["module"].astype(str)
    mine = ops[(mods == module) | mods.str.startswith(module + ".")]
    if mine.empty:
        return None
    keys = set(zip(mine["stage"].astype(int), mine["pass"].astype(str), strict=True))
    tr = entry.profile.trace
    comp = tr[tr["kind"].astype(str) == "compute"]
    hit = comp[[(int(s), str(p)) in keys
                for s, p in zip(comp["stage"], comp["pass"], strict=True)]]
    if hit.empty:
        return None
    first = hit.sort_values("start").iloc[0]
    return float(first["start"]), float(first["end"])


def _status(fig: Any, unit: str = "cycles") -> str:
    meta = fig.layout.meta or {}
    if not meta:
        return ""
    lo, hi = meta["range"]
    if "flows_drawn" in meta:
        return _threads_status(meta, unit)
    if meta["mode"] == "events":
        mode = "every event drawn"
        if meta.get("ops_drawn"):
            n = meta["ops_drawn"]
            mode += f", {n:,} op{'s' if n != 1 else ''} laid out in modelled order"
        elif meta.get("ops_hidden", 0) > 0:
            mode += f"; zoom in further to see the {meta['ops_hidden']:,} ops"
    else:
        mode = "each bucket split by the time each kind ran in it; zoom in for single events"
    view = f" ({meta['view']} layout)" if meta.get("view") else ""
    return f"{meta['visible_events']:,} events in {lo:,.0f} to {hi:,.0f} {unit}: {mode}{view}."


def _threads_status(meta: dict, unit: str) -> str:
    lo, hi = meta["range"]
    drawn = ("every slice drawn" if meta["mode"] == "events" else
             f"{meta['drawn']:,} drawn one by one, the short ones merged per pixel (zoom in)")
    flows = meta["flows_drawn"]
    arrows = (f"{flows:,} launch \u2192 kernel arrows" if flows else
              f"zoom in to see the {meta['flows_hidden']:,} launch \u2192 kernel arrows"
              if meta["flows_hidden"] else "no launch \u2192 kernel link in view")
    counted = counts_in_view(meta["visible_slices"], meta["visible_device_events"])
    return (f"{counted} in {lo:,.0f} to {hi:,.0f} "
            f"{unit}: {drawn}; {arrows} ({meta['view']} layout).")


THREADS_HINT = {  # by whether the ranks ran on GPUs
    True: "Per rank as Perfetto draws it: each host thread (ops, annotations and CUDA "
          "runtime calls), GPU idle gaps (hover one for its cause: what the host was "
          "doing when the GPU ran dry) and each CUDA stream; arrows link a launch "
          "to its kernel; times in ns from the first recorded event. ",
    False: "Per rank as Perfetto draws it: each host thread with its ops and annotations "
           "(on a CPU rank the ops are its compute); times in ns from the first recorded "
           "event. ",
}
ZOOM_HINT = {
    False: "Drag to zoom (down to single ops, laid out in each pass in the compiler's "
           "modelled order), scroll to pan, double-click to reset; pick Box Select in the "
           "toolbar and drag for statistics of a range.",
    True: "Drag to zoom (down to single events, at their measured times), scroll to pan, "
          "double-click to reset; pick Box Select in the toolbar and drag for statistics "
          "of a range.",
}


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    if entry.profile.trace.empty:
        return html.Div([html.H2(title_of(entry)),
                         message("This profile has no trace events.", "info")])
    window = opening_window(entry)
    shown = default_ranks(entry, threads(entry))
    lo0, hi0 = window or (None, None)
    fig = trace(ctx, entry, lo0, hi0, ranks=shown)
    words = naming(entry)
    rows = ("Lanes per GPU; modelled times in ns. " if words.gpu_plan else
            "Lanes per rank (process); times in ns from the first recorded step. "
            if words.measured else "Lanes per IPU; times in cycles. ")
    opening = ("Opened on the ramp-up and the first steady-state steps; the strip at the "
               "bottom is the whole run (double-click the trace for all of it). "
               if window else "")
    lo, hi = (float(v) for v in fig.layout.meta["range"])
    if threads(entry):  # no whole-run strip under these lanes
        rows = THREADS_HINT[compute_link(entry)[1]]
        opening = ("Opened on the first part of the run (double-click the trace for all of "
                   "it). " if window else "")
    return html.Div([
        html.H2(title_of(entry)),
        html.P(rows + opening + ZOOM_HINT[words.measured],
               className="hint"),
        html.Div([html.Span("Layout: ", className="label"), dcc.RadioItems(
            id="trace-mode", value=FLAME, inline=True, options=[
                {"label": " flame (nested rows by depth)", "value": FLAME},
                {"label": " flat (one row per lane)", "value": "flat"}]),
            html.Button("Whole run", id="trace-whole", n_clicks=0, className="button",
                        title="zoom out to the whole run (so does a double-click)")],
            className="controls"),
        rank_picker(entry, shown),
        trace_find.section(),
        html.Div(_status(fig, words.unit), id="trace-status", className="status"),
        html.Div(id="trace-init", style={"display": "none"}),
        dcc.Store(id="trace-window", data=_window(lo, hi, "Shown window")),
        dcc.Store(id="trace-selection"),
        # a double-click autoranges (Plotly's default also resets and autosizes, and the
        # autosize event that follows replaces the autorange one before the server sees it)
        graph("trace-graph", fig, config={"doubleClick": "autosize"}),
        html.Div(range_links(entry, lo, hi), id="trace-links", className="downloads"),
        html.Div(stats_panel(entry, lo, hi, "Shown window"), id="trace-stats"),
        trace_bsp.section(entry),
        downloads(entry.rel, ["trace"], list(FIGURES), words=naming(entry)),
    ])


def range_links(entry: Entry, lo: float, hi: float, how: str = "this window") -> list[Any]:
    """Links that carry the range to the views that follow one (numbers in the URL)."""
    return [html.Span(f"Open {how} in: ", className="label"),
            links.link("Operations (ops that ran in it)",
                       links.href("/operations", entry.rel, lo, hi), "trace-to-ops"),
            links.link("Liveness (its steps)", links.href("/liveness", entry.rel, lo, hi),
                       "trace-to-liveness")]


def _op_param(search: str | None) -> int | None:
    """`&op=ID` of a link to one op (outlined on the trace); None when absent or bad."""
    text = _param(search, "op")
    return int(text) if text.isdigit() and len(text) < 19 else None


def _linked_rank(search: str | None) -> int | None:
    """`&ipu=R` of a link to a range on one rank."""
    linked = links.window_of(search or "")
    return linked[2] if linked is not None else None


def _param(search: str | None, name: str) -> str:
    values = parse_qs((search or "").lstrip("?")).get(name, [])
    return values[0] if values else ""


# [lo, hi] of a box selection's x range; null when the selection is cleared
SELECTION_RANGE = """function(selected) {
    const x = selected && selected.range && selected.range.x;
    return x && x.length === 2 ? [Math.min(x[0], x[1]), Math.max(x[0], x[1])] : null;
}"""


def _window(lo: float, hi: float, how: str) -> dict[str, Any]:
    """What the statistics callback needs of a redraw: the shown range and its heading (a
    few bytes; the figure itself never goes back to the server: 3 MB of a zoomed-out
    long run is past `popviz serve`'s request limit, issue 21)."""
    return {"range": [lo, hi], "how": how}


def _drawn(fig: Any, how: str) -> dict[str, Any]:
    lo, hi = (float(v) for v in fig.layout.meta["range"])
    return _window(lo, hi, how)


def _with_panels(entry: Entry, fig: Any, window: dict[str, Any]) -> tuple[Any, ...]:
    """A redraw's outputs: the figure, its status line, the window it shows, and that
    window's statistics and links."""
    lo, hi = window["range"]
    return (fig, _status(fig, naming(entry).unit), window,
            stats_panel(entry, lo, hi, window["how"]), range_links(entry, lo, hi))


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    # a redraw of another window sends that window's statistics and links with the figure:
    # one round trip, where a second one after the figure cost each zoom about 0.1 s
    panels = (Output("trace-stats", "children", allow_duplicate=True),
              Output("trace-links", "children", allow_duplicate=True))

    @app.callback(Output("trace-graph", "figure"), Output("trace-status", "children"),
                  Output("trace-window", "data"), *panels,
                  Input("trace-graph", "relayoutData"), State("url", "search"),
                  State("trace-mode", "value"), State("trace-ranks", "value"),
                  prevent_initial_call=True)
    def zoom(relayout: dict | None, search: str, mode: str | None = FLAME,
             picked: list | None = None) -> tuple[Any, ...]:
        wanted = x_range(relayout)
        if wanted is None:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        module = _param(search, "module")
        op = _op_param(search)
        ranks = drawn_ranks(entry, threads(entry), picked, _linked_rank(search))
        if isinstance(wanted, str):  # "auto": the whole run
            fig = trace(ctx, entry, module=module, mode=mode or FLAME, op=op, ranks=ranks)
        else:
            fig = trace(ctx, entry, wanted[0], wanted[1], module=module, mode=mode or FLAME,
                        op=op, ranks=ranks)
        return _with_panels(entry, fig, _drawn(fig, "Shown window"))

    @app.callback(Output("trace-graph", "figure", allow_duplicate=True),
                  Output("trace-status", "children", allow_duplicate=True),
                  Output("trace-window", "data", allow_duplicate=True), *panels,
                  Input("trace-whole", "n_clicks"), State("url", "search"),
                  State("trace-mode", "value"), State("trace-ranks", "value"),
                  prevent_initial_call=True)
    def whole(clicks: int | None, search: str, mode: str | None = FLAME,
              picked: list | None = None) -> tuple[Any, ...]:
        """The "Whole run" button: the same as a double-click's autorange."""
        if not clicks:
            raise PreventUpdate
        return zoom({"xaxis.autorange": True}, search, mode, picked)

    @app.callback(Output("trace-graph", "figure", allow_duplicate=True),
                  Output("trace-status", "children", allow_duplicate=True),
                  Input("trace-mode", "value"), State("trace-window", "data"),
                  State("url", "search"), State("trace-ranks", "value"),
                  prevent_initial_call=True)
    def relayout_mode(mode: str, window: dict | None, search: str,
                      picked: list | None = None) -> tuple[Any, str]:
        """Flame or flat, or other ranks, over the window shown now."""
        entry = ctx.cache.get(profile_of(search))
        shown = (window or {}).get("range") or [None, None]
        fig = trace(ctx, entry, shown[0], shown[1], module=_param(search, "module"), mode=mode,
                    op=_op_param(search),
                    ranks=drawn_ranks(entry, threads(entry), picked, _linked_rank(search)))
        return fig, _status(fig, naming(entry).unit)

    @app.callback(Output("trace-graph", "figure", allow_duplicate=True),
                  Output("trace-status", "children", allow_duplicate=True),
                  Input("trace-ranks", "value"), State("trace-mode", "value"),
                  State("trace-window", "data"), State("url", "search"),
                  prevent_initial_call=True)
    def pick_ranks(picked: list | None, mode: str | None, window: dict | None,
                   search: str) -> tuple[Any, str]:
        """Other ranks picked (an import of many): their lanes over the window shown."""
        return relayout_mode(mode or FLAME, window, search, picked)

    @app.callback(Output("trace-graph", "figure", allow_duplicate=True),
                  Output("trace-status", "children", allow_duplicate=True),
                  Output("trace-window", "data", allow_duplicate=True), *panels,
                  Input("trace-init", "children"), State("url", "search"),
                  State("trace-ranks", "value"), prevent_initial_call="initial_duplicate")
    def focus(_init: Any, search: str, picked: list | None = None) -> tuple[Any, ...]:
        """With `&t0=&t1=` (`&ipu=`): open on that range; with `&module=PATH`: on that
        module's first pass, its ops outlined."""
        module = _param(search, "module")
        linked = links.window_of(search)
        if not module and linked is None:  # the layout already drew the opening window
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        if linked is not None:
            t0, t1, ipu = linked
            fig = trace(ctx, entry, t0, t1, module=module, op=_op_param(search),
                        ranks=drawn_ranks(entry, threads(entry), picked, ipu))
            on = f" on {naming(entry).label(ipu)}" if ipu is not None else ""
            return _with_panels(entry, fig, _drawn(fig, f"Linked range{on}"))
        window = module_window(entry, module) or opening_window(entry) or (None, None)
        fig = trace(ctx, entry, window[0], window[1], module=module,
                    ranks=drawn_ranks(entry, threads(entry), picked))
        return _with_panels(entry, fig, _drawn(fig, f"First pass running {module}"))

    # selectedData holds every selected bar with its hover data (220 KB for 2,000 ops):
    # the browser keeps only the box's x range for the server
    app.clientside_callback(SELECTION_RANGE, Output("trace-selection", "data"),
                            Input("trace-graph", "selectedData"), prevent_initial_call=True)

    @app.callback(Output("trace-stats", "children"), Input("trace-selection", "data"),
                  State("trace-window", "data"), State("url", "search"),
                  prevent_initial_call=True)
    def stats(box: list | None, window: dict | None, search: str) -> list[Any]:
        """The statistics of the box just selected, else (the box cleared) of the shown
        window."""
        entry = ctx.cache.get(profile_of(search))
        if box and len(box) == 2:  # the only trigger: a box selected or cleared
            return stats_panel(entry, float(min(box)), float(max(box)), "Selected range")
        shown = (window or {}).get("range")
        if not shown or len(shown) != 2:
            raise PreventUpdate
        return stats_panel(entry, float(shown[0]), float(shown[1]),
                           str((window or {}).get("how") or "Shown window"))

    @app.callback(Output("trace-links", "children"), Input("trace-selection", "data"),
                  State("trace-window", "data"), State("url", "search"),
                  prevent_initial_call=True)
    def follow(box: list | None, window: dict | None, search: str) -> list[Any]:
        """The links carry the box just selected, else the shown window."""
        entry = ctx.cache.get(profile_of(search))
        if box and len(box) == 2:
            return range_links(entry, float(min(box)), float(max(box)), "the selected range")
        shown = (window or {}).get("range")
        if not shown or len(shown) != 2:
            raise PreventUpdate
        return range_links(entry, float(shown[0]), float(shown[1]))

    return {"zoom": zoom, "whole": whole, "focus": focus, "stats": stats, "follow": follow,
            "mode": relayout_mode, "ranks": pick_ranks,
            **trace_bsp.register(app, ctx), **trace_find.register(app, ctx)}
