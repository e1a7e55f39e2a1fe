"""The allocation view under /memory for a profile imported with a CUDA memory snapshot
(popviz.analysis.allocations, popviz.figures.allocations): live blocks over time, reserved
against allocated, and a clicked block's stack. Wiring only.

A click sends the server the block id alone (picked from the point's customdata in the
browser), a zoom its x range: never a figure (issue 21: waitress's 1 MiB body limit)."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz.analysis import allocations as al
from popviz.analysis.links import padded
from popviz.figures.allocations import allocator_state_figure, block_timeline_figure
from popviz.units import fmt_bytes

from . import links
from .cache import Entry
from .common import AppContext, graph, naming, profile_of, triggered, x_range

HIDDEN = {"display": "none"}

# the clicked band's block id (its customdata; -1 is the grey band of smaller blocks)
PICK = """function(click) {
    const p = click && click.points && click.points[0];
    const c = p && p.customdata;
    // a row of a numeric customdata is a typed array, not an Array
    const b = c !== null && typeof c === 'object' ? Number(c[0]) : Number(c);
    return Number.isFinite(b) ? {block: b} : window.dash_clientside.no_update;
}"""


def tables(entry: Entry) -> tuple[Any, Any, Any]:
    p = entry.profile
    return p.table("alloc_blocks"), p.table("alloc_segments"), p.table("alloc_frames")


def available(entry: Entry) -> bool:
    return al.has_allocations(entry.profile.table("alloc_blocks"))


def origin(entry: Entry, ipu: int) -> int:
    """x = 0 of every redraw: the device's first recorded instant (zooms keep their axis)."""
    blocks = entry.profile.table("alloc_blocks")
    on = blocks[blocks["ipu"] == ipu]
    return int(on["start"].min()) if len(on) else 0


def blocks_figure(entry: Entry, ipu: int, t0: int | None = None, t1: int | None = None
                  ) -> Any:
    blocks, _, frames = tables(entry)
    labels = entry.get(("alloc_labels", ipu), lambda: al.top_frame(frames, ipu))
    timeline = al.block_timeline(blocks, ipu, t0, t1)
    return block_timeline_figure(timeline, labels, origin=origin(entry, ipu))


def state_figure(entry: Entry, ipu: int) -> Any:
    blocks, segments, _ = tables(entry)
    series = entry.get(("alloc_series", ipu),
                       lambda: al.allocator_series(blocks, segments, ipu))
    return allocator_state_figure(series, origin(entry, ipu))


def summary_text(entry: Entry, ipu: int) -> str:
    blocks, segments, _ = tables(entry)
    series = entry.get(("alloc_series", ipu),
                       lambda: al.allocator_series(blocks, segments, ipu))
    s = al.allocation_summary(series, blocks, ipu)
    if not s:
        return "The snapshot records no allocator events on this device."
    at = origin(entry, ipu)
    return (f"Peak allocated {fmt_bytes(s['peak_allocated'])} at "
            f"{(s['peak_time'] - at) / 1e6:,.2f} ms, with {fmt_bytes(s['reserved_at_peak'])} "
            f"reserved; reserved peaks at {fmt_bytes(s['peak_reserved'])}. Most fragmentation "
            f"(reserved, cached by the allocator, but no live block in it): "
            f"{fmt_bytes(s['max_fragmentation'])} at "
            f"{(s['fragmentation_time'] - at) / 1e6:,.2f} ms. {s['blocks']:,} blocks, "
            f"{s['from_start']:,} of them live before the recording began, {s['to_end']:,} "
            "still live at the snapshot.")


def status_text(fig: Any) -> str:
    meta = fig.layout.meta or {}
    if "blocks" not in meta:
        return ""
    return (f"{meta['blocks']:,} largest blocks drawn as bands"
            + (f"; {meta['hidden']:,} smaller ones share the grey band beneath"
               if meta["hidden"] else "") + ". Zoom in to draw a range's own largest blocks.")


def detail(entry: Entry, ipu: int, block: int) -> list[Any]:
    """One block: size, address, lifetime, and its stack (memory_viz's frames)."""
    if block == al.OTHER:
        return [html.P("The grey band is the blocks too small to draw alone; zoom in to "
                       "draw them.", className="hint", id="alloc-block-head")]
    blocks, _, frames = tables(entry)
    try:
        d = al.block_detail(blocks, frames, ipu, block)
    except ValueError as exc:
        return [html.P(str(exc), className="hint", id="alloc-block-head")]
    at = origin(entry, ipu)
    since = "before the recording began" if d["from_start"] else \
        f"{(d['start'] - at) / 1e6:,.3f} ms"
    until = "still live at the snapshot" if d["to_end"] else \
        f"freed at {(d['end'] - at) / 1e6:,.3f} ms"
    head = (f"Block {d['block']}: {fmt_bytes(d['bytes'])} at {d['addr']:#x} "
            f"(stream {d['stream']}), allocated {since}, {until}")
    to_trace = _trace_link(entry, ipu, d["start"], d["end"])
    if not d["frames"]:
        why = ("its allocation was not recorded (live before the history began) and the "
               "snapshot keeps no stack for it" if d["stack"] < 0 else
               "every frame is the allocator's or the interpreter's own")
        return [html.H4(head, id="alloc-block-head"), *to_trace,
                html.P(f"No stack frames: {why}.", className="hint")]
    kind = "free" if d["from_start"] and not d["to_end"] else "allocation"
    note = f"Stack of its {kind}, innermost first (filename:line name)"
    if d["hidden"]:
        note += f"; {d['hidden']} allocator and interpreter frames left out"
    return [html.H4(head, id="alloc-block-head"), *to_trace,
            html.P(note + ":", className="hint"),
            html.Pre("\n".join(d["frames"]), id="alloc-frames", className="frames")]


