"""Small pieces every page uses: the profile from the URL, graphs, tables, downloads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import dash
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from dash import dash_table, dcc, html

from popviz import analysis
from popviz.analysis.op_groups import has_gpu_time
from popviz.errors import ProfileError, RequestStopped
from popviz.figures.lod import TraceIndex
from popviz.vocab import MODELLED, Naming, naming_for

from .cache import Entry, PathRefused, ProfileCache, relative_message
from .tune_jobs import TuneJobs

# no Plotly tips: its "Double-click to zoom back out" toast sat over the nav bar's right end
# (each page's hint says how to zoom back)
GRAPH_CONFIG: dcc.Graph.Config = {"displaylogo": False, "scrollZoom": True, "showTips": False,
                                  "toImageButtonOptions": {"format": "png", "scale": 2}}
SMALL_TABLE_ROWS = 15
# numbers that name things (shown without thousands separators)
ID_COLUMNS = {"ipu", "tile", "stage", "step", "peak_step", "microbatch", "first_step",
              "last_step", "producer", "last_use", "source_op", "section"}


@dataclass
class AppContext:
    root: Path
    cache: ProfileCache
    tune_jobs: TuneJobs = field(default_factory=TuneJobs)  # /tune's background searches


def profile_of(search: str | None) -> str:
    """The `profile` query parameter of a URL search string ('' when absent)."""
    values = parse_qs((search or "").lstrip("?")).get("profile", [])
    return values[0] if values else ""


def profile_query(rel: str) -> str:
    return "?" + urlencode({"profile": rel}) if rel else ""


def naming(entry: Entry) -> Naming:
    """IPUs and cycles, or ranks and ns for a measured profile (popviz.figures.naming)."""
    return entry.get("naming", lambda: naming_for(entry.profile))


def unit(entry: Entry) -> str:
    return naming(entry).unit


def gpu_timed(entry: Entry) -> bool:
    """Whether the profile's ops carry GPU time (analysis.op_groups.has_gpu_time), scanned
    once per profile rather than on every callback."""
    return bool(entry.get("has_gpu_time", lambda: has_gpu_time(entry.profile.ops)))


def error_text(ctx: AppContext, exc: BaseException, rel: str = "") -> str:
    """One line for any failure, with paths relative to the served folder."""
    if isinstance(exc, PathRefused | ProfileError):
        text = str(exc)
    elif isinstance(exc, RequestStopped | MemoryError):  # the server's budgets (serve)
        why = exc if isinstance(exc, RequestStopped) else (
            "building this view needed more memory than the server may use and was "
            "stopped (popviz serve --memory-mb)")
        text = f"{rel + ': ' if rel else ''}{why}"
    else:
        detail = " ".join(str(exc).split())[:200]
        text = (f"{rel + ': ' if rel else ''}could not build this view "
                f"({type(exc).__name__}{': ' + detail if detail else ''})")
    return relative_message(text, ctx.root, rel)[:400]


def message(text: str, tone: str = "error") -> html.Div:
    return html.Div(text, className=f"message {tone}")


def graph(id_: str | dict, figure: go.Figure, config: dcc.Graph.Config | None = None,
          **kwargs: Any) -> dcc.Graph:
    """A figure with the app's modebar; `config` adds to (or overrides) GRAPH_CONFIG."""
    merged: dcc.Graph.Config = {**GRAPH_CONFIG, **(config or {})}
    return dcc.Graph(id=id_, figure=figure, config=merged, className="graph", **kwargs)


def view_name(view: str, words: Naming) -> str:
    """A figure's name in the profile's words: 'ipu_time' is 'gpu_time' on a GPU plan and
    'rank_time' on a run (the route keeps the view's own key)."""
    return view if words.has_tiles else view.replace("ipu", words.family)


def downloads(rel: str, tables: list[str], views: list[str],
              words: Naming = MODELLED) -> html.Div:
    """Links to CSV of tables (their contract column names, as `popviz export` writes
    them) and standalone HTML of figures (PNG is in each modebar)."""
    q = "?profile=" + quote(rel)
    links: list[Any] = [html.Span("Download: ", className="label")]
    links += [html.A(f"{t}.csv", href=f"/download/csv/{t}{q}", className="download")
              for t in tables]
    links += [html.A(f"{view_name(v, words)}.html", href=f"/download/html/{v}{q}",
                     className="download") for v in views]
    return html.Div(links, className="downloads")


# columns whose -1 means "none" (a host op outside any micro-batch, no peer, an op that is
# its own source): shown blank, not as a number
NONE_IS_MINUS_ONE = ("microbatch", "peer", "source_op")


