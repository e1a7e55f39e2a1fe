"""The /trace page's search box: type an op, a kernel or a module (`pass:B`, `mb:2` narrow
it) and the matches are listed, each a link that opens the trace centred on it, the op
outlined (popviz.analysis.find, popviz.analysis.links). Wiring only."""

from __future__ import annotations

import dataclasses
from typing import Any

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html

from popviz.analysis.find import (
    LIMIT,
    find_kernels,
    find_ops,
    known_microbatches,
    microbatch_note,
    op_microbatches,
    parse_query,
)
from popviz.analysis.links import kernel_ops, kernel_window
from popviz.figures.trace_kernels import kernel_labels

from . import links
from .cache import Entry
from .common import AppContext, naming, profile_of
from .trace_stats import op_place, run_window

HINT = "an op, kernel or module; pass:B, mb:2 narrow it"


def section() -> html.Div:
    return html.Div([
        html.Span("Find: ", className="label"),
        dcc.Input(id="trace-find", type="search", debounce=True, placeholder=HINT,
                  style={"width": "28em"}),
        html.Div(id="trace-found", className="found")], className="controls")


def found_list(entry: Entry, typed: str | None) -> list[Any]:
    """The matches of what was typed as links to the trace, with how many there are; one
    line instead where `mb:N` cannot narrow them (no such micro-batch, or the profile
    cannot tell an op's)."""
    query = parse_query(typed)
    if query.empty:
        return []
    words = naming(entry)
    ops, trace = entry.profile.ops, entry.profile.trace
    timed = {"start", "end"} <= set(ops.columns)
    # each measured op's micro-batch: one sweep of the trace per profile, not per query
    mbs = entry.get("op_microbatches", lambda: op_microbatches(ops, trace)) \
        if query.microbatch is not None and timed else None
    known = known_microbatches(ops, trace, mbs) if query.microbatch is not None else None
    note = microbatch_note(ops, trace, query, mbs, known)
    before: list[Any] = []
    if note and known is not None and len(known):  # N is not one of the run's
        return [html.Span(note, className="hint")]
    if note:  # no micro-batches at all: the rest of what was typed still has an answer
        before = [html.Span(f"{note} Found without mb:{query.microbatch}:", className="hint"),
                  html.Br()]
        query, mbs = dataclasses.replace(query, microbatch=None), None
    items: list[Any] = []
    found, total = find_ops(ops, query, trace=trace, microbatches=mbs)
    run = run_window(entry)
    for row in found.to_dict("records"):
        # a modelled op asked for in micro-batch N: in N's run of its pass
        at = op_place(entry, int(row["op_id"]), None if timed else query.microbatch)
        if at is None:
            continue
        ipu, span, (t0, t1) = at
        where = f"{words.label(ipu)}, {row.get('pass', '') or ''}".rstrip(", ")
        if query.microbatch is not None:
            where += f", mb {query.microbatch}"
        module = str(row.get("module", "") or "")
        items.append(html.Li(links.link(
            f"{row['op']} {('· ' + module) if module else ''} ({where}, {span[0]:,.0f} "
            f"{words.unit})", links.href("/trace", entry.rel, t0, t1, ipu,
                                         op=str(int(row["op_id"]))),
            f"trace-found-op-{int(row['op_id'])}")))
    kernels, many = find_kernels(trace, query)
    # the op that launched each kernel, outlined, its launch in view when near the kernel
    launched = kernel_ops(kernels, ops, entry.profile.table("host_slices")) \
        if len(kernels) else []
    for i, (row, by) in enumerate(zip(kernels.to_dict("records"), launched, strict=True)):
        a, b = float(row["start"]), float(row["end"])
        op = {} if by is None else {"op": str(by[0])}
        t0, t1 = kernel_window((a, b), None if by is None else by[1], trace, run=run)
        # a template kernel's name runs to 1,200 characters: its function, the whole name
        # on hover
        name = str(row["op"])
        items.append(html.Li(links.link(
            f"kernel {kernel_labels(pd.Series([name]))[0]} (of {row['host_op']}; "
            f"{words.label(int(row['ipu']))}, {a:,.0f} {words.unit})",
            links.href("/trace", entry.rel, t0, t1, int(row["ipu"]), **op),
            f"trace-found-kernel-{i}"), title=name))
    shown = len(found) + len(kernels)
    if not shown:
        return [*before, html.Span(f"Nothing matches {str(typed)[:200]!r}.", className="hint")]
    counted = f"{total:,} op(s)" + (f" and {many:,} kernel(s)" if many else "")
    head = f"{counted} match; the first {shown} listed:" if total + many > shown \
        else f"{counted} match:"
    # a kernel's name can be one 200-character word: it wraps, not widen the page
    return [*before, html.Span(head, className="label"),
            html.Ul(items, style={"overflowWrap": "anywhere", "maxWidth": "100%"})]


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("trace-found", "children"), Input("trace-find", "value"),
                  State("url", "search"), prevent_initial_call=True)
    def find(typed: str | None, search: str) -> list[Any]:
        return found_list(ctx.cache.get(profile_of(search)), typed)

    return {"find": find}


__all__ = ["HINT", "LIMIT", "found_list", "register", "section"]
