"""An imported trace in Perfetto's layout: per rank its host threads (slices stacked by
nesting depth in flame mode, the innermost slice on one row per thread in flat mode), its
GPU idle gaps with their cause, its CUDA streams, and launch -> kernel flow arrows.

Level of detail, on the server: every slice when at most `max_events` are in view; else
the slices at least `min_px` pixels wide one by one (up to `max_events`, widest first) and
the rest of each row merged per pixel into grey "many short slices" bars. Flow arrows only
for the links with an end in view, and only when at most `max_flows` are (else none: the
status says to zoom in)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.analysis.links import run_span
from popviz.analysis.trace_threads import (
    FLAME,
    Row,
    idle_causes,
    side_events,
    stream_events,
    thread_rows,
    visible,
    visible_links,
)
from popviz.figures.lod import CATEGORIES, category_codes
from popviz.figures.style import (
    CATEGORY_COLOURS,
    CATEGORY_NAMES,
    add_row_lines,
    base_layout,
    empty_figure,
)
from popviz.figures.trace import (
    MAX_EVENTS,
    _stack,
    drop_unfitting_labels,
    reset_to_run,
)
from popviz.figures.trace_host_slices import (
    BAR,
    host_bars,
    selected_bar,
)
from popviz.figures.trace_kernels import hover_names, kernel_labels, launch_lines
from popviz.vocab import MEASURED, Naming

MAX_FLOWS = 300  # arrows drawn at once; more means zoom in
ROW_PX = 22
PIXELS = 500  # buckets per row that short slices merge into
MIN_PX = 2.0  # a slice narrower than this many pixels merges when too many are in view
MERGED = "#9e9e9e"
FLOW = "#444444"


LANE_CODES = {"thread": 0, "waits": 1, "stream": 2}


def _codes(ipu: np.ndarray, lane: np.ndarray, key: np.ndarray,
           depth: np.ndarray) -> np.ndarray:
    """One int64 per (ipu, lane, key, depth): ranks, threads, streams and depths are far
    below the fields' widths (2^20, 2^24, 2^12)."""
    return ((np.asarray(ipu, np.int64) << 40) | (np.asarray(lane, np.int64) << 36)
            | ((np.asarray(key, np.int64) + 1) << 12) | np.asarray(depth, np.int64))


def _row_numbers(index: dict, ipu: np.ndarray, lane: str, key: np.ndarray,
                 depth: np.ndarray) -> np.ndarray:
    """Row of each (ipu, lane, key, depth), vectorised (a million slices: no Python loop)."""
    keys = np.array(list(index), dtype=object).reshape(-1, 4)
    known = _codes(keys[:, 0].astype(np.int64),
                   np.array([LANE_CODES[x] for x in keys[:, 1]], dtype=np.int64),
                   keys[:, 2].astype(np.int64), keys[:, 3].astype(np.int64))
    order = np.argsort(known)
    wanted = _codes(ipu, np.full(len(ipu), LANE_CODES[lane]), key, depth)
    at = np.clip(np.searchsorted(known[order], wanted), 0, len(known) - 1)
    return np.asarray(list(index.values()), dtype=np.int64)[order][at]


def _slice_rows(frame: pd.DataFrame, index: dict, mode: str) -> np.ndarray:
    depth = frame["depth"].to_numpy() if mode == FLAME else np.zeros(len(frame), int)
    return _row_numbers(index, frame["ipu"].to_numpy(), "thread", frame["tid"].to_numpy(),
                        depth)


def _stream_rows(frame: pd.DataFrame, index: dict) -> np.ndarray:
    return _row_numbers(index, frame["ipu"].to_numpy(), "stream",
                        frame["stream"].to_numpy(), np.zeros(len(frame), int))


def _gpu_bars(ev: pd.DataFrame, index: dict, naming: Naming,
              kernels: pd.DataFrame | None = None) -> list[go.Bar]:
    unit = naming.unit
    hover = ("<b>%{customdata[0]}</b><br>%{customdata[1]}<br>launched by %{customdata[2]}"
             f"<br>%{{base:,.0f}} → %{{customdata[3]:,.0f}} {unit} "
             f"(duration %{{customdata[4]:,.0f}} {unit})%{{customdata[5]}}"
             "<extra>%{fullData.name}</extra>")
    codes = category_codes(ev)
    out = []
    for k, cat in enumerate(CATEGORIES):
        sel = ev[codes == k]
        if sel.empty:
            continue
        host = sel["host_op"].astype(str).to_numpy() if "host_op" in sel else \
            np.full(len(sel), "")
        custom = _stack([hover_names(sel["op"]),
                         [f"{naming.label(int(i))} stream {int(s)}" for i, s in
                          zip(sel["ipu"], sel["stream"])],
                         np.where(host == "", "(not recorded)", host),
                         sel["end"].to_numpy(), (sel["end"] - sel["start"]).to_numpy(),
                         [f"<br>{x}" if x else "" for x in launch_lines(sel, kernels)]])
        out.append(go.Bar(
            name=CATEGORY_NAMES[cat], orientation="h",
            y=_stream_rows(sel, index),
            base=sel["start"].to_numpy(dtype=float),
            x=(sel["end"] - sel["start"]).to_numpy(dtype=float), width=BAR,
            marker={"color": CATEGORY_COLOURS[cat], "line": {"width": 0}},
            customdata=custom, hovertemplate=hover, legendgroup=cat,
            # the kernel's name where the bar is wide enough (uniformtext hides the rest)
            text=kernel_labels(sel["op"]), textposition="inside", insidetextanchor="start",
            textfont={"color": "white"}, cliponaxis=True))
    return out


