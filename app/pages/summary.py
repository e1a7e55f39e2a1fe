"""`/summary`: does it fit, the fullest tiles, speed, the bottleneck, and advice."""

from __future__ import annotations

import re
from typing import Any

import dash
import pandas as pd
from dash import html

from popviz import figures
from popviz.analysis.facts import profile_warnings
from popviz.analysis.insights import idle_title
from popviz.figures.style import fmt_bytes, pretty
from popviz.vocab import IMBALANCE_LIMIT, TILE_AMBER, Naming

from ..cache import Entry
from ..common import AppContext, downloads, graph, insights, naming, table, title_of

PATH = "/summary"
TITLE = "Summary"
NEEDS_PROFILE = True


def _card(label: str, value: str, tone: str = "") -> html.Div:
    return html.Div([html.Div(label, className="card-label"),
                     html.Div(value, className="card-value")], className=f"card {tone}")


def _cards(info: dict[str, Any], words: Naming) -> html.Div:
    clock_unit = words.unit
    fit = info["fit"]
    if fit.get("basis") == "device":  # an imported GPU: its peak against its memory
        several = len(fit["devices"]) > 1  # then each figure says whose it is
        fit_card = _card("memory", ("fits · " if fit["fits"] else "OVER DEVICE MEMORY · ")
                         + "; ".join((f"{words.label(d['ipu'])} " if several else "")
                                     + f"peak {fmt_bytes(d['peak_bytes'])} of "
                                     f"{fmt_bytes(d['capacity_bytes'])} "
                                     f"({d['utilisation']:.0%})" for d in fit["devices"]),
                         "good" if fit["fits"] else "bad")
    elif not fit.get("known", True) and not words.has_tiles:  # a CPU run: no device memory
        fit_card = _card("memory", "unknown (a measured run records no per-tile memory)", "")
    elif not fit.get("known", True):
        verdict = {None: "unknown", True: "fits", False: "OUT OF MEMORY"}[fit["fits"]]
        fit_card = _card("memory", f"{verdict} (no per-tile data)", "")
    elif fit["fits"]:
        # amber from TILE_AMBER: a nearly-full tile fits but leaves nothing to spare
        tight = float(fit.get("max_utilisation") or 0) >= TILE_AMBER
        fit_card = _card("memory", f"fits · fullest tile {fit['max_utilisation']:.0%}"
                         + (" · little headroom" if tight else ""), "warn" if tight else "good")
    else:
        by_ipu = ", ".join(f"{words.label(k)}: {v}" for k, v in sorted(fit["oom_by_ipu"].items()))
        fit_card = _card("memory", f"OUT OF MEMORY · {fit['oom_tiles']} tiles ({by_ipu})",
                         "bad")
    cards = [fit_card]
    if info["throughput"] is not None:
        cards.append(_card("throughput", f"{float(info['throughput']):,.1f} samples/s"))
    if info["latency_ms"] is not None:
        cards.append(_card("latency", f"{float(info['latency_ms']):,.3f} ms"))
    if info["step_cycles"] is not None:
        step = f"{float(info['step_cycles']):,.0f} {clock_unit}"
        if info["step_ms"]:
            step += f" ({float(info['step_ms']):,.3f} ms)"
        cards.append(_card("step", step))
    b = info["bottleneck"]
    if int(info.get("num_ipus") or 0) < 2:  # one device: no pipeline to balance or fill
        return html.Div(cards, className="cards")
    sharded = bool(info.get("sharded"))  # shards take turns: none waits on it
    if b:
        cards.append(_card("heaviest shard" if sharded else "bottleneck",
                           f"stage {b['stage']} on {words.label(b['ipu'])} · "
                           f"{b['relative_load']:.2f}x mean",
                           "warn" if info["imbalance"] > IMBALANCE_LIMIT and not sharded
                           else ""))
    cards.append(_card(idle_title(sharded), f"{info['bubble_fraction']:.0%} idle"))
    return html.Div(cards, className="cards")


FLAG = re.compile(r"(--[a-z][a-z0-9-]*)")  # a command-line flag in an advice's text


def flags_whole(text: str) -> str | list[Any]:
    """`text` with each command-line flag in a no-wrap `flag` element (a line broken after
    the first '-' of '--strategy' reads as a lone '-' and another flag)."""
    parts = FLAG.split(text)
    if len(parts) == 1:
        return text
    return [html.Code(p, className="flag") if k % 2 else p for k, p in enumerate(parts) if p]


def _advice(info: dict[str, Any]) -> html.Ul:
    return html.Ul([html.Li(flags_whole(a.text), className=f"advice {a.severity}")
                    for a in info["advice"]], id="advice")


def histogram(ctx: AppContext, entry: Entry) -> Any:
    return figures.memory_histogram(entry.profile.tile_memory)


def totals(ctx: AppContext, entry: Entry) -> Any:
    return figures.ipu_totals_figure(insights(entry)["ipu_totals"])


FIGURES = {"histogram": histogram, "ipu_totals": totals}


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    info = insights(entry)
    fullest = info["fullest_tiles"]
    if len(fullest):
        fullest = pd.DataFrame({
            "ipu": fullest["ipu"], "tile": fullest["tile"],
            "used": [fmt_bytes(x) for x in fullest["total_bytes"]],
            "capacity": [fmt_bytes(x) for x in fullest["capacity_bytes"]],
            "utilisation": [f"{u:.1%}" for u in fullest["utilisation"]],
            "largest category": fullest["largest_category"].map(pretty),
        })
    peaks = info["peaks"]
    if len(peaks):
        peaks = pd.DataFrame({
            "ipu": peaks["ipu"], "peak step": peaks["peak_step"],
            # one unit a column, as numbers: per value (827.0 KiB under 17.1 MiB) they
            # read as one unit and sorted as text
            "peak MiB": (peaks["peak_bytes"] / 2**20).round(1),
            "always-live MiB": (peaks["always_live_bytes"] / 2**20).round(1),
            "not-always-live MiB": (peaks["not_always_live_bytes"] / 2**20).round(1),
            "phase": peaks["phase"], "at": peaks["label"],
        })
        if not peaks["at"].astype(str).str.strip().any():  # a measured run names no op
            peaks = peaks.drop(columns="at")
    words = naming(entry)
    warnings = profile_warnings(entry.profile.meta or {})
    return html.Div([
        html.H2(title_of(entry)),
        _cards(info, words),
        html.Div([html.H3("Warnings"), html.Ul(
            [html.Li(w, className="advice warning") for w in warnings], id="warnings")])
        if warnings else html.Div(),
        html.H3("Advice"), _advice(info),
        # no empty placeholder for the fullest tiles (a measured run has none): in the
        # flex row it took the row's 14 px gap, pushing the peaks right of every other block
        html.Div([
            *([html.Div([html.H3("Five fullest tiles"),
                         table("fullest-tiles", fullest)], className="half")]
              if len(fullest) else []),
            html.Div([html.H3(f"Peak liveness per {words.device}"),
                      table("peak-liveness", peaks, words=words) if len(peaks)
                      else html.P("No liveness in this profile.")], className="half"),
        ], className="row"),
        html.Div([graph("summary-histogram", histogram(ctx, entry)),
                  graph("summary-totals", totals(ctx, entry))], className="row two")
        if len(entry.profile.tile_memory) else html.Div(),
        downloads(entry.rel, ["stages", "tile_memory", "oom"], list(FIGURES),
                  words=naming(entry))
        if len(entry.profile.tile_memory) else downloads(entry.rel, ["stages"], [],
                                                         words=naming(entry)),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    """The summary has no callbacks: it is rebuilt on each visit."""
    return {}