def _format(frame: pd.DataFrame) -> list[dict[str, Any]]:
    out = frame.copy()
    for col in out.columns:
        if col in NONE_IS_MINUS_ONE and pd.api.types.is_numeric_dtype(out[col]):
            out[col] = out[col].astype(object).where(out[col] != -1, None)
        elif pd.api.types.is_float_dtype(out[col]):
            out[col] = out[col].round(4)
        elif not pd.api.types.is_numeric_dtype(out[col]) and not pd.api.types.is_bool_dtype(
                out[col]):
            out[col] = out[col].astype(str)
        elif pd.api.types.is_bool_dtype(out[col]):
            out[col] = out[col].map({True: "yes", False: "no"})
    return out.to_dict("records")  # type: ignore[return-value]  # pandas-stubs: keys are any Hashable; these are column names


CHOOSER_MIN_COLUMNS = 8  # tables with more columns than this get "Toggle Columns"
# numeric columns whose missing cells mean not recorded (a trace without FLOPs), read so
UNKNOWN_WHEN_MISSING = ("flops",)


def table_columns(frame: pd.DataFrame, words: Naming = MODELLED,
                  hideable: bool = True) -> list[dict[str, Any]]:
    """DataTable columns: numbers typed (so they sort and filter as numbers) and shown with
    thousands separators; headers in the profile's words (rank, ns when measured)."""
    out = []
    for c in frame.columns:
        # a column that can be hidden and shown again ("Toggle Columns" above the table)
        col: dict[str, Any] = {"name": words.column(str(c)), "id": c, "type": "text",
                               "hideable": hideable}
        if pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c]):
            col["type"] = "numeric"
            integer = pd.api.types.is_integer_dtype(frame[c])
            plain = c.replace(" ", "_") in ID_COLUMNS or c.endswith("_id")  # tile 1003
            col["format"] = {"specifier": ("d" if plain else ",d") if integer else
                             ".1%" if is_share(str(c)) else
                             # sizes to one place, every row: "457" sat beside "510.5"
                             ",.1f" if str(c).endswith(" MiB") else ",.4~f"}
            if c in UNKNOWN_WHEN_MISSING:
                col["format"]["nully"] = "unknown"
        out.append(col)
    return out


def table(id_: str, frame: pd.DataFrame, page_size: int = SMALL_TABLE_ROWS,
          words: Naming = MODELLED, hidden: Sequence[str] = (),
          **kwargs: Any) -> dash_table.DataTable:  # type: ignore[name-defined, unused-ignore]  # dash 4 builds dash_table's names at import
    """A read-only, sortable table of a small frame (sorted and paged in the browser).
    `hidden`: columns left out until the user shows them (Toggle Columns)."""
    # a column chooser where there are columns to choose from, not over a three-column list
    chooser = bool(hidden) or len(frame.columns) > CHOOSER_MIN_COLUMNS
    columns = table_columns(frame, words, hideable=chooser)
    kwargs.setdefault("hidden_columns", hidden_of(frame, hidden))
    cell = {"fontFamily": "inherit", "fontSize": 12, "padding": "4px 8px",
            "textAlign": "left", "maxWidth": 360, "overflow": "hidden",
            "textOverflow": "ellipsis"}
    params = {"sort_action": "native", "page_size": page_size,
              "style_table": {"overflowX": "auto"}, "style_cell": cell,
              "style_header": {"fontWeight": 600, "backgroundColor": "#f3f5f8"}}
    params.update(kwargs)
    return dash_table.DataTable(id=id_, columns=columns, data=_format(frame), **params)  # type: ignore[attr-defined, unused-ignore]  # dash 4 builds dash_table's names at import


def _cell(value: Any, column: str) -> str:
    """A value as `table` shows it: integers with thousands separators (ids plain),
    floats to 4 places without trailing zeros, -1 blank where it means none."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        if column in NONE_IS_MINUS_ONE and value == -1:
            return ""
        plain = column.replace(" ", "_") in ID_COLUMNS or column.endswith("_id")
        return f"{int(value)}" if plain else f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        if is_share(column):
            return f"{float(value):.1%}"
        return f"{float(value):,.4f}".rstrip("0").rstrip(".")
    return str(value)


SHARE_COLUMNS = ("fullest_tile",)  # /tune's plans: the fullest tile's share of its memory


def is_share(column: str) -> bool:
    """A column of shares of a whole (busy_fraction, bubble_fraction, a plan's fullest
    tile): shown as percent, as the cards and figures say them ("12% idle"), sorted and
    filtered as the number."""
    return column.endswith("_fraction") or column in SHARE_COLUMNS


def _td(text: str, keyed: dict[str, Any]) -> html.Td:
    """A cell; text cut to its column's width keeps the whole of it as a tooltip."""
    return html.Td(text, title=text, **keyed) if len(text) > 18 else html.Td(text, **keyed)