def _side_bars(ev: pd.DataFrame, index: dict, naming: Naming, links: pd.DataFrame,
               slices: pd.DataFrame) -> list[go.Bar]:
    if ev.empty:
        return []
    unit = naming.unit
    idle = ev["kind"].astype(str).to_numpy() == "idle"
    cause = np.where(idle & (ev["op"].astype(str).to_numpy() == "GPU idle"),
                     idle_causes(ev, links, slices), "")
    cause = np.array([c.replace("; at", ";<br>at").replace(" · next:", "<br>next:")
                      for c in cause], dtype=object)  # hover lines, not one long one
    custom = _stack([ev["op"].astype(str).to_numpy(), cause, ev["end"].to_numpy(),
                     (ev["end"] - ev["start"]).to_numpy()])
    hover = ("<b>%{customdata[0]}</b><br>%{customdata[1]}<br>"
             f"%{{base:,.0f}} → %{{customdata[2]:,.0f}} {unit} "
             f"(%{{customdata[3]:,.0f}} {unit})<extra></extra>")
    colour = np.where(idle, "#bdbdbd", CATEGORY_COLOURS["exchange"])
    gpu = bool((cause != "").any())
    return [go.Bar(
        name="GPU idle (hover: why)" if gpu else "p2p waits and transfers", orientation="h",
        y=[index[(int(i), "waits", -1, 0)] for i in ev["ipu"]],
        base=ev["start"].to_numpy(dtype=float),
        x=(ev["end"] - ev["start"]).to_numpy(dtype=float), width=BAR,
        marker={"color": colour, "line": {"width": 0}, "pattern": {"shape": "/"}},
        customdata=custom, hovertemplate=hover)]


def _merged(rows: np.ndarray, start: np.ndarray, end: np.ndarray, lo: float, hi: float,
            pixels: int, name: str = "many short slices (zoom in)",
            colour: str = MERGED) -> go.Bar | None:
    """Slices too short to draw, as one bar per row per run of touched pixels."""
    if not len(rows):
        return None
    w = (hi - lo) / pixels
    a = np.clip(np.floor((start - lo) / w), 0, pixels - 1).astype(np.int64)
    b = np.clip(np.ceil((end - lo) / w), 1, pixels).astype(np.int64)
    b = np.maximum(b, a + 1)
    cover = np.zeros((int(rows.max()) + 1, pixels + 1), dtype=np.int64)
    np.add.at(cover, (rows, a), 1)
    np.add.at(cover, (rows, b), -1)
    busy = np.cumsum(cover, axis=1)[:, :pixels] > 0
    ys, base, width = [], [], []
    for r in np.flatnonzero(busy.any(axis=1)):
        edge = np.diff(np.r_[0, busy[r].astype(np.int8), 0])
        s, e = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)
        ys += [int(r)] * len(s)
        base += list(lo + s * w)
        width += list((e - s) * w)
    return go.Bar(name=name, orientation="h", y=ys, base=base, x=width, width=BAR * 0.6,
                  marker={"color": colour, "line": {"width": 0}, "opacity": 0.75},
                  hovertemplate=f"{name}<extra></extra>")