def _trace_link(entry: Entry, ipu: int, start: int, end: int) -> list[Any]:
    """A link to the trace over the block's life, when the snapshot shares the trace's
    clock there (a snapshot of another run lies outside the trace: no link)."""
    trace = entry.profile.trace
    if trace.empty or end < float(trace["start"].min()) or start > float(trace["end"].max()):
        return []
    t0, t1 = padded((float(start), float(end)), trace)
    return [html.Div(links.link("Open its life in the Trace", links.href(
        "/trace", entry.rel, t0, t1, ipu), "alloc-trace-link"), className="downloads")]


def section(entry: Entry) -> html.Div:
    """The allocation view, or nothing when the profile holds no snapshot's blocks."""
    if not available(entry):
        return html.Div(id="alloc-view", style=HIDDEN)
    devices = al.allocation_devices(entry.profile.table("alloc_blocks"))
    ipu = devices[0]
    fig = blocks_figure(entry, ipu)
    words = naming(entry)
    return html.Div([
        html.H3("CUDA allocator (memory snapshot)"),
        html.P("As PyTorch's memory_viz draws it: each block is a band from its allocation to "
               "its free, stacked in allocation order (the blocks above a freed one drop). "
               "Click a band for its size and stack; drag to zoom.", className="hint"),
        html.Div([html.Span(f"{words.device} ", className="label"),
                  dcc.Dropdown(id="alloc-ipu", clearable=False, value=ipu,
                               options=[{"label": words.label(i), "value": i}
                                        for i in devices], className="picker")],
                 className="row", style=None if len(devices) > 1 else HIDDEN),
        html.P(summary_text(entry, ipu), id="alloc-summary", className="status"),
        html.Div(status_text(fig), id="alloc-status", className="status"),
        dcc.Store(id="alloc-pick"),
        graph("alloc-blocks", fig),
        html.Div(html.P("Click a block for its stack frames.", className="hint"),
                 id="alloc-block"),
        graph("alloc-state", state_figure(entry, ipu)),
    ], id="alloc-view")


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    app.clientside_callback(PICK, Output("alloc-pick", "data"),
                            Input("alloc-blocks", "clickData"), prevent_initial_call=True)

    @app.callback(Output("alloc-block", "children"), Input("alloc-pick", "data"),
                  State("alloc-ipu", "value"), State("url", "search"),
                  prevent_initial_call=True)
    def alloc_pick(pick: dict | None, ipu: Any, search: str) -> list[Any]:
        if not isinstance(pick, dict) or "block" not in pick or ipu is None:
            raise PreventUpdate
        try:
            block = int(pick["block"])
        except (TypeError, ValueError):
            raise PreventUpdate from None
        return detail(ctx.cache.get(profile_of(search)), int(ipu), block)

    @app.callback(Output("alloc-blocks", "figure"), Output("alloc-status", "children"),
                  Output("alloc-state", "figure"), Output("alloc-summary", "children"),
                  Input("alloc-blocks", "relayoutData"), Input("alloc-ipu", "value"),
                  State("url", "search"), prevent_initial_call=True)
    def alloc_zoom(relayout: dict | None, ipu: Any, search: str) -> tuple[Any, ...]:
        """A zoom redraws the range's own largest blocks; a new device redraws all."""
        if ipu is None:
            raise PreventUpdate
        entry = ctx.cache.get(profile_of(search))
        ipu = int(ipu)
        if triggered() == "alloc-ipu":
            fig = blocks_figure(entry, ipu)
            return fig, status_text(fig), state_figure(entry, ipu), summary_text(entry, ipu)
        wanted = x_range(relayout)
        if wanted is None:
            raise PreventUpdate
        at = origin(entry, ipu)
        if isinstance(wanted, str):  # "auto": the whole run
            fig = blocks_figure(entry, ipu)
        else:
            fig = blocks_figure(entry, ipu, at + int(wanted[0] * 1e6), at + int(wanted[1] * 1e6))
        return fig, status_text(fig), dash.no_update, dash.no_update

    return {"alloc_pick": alloc_pick, "alloc_zoom": alloc_zoom}