def static_table(id_: str, frame: pd.DataFrame, words: Naming = MODELLED) -> html.Table:
    """A small table drawn as plain HTML, for panels redrawn on every zoom: a sortable
    DataTable costs the browser about 70 ms each time it is drawn, this a few. Cells look
    and read as `table`'s (each carries its column as `data-dash-column`); no sorting,
    so the frame comes in the order to show."""
    cols = [str(c) for c in frame.columns]
    keyed: list[dict[str, Any]] = [{"data-dash-column": c} for c in cols]  # data-* props
    head = html.Tr([html.Th(words.column(c), **k) for c, k in zip(cols, keyed, strict=True)])
    rows = [html.Tr([_td(_cell(v, c), k) for v, c, k in zip(row, cols, keyed, strict=True)])
            for row in frame.itertuples(index=False, name=None)]
    return html.Table([html.Thead(head), html.Tbody(rows)], id=id_, className="static-table")


def light_table(id_: str, frame: pd.DataFrame, words: Naming = MODELLED) -> Any:
    """`static_table` for a frame of a page or less, else the sortable, paged `table` (a
    1,024-rank job's per-rank rows: 7,000 cells drawn at once would cost more than the
    DataTable they replace)."""
    if len(frame) <= SMALL_TABLE_ROWS:
        return static_table(id_, frame, words)
    return table(id_, frame, words=words)


def hidden_of(frame: pd.DataFrame, hidden: Sequence[str]) -> list[str]:
    """The columns of `hidden` the frame has: shown on demand, not by default."""
    return [c for c in hidden if c in frame.columns]


# ---- derived data, built once per open profile ----
def trace_index(entry: Entry) -> TraceIndex:
    return entry.get("trace_index", lambda: TraceIndex(entry.profile.trace))


def insights(entry: Entry) -> dict[str, Any]:
    return entry.get("insights", lambda: analysis.insights(entry.profile))


def bumps(entry: Entry) -> pd.DataFrame:
    return entry.get("bumps", lambda: analysis.bumps(entry.profile.liveness))


def capacity_per_ipu(entry: Entry) -> float:
    from popviz.analysis.insights import capacity_per_ipu as cap
    return cap(entry.profile.meta or {})


def title_of(entry: Entry) -> str:
    meta = entry.profile.meta or {}
    model = (meta.get("model") or {}).get("name", "")
    target = (meta.get("target") or {}).get("name", "")
    return f"{entry.rel} · {model} on {target} ({entry.profile.kind})"


def triggered() -> Any:
    """The id of the input that fired the running callback (None when a test calls the
    callback function directly)."""
    try:
        return dash.ctx.triggered_id
    except Exception:  # outside a Dash request there is no callback context
        return None


def axis_range(relayout: dict[str, Any] | None,
               axis: str = "x") -> tuple[float, float] | str | None:
    """The range a zoom or pan asked for on any `x` (or `y`) axis: (lo, hi); 'auto' for a
    reset (double-click, autoscale); None when the event did not touch such an axis."""
    if not relayout:
        return None
    for key, value in relayout.items():
        name, _, rest = key.partition(".")
        if not name.startswith(f"{axis}axis"):
            continue
        if rest == "autorange" and value is True:
            return "auto"
        if rest == "range" and isinstance(value, list) and len(value) == 2:
            lo, hi = float(value[0]), float(value[1])
            return (min(lo, hi), max(lo, hi))
        if rest == "range[0]":
            other = relayout.get(f"{name}.range[1]")
            if other is not None:
                lo, hi = float(value), float(other)
                return (min(lo, hi), max(lo, hi))
    return None


def x_range(relayout: dict[str, Any] | None) -> tuple[float, float] | str | None:
    return axis_range(relayout, "x")


def op_templates(entry: Entry) -> dict:
    """The modelled op layout of each pass, built once per profile (`trace_detail.pass_ops`;
    {} on a measured profile: no op level). A GPU plan is modelled too (its times are ns,
    not measured): its ops are its kernels on the compute stream, in program order. One
    key and one value for /trace's op lanes, its BSP view and the links to an op."""
    from popviz.analysis.trace_detail import pass_ops

    measured = naming(entry).measured
    return entry.get("pass_ops", lambda: pass_ops(entry.profile.ops, measured=measured))
