"""`/operations`: every op, sorted, filtered and paged on the server; `&t0=&t1=` (`&ipu=`,
a range picked on /trace) keeps the ops that ran in it; a click on a row links to the
trace at that op."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlencode

import dash
import numpy as np
import pandas as pd
from dash import Input, Output, State, dash_table, dcc, html
from dash.exceptions import PreventUpdate

from popviz import analysis
from popviz.analysis.links import ops_in_range
from popviz.analysis.op_groups import GROUP_KEYS, group_ops, has_gpu_time, self_and_inclusive
from popviz.analysis.program_tree import flops_recorded
from popviz.vocab import Naming

from .. import links
from ..cache import Entry
from ..common import (
    AppContext,
    gpu_timed,
    hidden_of,
    message,
    naming,
    profile_of,
    table,
    table_columns,
    title_of,
)
from ..common import _format as records
from ..trace_stats import op_place

PATH = "/operations"
TITLE = "Operations"
NEEDS_PROFILE = True
PAGE_SIZE = 25
FIGURES: dict[str, Any] = {}
# what a user sorts and filters on first: which op, where it ran, what it cost, and for a
# conv / matmul its plan at the AMP in force (partition, serial slices, cycles and
# temporary bytes of each pass)
FRONT = ("op_id", "op", "op_class", "module", "phase", "pass", "stage", "ipu", "cycles",
         "gpu_inclusive_ns", "host_ns", "host_self_ns", "flops", "temp_bytes", "amp_used",
         "passes", "plan", "bytes_read", "bytes_written")


# shown when asked for (Toggle Columns): what the op is made of and how its cycles split,
# which the sort and filter still reach and ops.csv still has
DETAIL = ("layer", "block", "checkpoint", "out_shape", "dtype", "host_ns", "inputs",
          "outputs", "section", "source_op", "tiles_used", "compute_cycles", "memory_cycles",
          "exchange_cycles_internal", "temp_total_bytes", "amp_ignored", "step",
          "kernel_path", "widen_kernels", "widen_elements", "cast_kernels", "cast_bytes")


# the contract's IPU columns a GPU plan fills with placeholders (a GPU has no AMP and no
# per-tile temporaries): not shown on a GPU plan
IPU_ONLY = ("amp_used", "amp_ignored", "temp_bytes", "passes", "plan")
# what CUDA would run each op as (the recording names it for every target): on an IPU
# plan it means nothing
GPU_ONLY = ("kernel_path",)


def ordered(ops: pd.DataFrame, gpu: bool = False, measured: bool = False) -> pd.DataFrame:
    """The ops with the cost columns first (cycles is column 27 in the file); a GPU plan's
    without the IPU-only columns. A measured run's ops nest (conv2d -> convolution -> ...
    -> cudnn_convolution, the innermost launching the kernels): each row also gets its
    host time less its children's (`host_self_ns`) and, when its ops launched kernels, the
    GPU time of its own and its descendants' kernels (`gpu_inclusive_ns`; `cycles` is its
    own), as PyTorch's profiler and Perfetto give them."""
    dropped = IPU_ONLY if gpu else GPU_ONLY
    ops = ops.drop(columns=[c for c in dropped if c in ops.columns])
    if "flops" in ops.columns and not flops_recorded(ops):  # recorded without FLOPs:
        ops = ops.assign(flops=np.nan)  # unknown (shown so, and no filter keeps it), not 0
    if measured and len(ops) and {"start", "end"} <= set(ops.columns):
        times = self_and_inclusive(ops)
        ops = ops.assign(host_self_ns=times["host_self"].to_numpy(np.int64))
        if has_gpu_time(ops):
            ops = ops.assign(gpu_inclusive_ns=times["gpu_inclusive"].to_numpy(np.int64))
    front = [c for c in FRONT if c in ops.columns]
    return ops[front + [c for c in ops.columns if c not in front]]


def _ordered(entry: Entry) -> pd.DataFrame:
    words = naming(entry)
    return entry.get("ops_ordered", lambda: ordered(entry.profile.ops, gpu=words.gpu_plan,
                                                    measured=words.measured))


def in_window(entry: Entry, window: links.Window | None) -> pd.DataFrame:
    """The ordered ops, or those that ran in a linked trace range (built once per range)."""
    ops = _ordered(entry)
    if window is None:
        return ops
    t0, t1, ipu = window
    return entry.get(("ops_window", t0, t1, ipu), lambda: ops[ops_in_range(
        ops, entry.profile.trace, t0, t1, ipu)])


