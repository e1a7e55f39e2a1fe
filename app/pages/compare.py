"""`/compare?profile=A&other=B`: which of two layouts is better, why, and by how much.

Wiring only: popviz.compare computes, popviz.figures.compare draws. The two profiles come
from the URL (shareable); the dropdowns rewrite the URL, which re-renders the page."""

from __future__ import annotations

from typing import Any

import dash
import pandas as pd
from dash import Input, Output, dcc, html
from dash.exceptions import MissingCallbackContextException

from popviz.analysis.compare import Comparison, format_ratio, format_value
from popviz.analysis.compare.terms import lead_of
from popviz.analysis.compare.verdict import JUDGES
from popviz.errors import ProfileError
from popviz.figures import compare as cf
from popviz.format.reader import profile_file
from popviz.units import count_of
from popviz.vocab import BUBBLE_LIMIT, naming_of

from ..cache import LISTING_MAX_AGE_S, VIRTUAL_PREFIX, Entry, PathRefused, resolve_profile
from ..common import AppContext, graph, message, table
from . import compare_ops as ops_part
from .compare_pair import asked_judge, comparison, judge_of, pair_of, pair_query

PATH = "/compare"
TITLE = "Compare"
NEEDS_PROFILE = False  # it takes two: ?profile=A&other=B
FIGURES: dict[str, Any] = {}  # HTML downloads are per profile; PNG is in each modebar


def _card(label: str, value: str, tone: str = "") -> html.Div:
    return html.Div([html.Div(label, className="card-label"),
                     html.Div(value, className="card-value")], className=f"card {tone}")



def _cards(comp: Comparison, side: str) -> html.Div:
    s = comp.sides.set_index("side").loc[side]
    m = comp.metrics.set_index("metric")[side.lower()]
    win = comp.verdict.get("winner") == side
    dev = naming_of(s.to_dict()).device  # the side's words: IPU, GPU or rank

    def val(name: str, unit: str) -> str:
        return format_value(m.get(name), unit)
    fit = ("unknown (no per-tile data)", "") if s["fits"] is None or s["fits"] != s["fits"] \
        else ("fits", "good") if s["fits"] else (
        f"OUT OF MEMORY · {s['oom_tiles']} tiles ({s['oom_ipus']})", "bad")
    if s.get("capacity_name") == "device memory" and fit[1]:  # an imported GPU
        fit = ("fits its device memory", "good") if s["fits"] else \
            ("OVER DEVICE MEMORY", "bad")
    cards = [
        _card("layout", f"{count_of(s['num_ipus'], dev)} x {count_of(s['replicas'], 'replica')} · "
              f"{s['target']} · {s['kind']}"),
        _card("memory", fit[0], fit[1]),
        _card(f"throughput per {dev}", val("throughput_per_ipu", "") + " samples/s",
              "good" if win else ""),
        _card(f"{dev} time per sample", val("ipu_us_per_sample", "") + f" {dev}-µs"),
        _card("throughput", val("throughput", "")
              + f" samples/s on {count_of(s['total_ipus'], dev)}"),
        _card("step", val("step_ms", "ms") + " ms"),
        _card("idle", val("idle_fraction", "fraction"),
              "warn" if (m.get("idle_fraction") or 0) > BUBBLE_LIMIT else ""),
        _card(f"peak memory (fullest {dev})", val("peak_bytes_max", "bytes")),
    ]
    title = f"{side}: {s['name']}" + ("  ✓ better" if win else "")
    # a run that names no split (an imported pipeline's stages come from its annotations)
    # says so, as the layout differences below do
    splits = str(s["splits"] or "").strip() or "unknown"
    return html.Div([html.H3(title), html.Div(
        f"{s['model']} · splits {splits} · "
        + ("" if dev == "rank" else f"AMP {s['amp']} · ") + "recomputation "
        f"{'on' if s['recomputation'] else 'off'}", className="hint"),
        html.Div(cards, className="cards")], className="half", id=f"compare-side-{side}")


def _verdict(comp: Comparison) -> html.Div:
    v = comp.verdict
    tone = "good" if v.get("winner") else "warn"
    items = [html.Li(r) for r in v["reasons"]]
    if v["differences"]:
        items.append(html.Li("Layout differences (A vs B): " + "; ".join(v["differences"])))
    terms = v.get("terms") or []
    banner = [html.Div("Not like for like: " + "; ".join(terms) + ". Compare the per-sample "
                       "figures; totals and step times measure different work.",
                       className="message info", id="compare-terms")] if terms else []
    # the banner lists the terms: the headline does not say them again
    headline = v["headline"].removeprefix(lead_of(terms)).lstrip() if terms else v["headline"]
    ask = " Pick one with 'Judge by' above." if v.get("questions_differ") else ""
    return html.Div([*banner, html.Div(headline + ask, className="card-value"),
                     html.Ul(items, className="hint")],
                    className=f"card {tone}", id="compare-verdict")