def _flows(links: pd.DataFrame, index: dict, mode: str, naming: Naming) -> go.Scatter:
    n = len(links)
    depth = links["depth"].to_numpy() if mode == FLAME else np.zeros(n, int)
    y0 = [index.get((int(i), "thread", int(t), int(d))) for i, t, d in
          zip(links["ipu"], links["tid"], depth)]
    y1 = [index[(int(i), "stream", int(s), 0)] for i, s in zip(links["ipu"], links["stream"])]
    x = np.full(3 * n, np.nan)
    y = np.full(3 * n, np.nan)
    x[0::3], x[1::3] = links["launch_start"].to_numpy(), links["start"].to_numpy()
    y[0::3], y[1::3] = np.array(y0, dtype=float) + 0.3, np.array(y1, dtype=float) - 0.3
    size = np.tile([0, 9, 0], n)
    lag = (links["start"] - links["launch_start"]).to_numpy()
    custom = np.empty((3 * n, 3), dtype=object)
    for j, col in enumerate([links["launch"].astype(str).to_numpy(),
                             links["kernel"].astype(str).str.slice(0, 80).to_numpy(), lag]):
        custom[0::3, j] = custom[1::3, j] = col
        custom[2::3, j] = ""
    return go.Scatter(
        name="launch → kernel", x=x, y=y, mode="lines+markers", customdata=custom,
        line={"color": FLOW, "width": 0.8},
        marker={"symbol": "arrow", "angleref": "previous", "size": size, "color": FLOW},
        hovertemplate=("<b>%{customdata[0]}</b> → %{customdata[1]}<br>ran "
                       f"%{{customdata[2]:,.0f}} {naming.unit} after its launch"
                       "<extra>flow</extra>"))


def counts_in_view(slices: int, device_events: int) -> str:
    """What the threads view draws, counted apart: host slices (ops, annotations, runtime
    calls; a CPU rank's ops are its compute) and the trace events on no host thread (GPU
    streams' kernels and copies, idle gaps, transfers). Not the statistics' count of trace
    events: there a CPU rank's ops and a rank's collectives are trace events too."""
    return (f"{slices:,} host slice{'s' if slices != 1 else ''} and {device_events:,} "
            f"stream, idle and transfer event{'s' if device_events != 1 else ''}")


