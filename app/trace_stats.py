"""/trace's statistics of a window: time by kind, per device, compute by op class, the
top ops and kernels, and a GPU's idle by cause, as small tables redrawn with each zoom
(the page's callbacks send them with the figure); and the per-profile facts the page and
they share (the pass layouts, the opening window, whether the lanes are host threads)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import html

from popviz.analysis.links import Span, op_span, op_window, run_span
from popviz.analysis.range_stats import RangeStats, range_statistics
from popviz.analysis.trace_detail import PassOps, readable_window
from popviz.analysis.trace_threads import has_threads, idle_by_cause, launch_links
from popviz.metrics import step_time
from popviz.vocab import Naming

from .cache import Entry
from .common import light_table, naming, op_templates, trace_index


def templates(entry: Entry) -> dict[tuple[int, str], PassOps]:
    """The modelled op layout of each pass (common.op_templates)."""
    return op_templates(entry)


def opening_window(entry: Entry) -> tuple[float, float] | None:
    """Ramp-up plus a few steady-state steps of a long pipelined run (None: show all)."""
    return entry.get("trace_window", lambda: readable_window(entry.profile.trace))


def threads(entry: Entry) -> bool:
    """Whether the profile is an import with thread and stream lanes (format 1.2)."""
    return entry.get("has_threads", lambda: has_threads(entry.profile.table("host_slices"),
                                                        entry.profile.trace))


def run_window(entry: Entry) -> tuple[float, float]:
    """The whole run as /trace draws it (with an import's host slices, which start before
    its first device event), once per open profile: links to an op keep inside it."""
    return entry.get("run_span", lambda: run_span(
        entry.profile.trace, entry.profile.table("host_slices") if threads(entry) else None))


def op_place(entry: Entry, op_id: int, microbatch: int | None = None
             ) -> tuple[int, Span, Span] | None:
    """(device, the op's span, the window a link to it opens: centred on it, inside the
    run) for a link to one op on /trace (a modelled op in `microbatch`'s run of its pass,
    if given); None where it has no place there."""
    found = op_span(entry.profile.ops, entry.profile.trace, op_id, op_templates(entry),
                    microbatch)
    if found is None:
        return None
    ipu, span = found
    return ipu, span, op_window(span, entry.profile.trace, run=run_window(entry))


def _pct(frame: pd.DataFrame, col: str = "share") -> pd.DataFrame:
    """Shares as percentages, times as whole units (range edges cut events mid-cycle)."""
    out = frame.copy()
    for name in out.columns:
        if name not in (col, "ipu") and pd.api.types.is_float_dtype(out[name]):
            out[name] = out[name].round().astype("int64")
    if col in out:
        out[col] = (out[col] * 100).round(1).astype(str) + " %"
    return out


def compute_link(entry: Entry) -> tuple[bool, bool]:
    """`_compute_link`, once per open profile."""
    return entry.get("compute_link", lambda: _compute_link(entry))


def _compute_link(entry: Entry) -> tuple[bool, bool]:
    """(the trace names each compute event's launching host op, its compute events are GPU
    kernels). A kernel is not its host op; a CPU rank's compute events are the ops
    themselves; a profile without the link (a popviz.measure run, an older import) is on
    a GPU when the import named one."""
    trace = entry.profile.trace
    if "host_op" not in trace.columns:
        return False, bool((entry.profile.meta.get("measure") or {}).get("device"))
    comp = trace[trace["kind"] == "compute"]
    kernels = comp["host_op"].astype(str).to_numpy() != comp["op"].astype(str).to_numpy()
    return True, bool(kernels.any())


def stats_panel(entry: Entry, lo: float, hi: float, how: str) -> list[Any]:
    """The statistics of [lo, hi) as small tables (those of the opening window are kept:
    every visit shows them)."""
    words = naming(entry)

    def build() -> RangeStats:
        return range_statistics(entry.profile.trace, templates(entry), lo, hi,
                                measured=words.measured)

    opening = opening_window(entry) or (trace_index(entry).start, trace_index(entry).end)
    if abs(lo - opening[0]) < 1e-6 and abs(hi - opening[1]) < 1e-6:  # every visit's
        return list(entry.get(("stats_panel", lo, hi, how),
                              lambda: _stats_blocks(entry, lo, hi, how, build())))
    return _stats_blocks(entry, lo, hi, how, build())


def _window_note(entry: Entry, span: float, unit: str) -> str:
    """For a measured run whose window here is not its step: the shares below are this
    window's, and /summary's and /stages' are the step's (the whole run of an import
    holds time before and after its steps: 23.7% idle here, 24.5% on /summary)."""
    if not naming(entry).measured:
        return ""
    step = entry.get("step_window", lambda: step_time(entry.profile.trace))
    if not step or abs(span - step) <= 0.01 * step:
        return ""
    return (f" Shares below are over this window; /summary and /stages count over the "
            f"step ({step:,.0f} {unit}).")


def _stats_blocks(entry: Entry, lo: float, hi: float, how: str, stats: RangeStats
                  ) -> list[Any]:
    words = naming(entry)
    unit = words.unit
    head = html.Div(f"{how}: {lo:,.0f} to {hi:,.0f} {unit} ({hi - lo:,.0f} {unit}), "
                    # a measured run's trace is its ranks' events, on a CPU run no device's
                    f"{stats.events:,} {'trace' if words.measured else 'device'} events."
                    + _window_note(entry, hi - lo, unit),
                    id="trace-stats-head",
                    className="status")
    per_ipu = stats.per_ipu.rename(columns={"ipu": words.device.lower()})
    per_ipu = _pct(per_ipu, "busy_share")
    blocks = [head, html.Div([
        html.Div([html.H3(f"Time by kind ({unit})"),
                  light_table("trace-stats-kind", _pct(stats.by_kind), words=words)],
                 className="half"),
        html.Div([html.H3(f"Per {words.device}"),
                  light_table("trace-stats-ipu", per_ipu, words=words)], className="half"),
    ], className="row")]
    kernels = stats.top_kernels if stats.top_kernels is not None else pd.DataFrame()
    linked, on_gpu = compute_link(entry)
    kernels_title = "Top kernels (measured GPU time)" if on_gpu else \
        f"Top compute events ({naming(entry).timed} time)"
    if stats.measured and not stats.by_class.empty:  # compute linked to its host ops
        top_ops = stats.top_ops if on_gpu else \
            stats.top_ops.rename(columns={"kernels": "runs"})  # a CPU rank's ops ran there
        blocks.append(html.Div([
            html.Div([html.H3("Compute by op class (measured "
                              + ("GPU time)" if on_gpu else "host time)")),
                      light_table("trace-stats-class", _pct(stats.by_class), words=words)],
                     className="half"),
            html.Div([html.H3("Top ops (GPU time of the kernels each launched)" if on_gpu
                              else "Top ops (measured host time)"),
                      light_table("trace-stats-top", _pct(top_ops), words=words)],
                     className="half"),
        ], className="row"))
        if on_gpu:  # on a CPU rank the compute events are those ops: no second table
            blocks.append(html.Div([html.H3(kernels_title), light_table(
                "trace-stats-kernels", _pct(kernels), words=words)]))
    elif stats.measured and not kernels.empty:
        why = ("no kernel in this range names the op that launched it (launched outside "
               "any recorded op)" if linked else "this profile does not record which op "
               "launched each kernel (imported by an older popviz: import the trace again)")
        hint = html.P(f"Op-level statistics of this range are not available: {why}. The "
                      "Operations page has each op's total measured GPU time.",
                      className="hint") if on_gpu else html.Div()
        blocks.append(html.Div([html.H3(kernels_title), hint,
                                light_table("trace-stats-kernels", _pct(kernels), words=words)]))
    elif not stats.by_class.empty:
        blocks.append(html.Div([
            html.Div([html.H3("Compute by op class (modelled)"),
                      light_table("trace-stats-class", _pct(stats.by_class), words=words)],
                     className="half"),
            html.Div([html.H3("Top ops"),
                      light_table("trace-stats-top", _pct(stats.top_ops), words=words)],
                     className="half"),
        ], className="row"))
    if threads(entry):
        blocks.append(_idle_block(entry, lo, hi, words))
    return blocks


def _idle_block(entry: Entry, lo: float, hi: float, words: Naming) -> html.Div:
    """The GPU idle of the range by cause: what the launching thread was doing when each
    gap began (analysis.trace_threads.idle_by_cause)."""
    slices = entry.profile.table("host_slices")
    links = entry.get("launch_links", lambda: launch_links(slices, entry.profile.trace))
    causes = idle_by_cause(entry.profile.trace, links, slices, lo, hi)
    if causes.empty:
        return html.Div()
    return html.Div([
        html.H3(f"GPU idle by cause ({words.unit})"),
        html.P("Each gap's next kernel: launched late (the host was busy: what its launching "
               "thread was in when the GPU ran dry), or queued before the gap (the GPU "
               "waited on a dependency).", className="hint"),
        light_table("trace-stats-idle", _pct(causes), words=words)])