def _delta_table(id_: str, frame: pd.DataFrame, keys: list[str]) -> Any:
    if frame.empty:
        return html.P("Nothing to compare here.", className="hint")
    out = frame[keys].copy()
    # a size is written with its own unit (510.5 MiB): the column saying "bytes" misread
    out["unit"] = frame["unit"].replace({"bytes": ""})
    for col, name in (("a", "A"), ("b", "B"), ("delta", "B - A")):
        out[name] = [format_value(v, u) for v, u in zip(frame[col], frame["unit"], strict=True)]
    out["B / A"] = [format_ratio(r) for r in frame["ratio"]]
    return table(id_, out.astype(str), page_size=20)


def _metrics_in_words(comp: Comparison) -> pd.DataFrame:
    """The metrics as the two sides' words name them: per rank or GPU where neither side
    is an IPU ('throughput_per_ipu' of two ranks: 'throughput per rank'), no tile counts
    where neither side has tiles. The JSON keeps the contract's names."""
    words = [naming_of(s) for s in comp.sides.to_dict("records")]
    devices = {w.device for w in words}
    dev = devices.pop() if len(devices) == 1 else "device"
    frame = comp.metrics
    if not any(w.has_tiles for w in words):
        frame = frame[~frame["metric"].isin(["oom_tiles", "fullest_tile_utilisation"])]
    name = frame["metric"].astype(str).str.replace(r"(^|_)ipus(_|$)", rf"\1{dev}s\2",
                                                     regex=True)
    name = name.str.replace(r"(^|_)ipu(_|$)", rf"\1{dev}\2", regex=True)
    return frame.assign(metric=name.str.replace("_", " "))


def _device_word(dev: str) -> str:
    """The per-device table's key column: 'ipu' (the contract's) for IPUs, else 'rank',
    'gpu' or 'device' ('IPU / rank' where the sides differ)."""
    return "ipu" if dev == "IPU" else "device" if "/" in dev else dev.lower()


def _delta_tabs(comp: Comparison, tps: pd.DataFrame, dev: str) -> dcc.Tabs:
    """The delta tables, one tab each: the browser draws only the open tab's table (each
    sortable table costs a new tab about 70 ms to draw, and five of them were a third of
    the page's load)."""
    tabs = [("metrics", "Metrics", _delta_table("compare-metrics", _metrics_in_words(comp),
                                                ["metric"])),
            ("time", f"{dev} time per sample by category",
             _delta_table("compare-time-table", tps[(tps["a"] != 0) | (tps["b"] != 0)],
                          ["category"])),
            ("ipus", f"Per {dev}", _delta_table(
                "compare-ipus", comp.ipus.rename(columns={"ipu": _device_word(dev)}),
                [_device_word(dev), "metric"])),
            ("ops", "Compute per sample by op class",
             _delta_table("compare-ops", comp.op_classes, ["op_class", "phase"])),
            ("stages", "Per stage",
             _delta_table("compare-stages", comp.stages, ["stage", "metric"]))]
    return dcc.Tabs([dcc.Tab(content, label=label, value=value, id=f"compare-tab-{value}")
                     for value, label, content in tabs],
                    value="metrics", id="compare-delta-tabs")


# short enough to show whole once chosen (the box is 330 px); what each asks is its title
JUDGE_OPTIONS = [{"label": "both questions", "value": "both",
                  "title": "a winner only when both questions have the same answer"},
                 {"label": "total throughput", "value": "total",
                  "title": "the same work in less time: the job's samples/s"},
                 {"label": "throughput per device", "value": "per-device",
                  "title": "the same devices doing more: samples/s per IPU, GPU or rank"}]


def _as_listed(ctx: AppContext, name: str, listed: set[str]) -> str:
    """`name` as the listing names the same file (a folder: its profile.h5), else as
    given."""
    if not name or name in listed or name.startswith(VIRTUAL_PREFIX):
        return name
    try:
        path = profile_file(resolve_profile(ctx.cache.root, name))
        rel = path.relative_to(ctx.cache.root.resolve()).as_posix()
    except (PathRefused, ProfileError, OSError, ValueError):
        return name
    return rel if rel in listed else name


