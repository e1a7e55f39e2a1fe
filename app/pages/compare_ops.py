"""The op-by-op part of /compare: a sortable A vs B table grouped as the user picks, the
top differences as diverging bars, and the merged liveness overlay.

Wiring only: popviz.analysis.compare.ops / .overlay compute, popviz.figures
.compare_ops draws. Not a page of its own (compare.py places it and registers it)."""

from __future__ import annotations

from typing import Any

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html

from popviz.analysis.compare import Comparison
from popviz.analysis.compare.ops import GROUP_BY, OpDiff, compare_ops, time_unit
from popviz.analysis.compare.overlay import liveness_overlay
from popviz.errors import ProfileError
from popviz.figures import compare_ops as cof
from popviz.figures.style import empty_figure

from ..cache import Entry, PathRefused
from ..common import AppContext, graph, message, table
from .compare_pair import comparison, pair_of

TOP = 20
DEPTHS = [1, 2, 3, 4]
PER_LABELS = {"auto": "auto (per sample if steps differ)", "step": "per step",
              "sample": "per sample"}


def op_diff(a: Entry, b: Entry, comp: Comparison, by: str, depth: int, per: str) -> OpDiff:
    """Built once per pair and choice (kept with A's cached entry, like the comparison)."""
    return a.get(("compare-ops", b.rel, b.stamp or id(b), by, depth, per),
                 lambda: compare_ops(a.profile, b.profile, comp, by=by, depth=depth, per=per))


def _frame(diff: OpDiff) -> pd.DataFrame:
    """The table as shown: times in the chosen unit, numbers kept numeric (they sort)."""
    scale, unit = time_unit(diff.per)
    t = diff.table
    mib = 2.0 ** 20
    return pd.DataFrame({
        GROUP_BY[diff.by]: t["group"].astype(str),
        f"A {unit}": t["a_seconds"] * scale, f"B {unit}": t["b_seconds"] * scale,
        "B - A": t["delta_seconds"] * scale, "B / A": t["ratio"],
        "A calls per step": t["a_count"], "B calls per step": t["b_count"],
        "A temp MiB": t["a_temp_bytes"] / mib, "B temp MiB": t["b_temp_bytes"] / mib,
        "A written MiB": t["a_bytes_written"] / mib,
        "B written MiB": t["b_bytes_written"] / mib})


def _table(diff: OpDiff) -> Any:
    return table("compare-ops-table", _frame(diff), page_size=15)


def default_by(comp: Comparison) -> str:
    """Op type, or op class when one side is modelled and the other measured: a kernel is
    named by the aten op that launched it (cudnn_convolution), the model by the one
    recorded (convolution), so only classes line up across kinds."""
    return "op" if comp.sides["kind"].nunique() == 1 else "class"


def _controls(by: str) -> html.Div:
    return html.Div([
        html.Span("group by", className="label"),
        dcc.Dropdown(id="compare-ops-by", value=by, clearable=False, style={"width": 160},
                     options=[{"label": v, "value": k} for k, v in GROUP_BY.items()]),
        html.Span("module depth", className="label"),
        dcc.Dropdown(id="compare-ops-depth", value=1, clearable=False, style={"width": 80},
                     options=[{"label": str(d), "value": d} for d in DEPTHS]),
        html.Span("time", className="label"),
        dcc.Dropdown(id="compare-ops-per", value="auto", clearable=False,
                     style={"width": 360},
                     options=[{"label": v, "value": k} for k, v in PER_LABELS.items()]),
    ], className="row", style={"alignItems": "center", "flexWrap": "wrap"})


def section(a: Entry, b: Entry, comp: Comparison) -> list[Any]:
    """The op-by-op table and bars (grouped by op type) and the merged liveness overlay."""
    by = default_by(comp)
    try:
        diff = op_diff(a, b, comp, by, 1, "auto")
    except ValueError as exc:
        return [message(str(exc))]
    overlay = liveness_overlay(comp.liveness, "device")
    return [
        html.H3("Op by op (every delta is B - A; empty = not run on that side)"),
        html.Div("Time from each profile's own clock: a modelled op's cycles / clock x its "
                 "runs per step, a measured kernel's ns; largest difference first.",
                 className="hint"),
        _controls(by),
        html.Div(_table(diff), id="compare-ops-box"),
        graph("compare-ops-diff", cof.ops_diff_figure(diff, TOP)),
        html.H3("Merged liveness"),
        dcc.RadioItems(id="compare-overlay-mode", value="device", inline=True,
                       options=[{"label": " every IPU / rank ", "value": "device"},
                                {"label": " whole-device peak ", "value": "peak"}]),
        graph("compare-overlay", cof.liveness_overlay_figure(overlay, comp.sides)),
    ]


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    def entries(search: str | None) -> tuple[Entry, Entry, Comparison]:
        a, b = pair_of(search)
        ea, eb = ctx.cache.get(a), ctx.cache.get(b)
        return ea, eb, comparison(ea, eb)

    @app.callback(Output("compare-ops-box", "children"), Output("compare-ops-diff", "figure"),
                  Input("compare-ops-by", "value"), Input("compare-ops-depth", "value"),
                  Input("compare-ops-per", "value"), State("url", "search"),
                  prevent_initial_call=True)
    def regroup(by: str, depth: int, per: str, search: str | None) -> tuple[Any, Any]:
        try:
            ea, eb, comp = entries(search)
            diff = op_diff(ea, eb, comp, by or "op", int(depth or 1), per or "auto")
        except (PathRefused, ProfileError, ValueError) as exc:
            return message(str(exc)), empty_figure(str(exc))
        return _table(diff), cof.ops_diff_figure(diff, TOP)

    @app.callback(Output("compare-overlay", "figure"), Input("compare-overlay-mode", "value"),
                  State("url", "search"), prevent_initial_call=True)
    def overlay(mode: str, search: str | None) -> Any:
        try:
            _, _, comp = entries(search)
            frame = liveness_overlay(comp.liveness, mode or "device")
        except (PathRefused, ProfileError, ValueError) as exc:
            return empty_figure(str(exc))
        return cof.liveness_overlay_figure(frame, comp.sides)

    return {"regroup": regroup, "overlay": overlay}