def thread_lanes_figure(slices: pd.DataFrame, trace: pd.DataFrame, links: pd.DataFrame,
                        start: float | None = None, end: float | None = None,
                        mode: str = FLAME, naming: Naming | None = None,
                        max_events: int = MAX_EVENTS, max_flows: int = MAX_FLOWS,
                        pixels: int = PIXELS, min_px: float = MIN_PX,
                        title: str = "Execution trace",
                        kernels: pd.DataFrame | None = None,
                        ranks: Collection[int] | None = None,
                        highlight: Collection[Any] | None = None) -> go.Figure:
    """Threads, GPU idle and streams of [start, end) (everything by default). `links` is
    `analysis.trace_threads.launch_links`; `kernels` (the profile's table of that name)
    adds each kernel's launch to its hover; `ranks`: only theirs (a job of many);
    `highlight`: index labels of `slices` to outline (analysis.links.op_slices: the op a
    link points at). The x range is the whole run's either way, and so is a double-click's
    (reset_to_run). `layout.meta`: view (flame|flat), mode (events|merged),
    visible_events (visible_slices host slices + visible_device_events), drawn, range,
    flows_drawn, flows_hidden, rows, ranks (those drawn, or None: all), highlighted
    (slices outlined)."""
    naming = naming or MEASURED
    first_all, last_all = run_span(trace, slices)  # before any rank is left out
    if ranks is not None:
        keep = np.asarray(sorted(set(int(r) for r in ranks)), dtype=np.int64)
        slices = slices[np.isin(slices["ipu"].to_numpy(), keep)]
        trace = trace[np.isin(trace["ipu"].to_numpy(), keep)]
        links = links[np.isin(links["ipu"].to_numpy(), keep)]
    rows: list[Row] = thread_rows(slices, trace, mode)
    if not rows:
        return empty_figure("This profile has no host slices or GPU events.", title)
    side, gpu = side_events(trace), stream_events(trace)
    starts = [f["start"].min() for f in (slices, side, gpu) if len(f)]
    ends = [f["end"].max() for f in (slices, side, gpu) if len(f)]
    first, last = float(min(starts)), float(max(ends))
    if ranks is not None:  # the run's span, not the drawn ranks' own
        first, last = min(first, first_all), max(last, last_all)
    lo = first if start is None else max(float(start), first)
    hi = last if end is None else min(float(end), last)
    if hi <= lo:
        lo, hi = first, last
    index = {(r.ipu, r.lane, r.key, r.depth): k for k, r in enumerate(rows)}
    vs, vg, vside = visible(slices, lo, hi), visible(gpu, lo, hi), visible(side, lo, hi)
    n_slices, n_device = len(vs), len(vg) + len(vside)  # before merging short ones
    total = n_slices + n_device
    lit = vs[vs.index.isin(list(highlight))] if highlight is not None else vs.iloc[:0]
    data: list = []
    view = "events"
    if total > max_events:  # the wide slices one by one, the rest merged per pixel
        view = "merged"
        px = (hi - lo) / pixels
        wide = ((vs["end"] - vs["start"]).to_numpy() >= min_px * px)
        keep = np.flatnonzero(wide)
        if len(keep) > max_events:
            keep = keep[np.argsort(-(vs["end"] - vs["start"]).to_numpy()[keep],
                                   kind="stable")[:max_events]]
        short = np.ones(len(vs), dtype=bool)
        short[keep] = False
        srows = _slice_rows(vs, index, mode)
        merged = _merged(srows[short], vs["start"].to_numpy()[short],
                         vs["end"].to_numpy()[short], lo, hi, pixels)
        vs = vs.iloc[np.sort(keep)]
        data += [merged] if merged is not None else []
        # short kernels merged per category (forward blue, backward orange...), short
        # idle gaps merged in the idle lane: a zoomed-out run still shows where each ran
        gw = (vg["end"] - vg["start"]).to_numpy() >= min_px * px
        grows, codes = _stream_rows(vg, index), category_codes(vg)
        for k, cat in enumerate(CATEGORIES):
            m = ~gw & (codes == k)
            gm = _merged(grows[m], vg["start"].to_numpy()[m], vg["end"].to_numpy()[m], lo,
                         hi, pixels, f"short {CATEGORY_NAMES[cat]} (zoom in)",
                         CATEGORY_COLOURS[cat])
            data += [gm] if gm is not None else []
        vg = vg[gw].iloc[:max_events]
        sw = (vside["end"] - vside["start"]).to_numpy() >= min_px * px
        wrows = _row_numbers(index, vside["ipu"].to_numpy(), "waits",
                             np.full(len(vside), -1), np.zeros(len(vside), int))
        wm = _merged(wrows[~sw], vside["start"].to_numpy()[~sw], vside["end"].to_numpy()[~sw],
                     lo, hi, pixels, "short idle gaps and waits (zoom in)", "#bdbdbd")
        data += [wm] if wm is not None else []
        vside = vside[sw].iloc[:max_events]
    data = host_bars(vs, _slice_rows(vs, index, mode), naming) + data
    data += _side_bars(vside, index, naming, links, slices)
    data += _gpu_bars(vg, index, naming, kernels)
    shown, hidden = visible_links(links, lo, hi, max_flows)
    if hidden:  # a capped subset would crowd one end of the view: none until zoomed in
        shown, hidden = shown.iloc[:0], hidden + len(shown)
    if len(shown):
        data.append(_flows(shown, index, mode, naming))
    data += selected_bar(lit, _slice_rows(lit, index, mode), naming, lo, hi)
    drop_unfitting_labels(data, lo, hi)
    fig = go.Figure(data)
    labels = []
    for k, r in enumerate(rows):
        head = k == 0 or rows[k - 1].ipu != r.ipu
        labels.append(f"{naming.label(r.ipu)} · {r.label}" if head else r.label)
    drawn = len(vs) + len(vg) + len(vside)
    fig.update_layout(
        barmode="overlay", uirevision="trace-threads",
        uniformtext={"minsize": 8, "mode": "hide"},
        meta={"view": mode, "mode": view, "visible_events": int(total), "drawn": int(drawn),
              "visible_slices": n_slices, "visible_device_events": n_device,
              "range": [lo, hi], "flows_drawn": len(shown), "flows_hidden": int(hidden),
              "rows": labels, "ranks": None if ranks is None else [int(r) for r in keep],
              "highlighted": len(lit)})
    fig.update_xaxes(title_text=naming.time_title, range=[lo, hi], showgrid=True,
                     tickformat=",d")
    reset_to_run(fig, first, last)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(rows))), ticktext=labels,
                     range=[len(rows) - 0.5, -0.5], fixedrange=True, showgrid=False,
                     zeroline=False, tickfont={"size": 10}, automargin=True)
    # a line between ranks, a lighter one between lanes
    add_row_lines(fig, [(k - 0.5, "#999" if rows[k].ipu != rows[k - 1].ipu else "#ddd")
                        for k in range(1, len(rows))
                        if rows[k].ipu != rows[k - 1].ipu or rows[k].lane != rows[k - 1].lane
                        or rows[k].key != rows[k - 1].key])
    counted = counts_in_view(n_slices, n_device)
    detail = counted if view == "events" else f"{counted}, short ones merged per pixel"

    base_layout(fig, f"{title} ({mode}) · {detail}", height=150 + ROW_PX * len(rows))
    fig.update_layout(margin={"l": 150, "r": 20, "t": 90, "b": 40},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0,
                              "xanchor": "left", "font": {"size": 10}},
                      # the title at the top, whatever the height (0.98 of a tall figure
                      # falls under the legend)
                      title={"y": 1.0, "yanchor": "top", "pad": {"t": 10}})
    return fig
