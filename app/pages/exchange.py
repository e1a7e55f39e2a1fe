"""`/exchange`: bytes between IPUs (ranks when measured) and the host as a matrix and over time."""

from __future__ import annotations

from typing import Any

import dash
import pandas as pd
from dash import html

from popviz import analysis, figures
from popviz.analysis.exchange import stage_links, trace_traffic
from popviz.units import fmt_bytes

from ..cache import Entry
from ..common import AppContext, downloads, graph, message, naming, table, title_of

PATH = "/exchange"
TITLE = "Exchange"
NEEDS_PROFILE = True


def matrix(ctx: AppContext, entry: Entry) -> Any:
    num = ((entry.profile.meta or {}).get("target") or {}).get("num_ipus")
    return figures.exchange_matrix_figure(analysis.exchange_matrix(entry.profile.exchange,
                                                                   num), naming=naming(entry))


def over_time(ctx: AppContext, entry: Entry) -> Any:
    return figures.exchange_time_figure(analysis.exchange_over_time(entry.profile.exchange),
                                        naming=naming(entry))


def links(entry: Entry) -> Any:
    """Per stage boundary of a measured or imported job (empty for a modelled one)."""
    profile = entry.profile
    return entry.get("stage_links", lambda: stage_links(
        profile.table("p2p") if "p2p" in profile.table_names else pd.DataFrame(),
        profile.exchange))


def between_stages(ctx: AppContext, entry: Entry) -> Any:
    return figures.stage_links_figure(links(entry))


FIGURES = {"exchange_matrix": matrix, "exchange_time": over_time,
           "exchange_stages": between_stages}


def with_size(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with a readable `size` column before its `bytes` (which sorts)."""
    frame = frame.copy()
    frame.insert(list(frame.columns).index("bytes"), "size",
                 [fmt_bytes(b) for b in frame["bytes"]])
    return frame


def _links_table(entry: Entry) -> Any:
    """The stage boundaries in words: times in the profile's unit, bytes readable too."""
    frame = links(entry).rename(columns={
        "transfer_ns": "on the wire ns", "receiver_wait_ns": "receiver waited ns",
        "sender_wait_ns": "sender waited ns"})
    return with_size(frame)


def _by_kind(entry: Entry) -> Any:
    """Bytes per kind in readable units beside the raw count (which sorts)."""
    frame = analysis.exchange_by_kind(entry.profile.exchange).rename(
        columns={"time": naming(entry).unit})
    return with_size(frame) if "bytes" in frame else frame


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    if entry.profile.exchange.empty:
        words = naming(entry)
        traffic = trace_traffic(entry.profile.trace)
        if traffic.empty:
            return html.Div([html.H2(title_of(entry)), message(
                f"No exchange between {words.devices} or with the host in this profile.",
                "info")])
        # the trace's exchange time is real even without transfers: say what it is
        traffic = with_size(traffic.rename(columns={"time": words.unit}))
        return html.Div([html.H2(title_of(entry)), message(
            f"No transfers between {words.devices} or with the host are recorded in this "
            "profile; the exchange time on the trace is the events below (on a GPU: its "
            "own memsets and device copies).", "info"),
            html.H3("Exchange events in the trace"),
            table("exchange-trace", traffic, words=words)])
    staged = not links(entry).empty  # a measured or imported job's p2p calls
    return html.Div([
        html.H2(title_of(entry)),
        html.Div([graph("exchange-matrix", matrix(ctx, entry)),
                  graph("exchange-time", over_time(ctx, entry))], className="row two"),
        *([html.H3("Between stages"), html.P(
            "What crosses each stage boundary (an interleaved schedule's stages, not only "
            "its ranks): transfers, bytes, time on the wire and how long each side waited "
            "for the other to post; a stage's collectives on the diagonal. Totals of the "
            "whole recording, per message: a rank waiting on a send and a recv at once "
            "counts both waits, so they add up to more than its idle on Stages (each "
            "instant once, per step), and a message's time on the wire is counted once "
            "where Trace and Stages count it on both ranks.",
            className="hint"),
           html.Div([graph("exchange-stages", between_stages(ctx, entry)),
                     html.Div(table("exchange-stage-links", _links_table(entry),
                                    words=naming(entry)), className="half")],
                    className="row two")] if staged else []),
        html.H3("By kind"),
        table("exchange-kinds", _by_kind(entry), words=naming(entry)),
        downloads(entry.rel, ["exchange"],
                  [f for f in FIGURES if staged or f != "exchange_stages"], words=naming(entry)),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    """No callbacks: the page is rebuilt on each visit."""
    return {}