def page(entry: Entry, filter_query: str | None, sort_by: list[dict] | None,
         number: int, size: int = PAGE_SIZE, window: links.Window | None = None
         ) -> tuple[list[dict], int, str]:
    """(rows of the page, page count, a message: '' or why the filter failed); each row's
    `id` is its op_id (a click sends that alone)."""
    ops = in_window(entry, window)
    # lower-cased text columns, built once each (per linked range: other rows)
    texts = entry.get("ops_texts" if window is None else ("ops_texts", *window), dict)
    errors: list[str] = []  # a cell it cannot read is skipped and named, never blanks
    rows, total = analysis.query_table(ops, filter_query, sort_by, number, size,
                                       texts=texts, errors=errors)
    note = f"{total:,} of {len(ops):,} ops"
    if window is not None:
        t0, t1, ipu = window
        on = f" on {naming(entry).label(ipu)}" if ipu is not None else ""
        note += (f" that ran in {t0:,.0f} to {t1:,.0f} {naming(entry).unit}{on} (the range "
                 "linked from the trace)")
    if "{flops}" in (filter_query or "") and "flops" in ops and ops["flops"].isna().all():
        note += (" · this run recorded no FLOPs (torch.profiler without with_flops): a "
                 "FLOPs filter keeps no op")
    if errors:
        note += " · filter not understood, ignored: " + "; ".join(
            _in_words(e, ops, naming(entry)) for e in errors)
    data = records(rows)
    if "op_id" in rows.columns:
        for row, op_id in zip(data, rows["op_id"], strict=True):
            row["id"] = int(op_id)
    return data, max(1, -(-total // size)), note


def filtered(entry: Entry, filter_query: str | None,
             window: links.Window | None = None) -> pd.DataFrame:
    """Every op the filter row keeps (the cells it understands), for the groups."""
    ops = in_window(entry, window)
    return analysis.filter_table(ops, filter_query, entry.get("ops_texts", dict), errors=[])


def groups(entry: Entry, by: str | None, filter_query: str | None = "",
           window: links.Window | None = None) -> Any:
    """The grouped view of the filtered ops: a table, or nothing when not grouping."""
    if not by:
        return []
    words = naming(entry)
    out = group_ops(filtered(entry, filter_query, window), by, measured=words.in_ns,
                    gpu=gpu_timed(entry))
    unit = words.unit
    out = out.rename(columns={"cycles": unit, "mean_cycles": f"mean {unit}",
                              "host_self": f"host self {unit}",
                              "host_inclusive": f"host inclusive {unit}",
                              "gpu_self": f"GPU self {unit}",
                              "gpu_inclusive": f"GPU inclusive {unit}"})
    if f"mean {unit}" in out:
        out[f"mean {unit}"] = out[f"mean {unit}"].round(0)
    out["share"] = [f"{x:.1%}" for x in out["share"]]
    grouped = table("ops-groups-table", out, page_size=15, words=words)
    if f"host inclusive {unit}" not in out:
        return grouped
    return html.Div([html.Div(
        "Self times add up to the run's; inclusive ones do not across rows: an op's "
        "inclusive time holds the ops it calls, which have rows of their own when they are "
        "in another group (within one group, an op inside another is counted once).",
        className="hint", id="ops-groups-hint"), grouped])


def csv_href(rel: str, filter_query: str | None, sort_by: list[dict] | None) -> str:
    """The ops CSV as shown: the filters and sort of the table ride in the link."""
    args = {"profile": rel}
    if filter_query:
        args["filter"] = filter_query
    if sort_by:
        args["sort"] = json.dumps([{k: s[k] for k in ("column_id", "direction") if k in s}
                                   for s in sort_by])
    return "/download/csv/ops?" + urlencode(args)


def _in_words(text: str, ops: pd.DataFrame, words: Naming) -> str:
    """An error naming a column by its id ('cycles') in the header's words ('ns')."""
    for col in ops.columns:
        shown = words.column(str(col))
        if shown != col:
            text = text.replace(f"'{col}'", f"'{shown}'")
    return text


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    ops = _ordered(entry)
    if ops.empty:
        return html.Div([html.H2(title_of(entry)), message("No ops in this profile.", "info")])
    data, count, note = page(entry, "", [], 0)
    columns = table_columns(ops, naming(entry))
    return html.Div([
        html.H2(title_of(entry)),
        html.P("Type in the row under the headers to filter: text (conv), or in a number "
               "column > 1000, <= 5e6, != 0, 1000..20000 (a range), > 1.5M; click a header "
               "to sort, shift-click to sort by more columns.", className="hint"),
        html.Div([html.Span("Group by ", className="label"), dcc.Dropdown(
            id="ops-group-by", options=[{"label": "(no grouping)", "value": ""}] + [
                {"label": naming(entry).column(k), "value": k} for k in GROUP_KEYS
                if k in ops.columns], value="", clearable=False, className="picker")],
            className="row"),
        html.Div(id="ops-groups"),
        html.Div(note, id="ops-note", className="status"),
        html.Div(html.Span("Click a row for a link to its op in the Trace.", className="hint"),
                 id="ops-to-trace", className="downloads"),
        html.Div(id="ops-init", style={"display": "none"}),
        dash_table.DataTable(  # type: ignore[attr-defined, unused-ignore]  # dash 4 builds dash_table's names at import
            id="ops-table", columns=columns, data=data, page_current=0, page_size=PAGE_SIZE,
            page_count=count, page_action="custom", sort_action="custom", sort_mode="multi",
            # a measured run's host time is its own; a modelled op's is the recording's
            hidden_columns=hidden_of(ops, [c for c in DETAIL if not (
                naming(entry).measured and c == "host_ns")]),
            filter_action="custom", filter_query="", sort_by=[],
            filter_options={"placeholder_text": "filter"},  # 'filter data...' is cut off
            style_table={"overflowX": "auto"},
            style_cell={"fontFamily": "inherit", "fontSize": 12, "padding": "4px 8px",
                        "textAlign": "left",
                        "maxWidth": 320, "overflow": "hidden", "textOverflow": "ellipsis"},
            style_header={"fontWeight": 600, "backgroundColor": "#f3f5f8"},
            # a plan names every pass: wrapped, not cut off
            style_cell_conditional=[{"if": {"column_id": "plan"}, "whiteSpace": "normal",
                                     "minWidth": 380, "maxWidth": 620}]),
        html.Div([html.Strong("Download: "), html.A(
            "ops.csv", id="ops-csv", href=csv_href(entry.rel, "", []), className="download",
            title="the rows the filters keep, in the order shown")], className="downloads"),
    ])


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    @app.callback(Output("ops-table", "data"), Output("ops-table", "page_count"),
                  Output("ops-note", "children"), Input("ops-table", "page_current"),
                  Input("ops-table", "page_size"), Input("ops-table", "sort_by"),
                  Input("ops-table", "filter_query"), State("url", "search"),
                  prevent_initial_call=True)
    def refresh(number: int, size: int, sort_by: list[dict], filter_query: str,
                search: str) -> tuple[list[dict], int, str]:
        return page(ctx.cache.get(profile_of(search)), filter_query, sort_by, number or 0,
                    size or PAGE_SIZE, links.window_of(search))

    @app.callback(Output("ops-csv", "href"), Input("ops-table", "filter_query"),
                  Input("ops-table", "sort_by"), State("url", "search"),
                  prevent_initial_call=True)
    def csv_link(filter_query: str, sort_by: list[dict], search: str) -> str:
        return csv_href(profile_of(search), filter_query, sort_by)

    @app.callback(Output("ops-groups", "children"), Input("ops-group-by", "value"),
                  Input("ops-table", "filter_query"), State("url", "search"),
                  prevent_initial_call=True)
    def grouped(by: str, filter_query: str, search: str) -> Any:
        return groups(ctx.cache.get(profile_of(search)), by, filter_query,
                      links.window_of(search))

    @app.callback(Output("ops-table", "data", allow_duplicate=True),
                  Output("ops-table", "page_count", allow_duplicate=True),
                  Output("ops-note", "children", allow_duplicate=True),
                  Input("ops-init", "children"), State("url", "search"),
                  prevent_initial_call="initial_duplicate")
    def linked(_init: Any, search: str) -> tuple[list[dict], int, str]:
        """With `&t0=&t1=` (a range from the trace): open on the ops that ran in it."""
        window = links.window_of(search)
        if window is None:  # the layout already holds the first page
            raise PreventUpdate
        return page(ctx.cache.get(profile_of(search)), "", [], 0, PAGE_SIZE, window)

    @app.callback(Output("ops-to-trace", "children"), Input("ops-table", "active_cell"),
                  State("url", "search"), prevent_initial_call=True)
    def to_trace(cell: dict | None, search: str) -> Any:
        """The clicked row's op (its id alone comes) as a link to the trace at it."""
        try:
            op_id = int((cell or {})["row_id"])
        except (KeyError, TypeError, ValueError):
            raise PreventUpdate from None
        return op_link(ctx.cache.get(profile_of(search)), op_id)

    @app.callback(Output("ops-table", "filter_query"), Input("ops-init", "children"),
                  State("url", "search"))
    def from_url(_init: Any, search: str) -> str:
        """`&module=PATH` (the program tree's link): that module and its children."""
        module = parse_qs((search or "").lstrip("?")).get("module", [""])[0]
        if not module:
            raise PreventUpdate
        return module_filter(module)

    return {"refresh": refresh, "from_url": from_url, "csv_link": csv_link,
            "grouped": grouped, "to_trace": to_trace, "linked": linked}


def op_link(entry: Entry, op_id: int) -> Any:
    """A link to the op itself on /trace: a window centred on it, the op outlined."""
    found = op_place(entry, op_id)
    if found is None:
        return html.Span(f"Op {op_id} has no place on the trace.", className="hint")
    ipu, span, (t0, t1) = found
    return [html.Span(f"Op {op_id}: ", className="label"),
            links.link(f"open it in the Trace ({naming(entry).label(ipu)}, "
                       f"{span[0]:,.0f} to {span[1]:,.0f} {naming(entry).unit})",
                       links.href("/trace", entry.rel, t0, t1, ipu, op=str(op_id)),
                       "ops-trace-link")]


def module_filter(module: str) -> str:
    return f"{{module}} s= {module}.*"