def _pickers(ctx: AppContext, a: str, b: str, judge: str | None = None) -> html.Div:
    # the names only: a file still being vetted is listed (picking a broken one shows its
    # error below), so a cold page waits for the vetting of its own two files, not all
    rows = ctx.cache.listing(wait_s=0.0, max_age_s=LISTING_MAX_AGE_S)
    opts = [{"label": f"{r['profile']} (being checked)" if r.get("checking") else r["profile"],
             "value": r["profile"]} for r in rows if not r.get("error")]
    opts += [{"label": n, "value": n} for n in (a, b)
             if n and n.startswith(VIRTUAL_PREFIX)]  # tune plans
    # a name the folder does not serve (a link from elsewhere) stays picked, marked: the
    # dropdown would clear a value it has no option for, and the page then asked to
    # "pick two profiles" instead of saying that one is not there
    listed = {o["value"] for o in opts}
    # a folder's name (`?profile=rn50_pipeline`, which every page takes) is its listed
    # profile.h5: picked as listed, not marked "(not served)"
    a, b = (_as_listed(ctx, n, listed) for n in (a, b))
    opts += [{"label": f"{n} (not served)", "value": n} for n in dict.fromkeys((a, b))
             if n and n not in listed]
    return html.Div([
        html.Span("A", className="label"),
        dcc.Dropdown(id="compare-a", options=opts, value=a or None, clearable=False,
                     placeholder="first profile", style={"width": 380}),
        html.Span("B", className="label"),
        dcc.Dropdown(id="compare-b", options=opts, value=b or None, clearable=False,
                     placeholder="second profile", style={"width": 380}),
        html.Span("Judge by", className="label",
                  title="total throughput: the same work in less time; throughput per "
                  "device: the same devices doing more"),
        dcc.Dropdown(id="compare-judge", options=JUDGE_OPTIONS, value=judge or "both",
                     clearable=False, style={"width": 330}),
    ], className="row", style={"alignItems": "center"})


def body(ctx: AppContext, a: str, b: str, judge: str | None = None) -> list[Any]:
    """The comparison of two served profiles, its verdict answering `judge` (None: both
    questions), or a message saying what is missing."""
    if not (a and b):
        return [message("Pick two profiles to compare (A and B above).", "info")]
    try:
        ea, eb = ctx.cache.get(a), ctx.cache.get(b)
        comp = comparison(ea, eb, judge)
    except (PathRefused, ProfileError, ValueError) as exc:
        return [message(str(exc))]
    # built once per pair and question, kept with A's entry as the comparison is: a new
    # tab on the same pair then costs the server only the JSON (0.22 s -> 0.03 s)
    return list(ea.get(("compare-body", eb.rel, eb.stamp or id(eb), judge),
                       lambda: _drawn(ea, eb, comp)))


def _drawn(ea: Entry, eb: Entry, comp: Comparison) -> list[Any]:
    tps = comp.time_per_sample
    dev = " / ".join(dict.fromkeys(naming_of(s).device
                                   for s in comp.sides.to_dict("records")))
    return [
        _verdict(comp),
        html.Div([_cards(comp, "A"), _cards(comp, "B")], className="row"),
        graph("compare-time", cf.time_per_sample_figure(comp)),
        graph("compare-liveness", cf.liveness_compare_figure(comp)),
        html.Div([graph("compare-ipu-time", cf.ipu_time_compare_figure(comp)),
                  graph("compare-ipu-memory", cf.ipu_memory_compare_figure(comp))],
                 className="row two"),
        graph("compare-tiles", cf.tile_distribution_figure(comp)),
        html.H3("A vs B (every delta is B - A)"),
        _delta_tabs(comp, tps, dev),
        *ops_part.section(ea, eb, comp),
    ]


def page(ctx: AppContext, search: str | None) -> html.Div:
    a, b = pair_of(search)
    judge = judge_of(search)
    asked = asked_judge(search)
    unknown = [] if not asked or asked == judge else [message(
        f"judge={asked!r} is not a question this page asks (total or per-device): both "
        "are answered.", "info")]
    return html.Div([html.H2("Compare two layouts"), _pickers(ctx, a, b, judge),
                     html.Div([*unknown, *body(ctx, a, b, judge)], id="compare-body")])


def layout(ctx: AppContext, entry: Entry | None = None) -> html.Div:
    # The router passes no URL to pages without a profile; this one reads the pair from
    # the routing callback's own inputs.
    try:
        search = dash.callback_context.inputs.get("url.search") or ""
    except MissingCallbackContextException:  # called directly, e.g. from a test
        search = ""
    return page(ctx, search)


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("url", "search"),
                  Input("compare-a", "value"), Input("compare-b", "value"),
                  Input("compare-judge", "value"), prevent_initial_call=True)
    def choose(a: str | None, b: str | None, judge: str | None) -> str:
        return pair_query(a or "", b or "", judge if judge in JUDGES else None)

    return ops_part.register(app, ctx)  # the op-by-op table and the liveness overlay
