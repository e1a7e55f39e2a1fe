"""`/stages`: compute / exchange / idle per IPU, load per stage, stash and AMP."""

from __future__ import annotations

from typing import Any

import dash
import pandas as pd
from dash import html

from popviz import analysis, figures
from popviz.analysis.balance import is_sharded
from popviz.analysis.ranks import TOLERANCE, rank_shares, stragglers
from popviz.analysis.stash import stash_column
from popviz.figures.ranks import PART_TITLES, rank_heatmap
from popviz.figures.stages import amp_note

from ..cache import Entry
from ..common import AppContext, downloads, graph, message, naming, table, title_of

# shown when asked for (Toggle Columns): per-micro-batch splits and bookkeeping; the
# per-step columns and the split points (first and last layer) stay in view
DETAIL = ("num_ops", "sync_cycles", "forward_cycles_per_microbatch",
          "recompute_cycles_per_microbatch", "backward_cycles_per_microbatch", "stash_bytes",
          "stash_depth", "stash_bytes_per_microbatch", "boundary_bytes", "amp_ignored_ops")

PATH = "/stages"
TITLE = "Stages"
NEEDS_PROFILE = True


def timed_stages(entry: Entry) -> Any:
    """The stages table timed from the trace, once per open profile: a sweep over every
    rank's events (0.2 s a time at 1,024 ranks), which the page's two charts and its table
    each asked for."""
    return entry.get("profile_stages", lambda: analysis.profile_stages(entry.profile))


def ipu_time(ctx: AppContext, entry: Entry) -> Any:
    return figures.ipu_time_figure(timed_stages(entry), naming=naming(entry),
                                   sharded=is_sharded(entry.profile.meta))


def load(ctx: AppContext, entry: Entry) -> Any:
    return figures.stage_load_figure(timed_stages(entry), naming=naming(entry),
                                     sharded=is_sharded(entry.profile.meta))


def stash(ctx: AppContext, entry: Entry) -> Any:
    return figures.stash_figure(entry.profile.stages, naming=naming(entry))


def amp(ctx: AppContext, entry: Entry) -> Any:
    return figures.amp_figure(entry.profile.stages, entry.profile.meta or {},
                              naming=naming(entry))


FIGURES = {"ipu_time": ipu_time, "stage_load": load, "stash": stash, "amp": amp}


def _ranks_section(ctx: AppContext, entry: Entry) -> list[Any]:
    """A measured job of several ranks: each rank's share of the step, the stragglers."""
    words = naming(entry)
    if not words.measured or entry.profile.trace["ipu"].nunique() < 2:
        return []
    shares = rank_shares(entry.profile.trace, entry.profile.stages)
    late = stragglers(shares)
    alone = shares.groupby("stage")["busy"].size().max() < 2
    said = ("One rank per stage: no rank has peers to be late against (the stage load "
            "above compares the stages)." if alone else
            "No straggler: every rank is busy within "
            f"{TOLERANCE:.0%} of its stage's median." if late.empty else
            "Stragglers (the others wait for them): " + "; ".join(
                f"{words.label(r['ipu'])} +{float(r['over']):.0%} busy, mostly "
                f"{PART_TITLES[str(r['cause'])]}" for r in late.head(10).to_dict("records")))
    return [html.H3(f"{words.devices.capitalize()} side by side"),
            html.P(said, id="stages-stragglers", className="hint"),
            graph("stages-ranks", rank_heatmap(shares, late, words))]


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    # no callbacks: the page is a function of the profile, built once per open profile (a
    # 1,024-rank job's took the server 1.1 s on every visit)
    return entry.get("stages-page", lambda: _page(ctx, entry))


def _page(ctx: AppContext, entry: Entry) -> html.Div:
    stages = timed_stages(entry)
    if stages.empty:
        return html.Div([html.H2(title_of(entry)),
                         message("This profile has no stage table.", "info")])
    bal = analysis.stage_balance(stages)
    shown = bal.drop(columns=[c for c in ("total_cycles",) if c in bal.columns])
    if is_sharded(entry.profile.meta) and "bubble_fraction" in shown.columns:  # no pipeline
        shown = shown.rename(columns={"bubble_fraction": "idle_fraction"})
    if {"untraced_cycles", "other_cycles"} <= set(shown.columns):  # beside the rest of the step
        untraced = shown.pop("untraced_cycles")
        shown.insert(list(shown.columns).index("other_cycles") + 1, "untraced_cycles", untraced)
    words = naming(entry)
    if words.measured:  # means over the recorded steps: whole ns (7,061,044.5 read odd)
        times = [c for c in shown.columns if "_cycles" in str(c)
                 and pd.api.types.is_float_dtype(shown[c])]
        shown = shown.assign(**{c: shown[c].round().astype("int64") for c in times})
    if "stash_bytes" in shown.columns:  # in words, as /liveness and /compare say it
        measured = words.measured
        shown.insert(list(shown.columns).index("stash_bytes"), "stash",
                     stash_column(shown, measured=measured))
        if measured:  # no stash in a run's traces: no zeros that read as none
            shown = shown.drop(columns=[c for c in ("stash_bytes", "stash_depth")
                                        if c in shown.columns])
    # AMP is an IPU compiler option: a chart of an IPU plan's; a GPU plan says it has none
    # (it is a plan, IPU plans sit beside it in /compare and /tune); a measured CPU or GPU
    # run has no compiler options at all, so nothing is said of them there
    amp_box = ([] if words.measured else
               [graph("stages-amp", amp(ctx, entry))] if words.has_amp else
               [html.Div(message(amp_note(words), "info"), id="stages-amp-note",
                         className="half")])
    return html.Div([
        html.H2(title_of(entry)),
        html.Div([graph("stages-time", ipu_time(ctx, entry)),
                  graph("stages-load", load(ctx, entry))], className="row two"),
        html.Div([graph("stages-stash", stash(ctx, entry)), *amp_box],
                 className="row two"),
        html.H3("Stages" + (" (times: modelled ns per step)" if words.gpu_plan else
                            " (times: ns per recorded step, mean)" if words.measured else "")),
        table("stages-table", shown, words=words, hidden=DETAIL),
        *_ranks_section(ctx, entry),
        downloads(entry.rel, ["stages"],
                  [v for v in FIGURES if words.has_amp or v != "amp"], words=naming(entry)),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    """No callbacks: the page is built once per open profile (`layout`)."""
    return {}
