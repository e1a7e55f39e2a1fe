"""`/tree`: the program tree (model -> blocks -> layers -> ops) as an icicle; clicking a box
lists its ops below and links to the ops table filtered to it and to the trace at its first
pass (`t0`, `t1`, `ipu`) with its ops outlined."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz.analysis.links import module_span, padded
from popviz.analysis.program_tree import (
    PASS_NAMES,
    ROOT,
    flops_recorded,
    node_ops,
    program_tree,
    step_weights,
    tree_window,
    viewed_node,
)
from popviz.figures.tree import program_tree_figure, stage_colour, starts_text
from popviz.units import fmt_bytes, known_or
from popviz.vocab import Naming

from .. import links
from ..cache import Entry
from ..common import (
    AppContext,
    downloads,
    gpu_timed,
    graph,
    message,
    naming,
    profile_of,
    table,
    title_of,
)
from ..trace_stats import op_place

PATH = "/tree"
TITLE = "Program tree"
NEEDS_PROFILE = True
NODE_OPS_SHOWN = 25  # a clicked node lists its heaviest ops; /operations has them all
OP_COLUMNS = ["op_id", "op", "module", "pass", "stage", "cycles", "flops", "temp_bytes",
              "bytes_written"]


def _weights(entry: Entry) -> dict[str, float] | None:
    p = entry.profile
    return step_weights(p.meta or {}, p.summary or {}, naming(entry).in_ns)


def per_step(entry: Entry) -> str:
    """What the tree's widths add up to: '1,024 micro-batches and 1 weight update'."""
    w = _weights(entry)
    if not w:
        return ""
    m, u = w["F"], w["WU"]
    return (f"{m:,.0f} micro-batch{'es' if m != 1 else ''} and {u:,.0f} weight "
            f"update{'s' if u != 1 else ''} per step")


def tree_of(entry: Entry) -> pd.DataFrame:
    return entry.get("program_tree", lambda: program_tree(entry.profile.ops, _weights(entry)))


def stage_starts(entry: Entry) -> dict[int, str]:
    """Stage -> the split name it starts at (the stage table's first_layer)."""
    st = entry.profile.stages
    if st.empty or "first_layer" not in st.columns:
        return {}
    return {int(s): str(f) for s, f in zip(st["stage"], st["first_layer"], strict=True) if f}


LEVELS = 3  # levels of boxes drawn at once: the viewed node and two below it


def tree(ctx: AppContext, entry: Entry, root: str = ROOT) -> Any:
    """The icicle viewed from `root`: only the nodes that view draws, so a large program
    draws as fast as a small one; a click on a box sends the window below it (Plotly
    zooms at once on the levels it holds, and the levels under them follow)."""
    frame = tree_of(entry)
    viewed = viewed_node(frame, root)
    return program_tree_figure(tree_window(frame, viewed, LEVELS - 1), naming=naming(entry),
                               per_step=per_step(entry), stage_starts=stage_starts(entry),
                               max_depth=LEVELS, selected=None if viewed == ROOT else viewed)


FIGURES = {"tree": tree}


def _links(entry: Entry, node: str, ops: pd.DataFrame) -> html.Div:
    """Links to the views of a node: its module's ops and passes, and for an op box (a
    measured run's ops may sit under no module) its heaviest op, outlined on /trace."""
    module = node.rsplit("/", 1)[0] if "/" in node else node
    out: list[Any] = []
    if module not in ("", ROOT):
        ops_q = urlencode({"profile": entry.rel, "module": module})
        found = module_span(entry.profile.ops, entry.profile.trace, module)
        if found is None:
            to_trace = f"/trace?{ops_q}"
        else:  # the box's first pass, as a range any trace link can carry
            t0, t1 = padded(found[1], entry.profile.trace)
            to_trace = links.href("/trace", entry.rel, t0, t1, found[0], module=module)
        out += [dcc.Link(f"ops of {module} in Operations", href=f"/operations?{ops_q}",
                         id="tree-to-ops", className="download"),
                dcc.Link(f"{module} in the Trace (its ops outlined)", href=to_trace,
                         id="tree-to-trace", className="download")]
    if "/" in node and len(ops) and "op_id" in ops:
        op_id = int(ops["op_id"].iloc[0])  # node_ops: heaviest first
        place = op_place(entry, op_id)
        if place is not None:
            ipu, _, (t0, t1) = place
            out.append(dcc.Link(f"its heaviest op ({op_id}) in the Trace, outlined",
                                href=links.href("/trace", entry.rel, t0, t1, ipu,
                                                op=str(op_id)),
                                id="tree-to-op", className="download"))
    if not out:
        return html.Div()
    return html.Div([html.Span("Open: ", className="label"), *out], className="downloads")


