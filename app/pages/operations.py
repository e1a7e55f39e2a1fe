"""`/operations`: every op, sorted, filtered and paged on the server."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import dash
import pandas as pd
from dash import Input, Output, State, dash_table, html
from dash.exceptions import PreventUpdate

from popviz import analysis
from popviz.vocab import Naming

from ..cache import Entry
from ..common import (
    AppContext,
    downloads,
    message,
    naming,
    profile_of,
    table_columns,
    title_of,
)
from ..common import _format as records

PATH = "/operations"
TITLE = "Operations"
NEEDS_PROFILE = True
PAGE_SIZE = 25
FIGURES: dict[str, Any] = {}
# what a user sorts and filters on first: which op, where it ran, what it cost, and for a
# conv / matmul its plan at the AMP in force (partition, serial slices, cycles and
# temporary bytes of each pass)
FRONT = ("op_id", "op", "op_class", "module", "phase", "pass", "stage", "ipu", "cycles",
         "flops", "temp_bytes", "amp_used", "passes", "plan", "bytes_read", "bytes_written")


def ordered(ops: pd.DataFrame) -> pd.DataFrame:
    """The ops with the cost columns first (cycles is column 27 in the file)."""
    front = [c for c in FRONT if c in ops.columns]
    return ops[front + [c for c in ops.columns if c not in front]]


def page(entry: Entry, filter_query: str | None, sort_by: list[dict] | None,
         number: int, size: int = PAGE_SIZE) -> tuple[list[dict], int, str]:
    """(rows of the page, page count, a message: '' or why the filter failed)."""
    ops = entry.get("ops_ordered", lambda: ordered(entry.profile.ops))
    try:
        texts = entry.get("ops_texts", dict)  # lower-cased text columns, built once each
        rows, total = analysis.query_table(ops, filter_query, sort_by, number, size,
                                           texts=texts)
        note = f"{total:,} of {len(ops):,} ops"
    except ValueError as exc:
        rows, total = ops.iloc[0:0], 0
        note = f"Filter not understood: {_in_words(str(exc), ops, naming(entry))}"
    return records(rows), max(1, -(-total // size)), note


def _in_words(text: str, ops: pd.DataFrame, words: Naming) -> str:
    """An error naming a column by its id ('cycles') in the header's words ('ns')."""
    for col in ops.columns:
        shown = words.column(str(col))
        if shown != col:
            text = text.replace(f"'{col}'", f"'{shown}'")
    return text


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    ops = entry.get("ops_ordered", lambda: ordered(entry.profile.ops))
    if ops.empty:
        return html.Div([html.H2(title_of(entry)), message("No ops in this profile.", "info")])
    data, count, note = page(entry, "", [], 0)
    columns = table_columns(ops, naming(entry))
    return html.Div([
        html.H2(title_of(entry)),
        html.P("Type in the row under the headers to filter: text (conv), or in a number "
               "column > 1000, <= 5e6, != 0, 1000..20000 (a range), > 1.5M; click a header "
               "to sort, shift-click to sort by more columns.", className="hint"),
        html.Div(note, id="ops-note", className="status"),
        html.Div(id="ops-init", style={"display": "none"}),
        dash_table.DataTable(
            id="ops-table", columns=columns, data=data, page_current=0, page_size=PAGE_SIZE,
            page_count=count, page_action="custom", sort_action="custom", sort_mode="multi",
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
        downloads(entry.rel, ["ops"], []),
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
                    size or PAGE_SIZE)

    @app.callback(Output("ops-table", "filter_query"), Input("ops-init", "children"),
                  State("url", "search"))
    def from_url(_init: Any, search: str) -> str:
        """`&module=PATH` (the program tree's link): that module and its children."""
        module = parse_qs((search or "").lstrip("?")).get("module", [""])[0]
        if not module:
            raise PreventUpdate
        return module_filter(module)

    return {"refresh": refresh, "from_url": from_url}


def module_filter(module: str) -> str:
    return f"{{module}} s= {module}.*"