def node_panel(entry: Entry, node: str) -> list[Any]:
    """The picked node's figures, its heaviest ops and links to the other views."""
    frame = tree_of(entry)
    row = frame[frame["id"] == node]
    if row.empty:
        return [message(f"No node {node!r} in this program.", "info")]
    r = row.iloc[0]
    words = naming(entry)
    ops = node_ops(entry.profile.ops, node)
    to_views = _links(entry, node, ops)
    if "flops" in ops and not flops_recorded(entry.profile.ops):  # as the hover says
        ops = ops.assign(flops="unknown")
    cols = [c for c in OP_COLUMNS if c in ops.columns]
    # a step's compute on every device added up: not the step's length (/summary)
    step = f" of compute per step, summed over its {words.devices}" if per_step(entry) else ""
    head = (f"{node}: {r['cycles']:,.0f} {words.unit}{step}; {int(r['ops']):,} ops, "
            f"{known_or(r['flops'], lambda v: f'{v:,.0f}')} FLOPs, "
            f"{known_or(r['bytes_written'], fmt_bytes)} written, largest temporary "
            f"{known_or(r['temp_bytes'], fmt_bytes)}; stage {r['stages'] or '-'}"
            + (f"; split names {r['layers']}" if r.get("layers") else "")
            + (f"; {starts}" if (starts := starts_text(r["stages"], stage_starts(entry)))
               else "") + ".")
    shown = ops[cols].head(NODE_OPS_SHOWN)
    caption = [] if len(ops) <= NODE_OPS_SHOWN else [html.Div(
        f"Its {NODE_OPS_SHOWN} heaviest ops of {len(ops):,} (by {words.column('cycles')}); "
        "every one is on Operations (the link above).", id="tree-node-ops-caption",
        className="hint")]
    return [html.Div(head, id="tree-node-head", className="status"), to_views,
            *caption, table("tree-node-ops", shown, words=words)]


def _stage_key(entry: Entry, words: Naming) -> html.Div:
    """What each box colour means: one swatch per stage, with its device."""
    stages = entry.profile.stages
    if stages.empty:
        return html.Div()
    swatch = {"display": "inline-block", "width": 12, "height": 12, "marginRight": 4,
              "verticalAlign": "middle"}
    items = [html.Span([html.Span(style={**swatch, "background": stage_colour(str(int(s)))}),
                        f"stage {int(s)} ({words.label(int(i))})"],
                       style={"marginRight": 14})
             for s, i in zip(stages["stage"], stages["ipu"], strict=True)]
    if len(stages) > 1:  # a box holding ops of two stages
        items.append(html.Span([html.Span(style={**swatch,
                                                 "background": stage_colour("0-1")}),
                                "several stages"]))
    return html.Div(items, className="hint", id="tree-key")



def passes_run(entry: Entry) -> str:
    """The passes this profile's ops ran in, in words, in pipeline order ('forward,
    backward, optimiser' for a run with no recomputation)."""
    ops = entry.profile.ops
    seen = set(ops["pass"].astype(str)) if "pass" in ops.columns else set()
    if not seen and "phase" in ops.columns:
        seen = {k for k, v in PASS_NAMES.items() if v in set(ops["phase"].astype(str))}
    words = [w for k, w in PASS_NAMES.items() if k in seen]
    return ", ".join(words) or "forward, backward, recompute, optimiser"


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    frame = tree_of(entry)
    if frame.empty:
        return html.Div([html.H2(title_of(entry)),
                         message("No ops in this profile, so no program tree.", "info")])
    words = naming(entry)
    # an import's op cost is its kernels' GPU time; a measured run's, its host time
    cost = ("modelled cycles" if words.has_tiles else "modelled ns" if words.gpu_plan else
            "measured GPU time (ns) of each op's kernels" if gpu_timed(entry) else
            "host time (ns) of each op")
    return html.Div([
        html.H2(title_of(entry)),
        html.P(f"The model's module hierarchy, each box's parts to its right; each box is "
               f"as tall as its {cost} over every "
               f"pass ({passes_run(entry)}), coloured by stage"
               + (" (grey: several stages)" if len(entry.profile.stages) > 1 else "")
               + ". Click a box to zoom into it and list its ops; click the bar at the top "
               "to go back up.", className="hint"),
        _stage_key(entry, words),
        graph("tree-graph", tree(ctx, entry)),
        dcc.Store(id="tree-level", data=ROOT),  # the node the icicle shows
        dcc.Store(id="tree-window"),  # the next figure, drawn once Plotly's zoom is over
        dcc.Store(id="tree-hooked"),  # set once the click hook (NO_ANIMATION) is on the plot
        html.Div(node_panel(entry, ROOT), id="tree-node"),
        downloads(entry.rel, ["ops"], list(FIGURES), words=naming(entry)),
    ])


# Plotly animates an icicle's click-zoom for 750 ms (plotly.js sunburst/constants.js
# CLICK_TRANSITION_TIME, not a setting), and the levels below arrive only after it. The hook
# cancels the animation (a handler returning false), shows the level Plotly would go to at
# once (`nextLevel`, on the levels the plot holds) and passes the click on to Dash, which
# then sends the levels below: the zoom is drawn in one frame, the rest in one round trip.
NO_ANIMATION = """async function(figure) {
    let plot = null;
    for (let i = 0; i < 100; i++) {
        plot = document.querySelector('#tree-graph .js-plotly-plot');
        if (plot && plot.on) { break; }
        await new Promise(done => setTimeout(done, 50));
    }
    if (!plot || !plot.on || plot._popvizNoAnimation) {
        return window.dash_clientside.no_update;
    }
    plot._popvizNoAnimation = true;
    plot.on('plotly_icicleclick', function(event) {
        if (event.nextLevel !== undefined) {
            Plotly.restyle(plot, {level: [event.nextLevel]}, [0]);
        }
        plot.emit('plotly_click', {points: event.points, event: event.event});
        return false;
    });
    return true;
}"""

AFTER_ZOOM = """async function(figure) {
    if (!figure) { return window.dash_clientside.no_update; }
    const plot = document.querySelector('#tree-graph .js-plotly-plot');
    for (let i = 0; i < 60 && plot && plot._transitioning; i++) {
        await new Promise(done => setTimeout(done, 50));
    }
    return figure;
}"""


def next_level(frame: pd.DataFrame, clicked: str, level: str) -> str:
    """The node Plotly's icicle shows after a click on `clicked` while it shows `level`
    (its rule, plotly.js sunburst/fx.js): the viewed node's own box goes up to its parent,
    a box in the path bar (an ancestor) goes to that box, an op (a leaf) or the model at
    the top stays, any other box is zoomed into."""
    parent = dict(zip(frame["id"], frame["parent"], strict=True))
    if clicked not in parent or level not in parent:
        return level if level in parent else ROOT
    if clicked == level:
        return parent[level] or ROOT
    node = parent[level]
    while node:
        if node == clicked:
            return clicked
        node = parent[node]
    kind = frame.loc[frame["id"] == clicked, "kind"].iloc[0]
    return level if kind == "op" else clicked


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("tree-node", "children"), Output("tree-window", "data"),
                  Output("tree-level", "data"), Input("tree-graph", "clickData"),
                  State("tree-level", "data"), State("url", "search"),
                  prevent_initial_call=True)
    def pick(click: dict | None, level: str | None, search: str
             ) -> tuple[list[Any], Any, str]:
        """The clicked box's panel, and the icicle's window below the node it now shows
        (the hook has zoomed already, on the levels it holds; this brings the ones under)."""
        points = (click or {}).get("points") or []
        if not points or not points[0].get("id"):
            raise PreventUpdate
        node = str(points[0]["id"])
        entry = ctx.cache.get(profile_of(search))
        shown = level or ROOT
        after = next_level(tree_of(entry), node, shown)
        figure = dash.no_update if after == shown else tree(ctx, entry, after)
        # the panel of the node the icicle now shows: a box clicked on the way back up
        # shows its parent's level, not the one left
        return node_panel(entry, after if after != shown else node), figure, after

    # a figure replaced while Plotly still animates its zoom leaves boxes where the
    # animation had them (a gap in the column): wait for the zoom to end
    app.clientside_callback(AFTER_ZOOM, Output("tree-graph", "figure"),
                            Input("tree-window", "data"), prevent_initial_call=True)
    app.clientside_callback(NO_ANIMATION, Output("tree-hooked", "data"),
                            Input("tree-graph", "figure"))
    return {"pick": pick}
