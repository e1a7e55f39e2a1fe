"""A double-click on /trace resets to exactly the whole run: Plotly pads a bar chart's
autorange by 5%, and once a user has autoranged, the figure's uirevision keeps that padded
autorange over the server's redraw of the same window (a double-click on a figure already
showing the whole run widened it past the run). Each trace figure pins its autorange to
the run's first start and last end, whatever window it draws (tests/browser/
test_trace_window_browser.py double-clicks it in Chromium)."""

from __future__ import annotations

from typing import Any

import pytest
from popviz_app import create_app

from popviz.analysis.trace_detail import pass_ops
from popviz.analysis.trace_threads import launch_links
from popviz.figures import trace_figure
from popviz.figures.lod import TraceIndex
from popviz.figures.trace_lanes import trace_lanes_figure
from popviz.figures.trace_threads import thread_lanes_figure
from popviz.vocab import MEASURED
from tests.bundled_fixtures import MEASURED_REL, MODELLED_REL, ROOT


def _reset(fig: Any) -> tuple[float, float]:
    """The range a double-click (an autorange of the main x axis) gives."""
    opts = fig.layout.xaxis.autorangeoptions
    return opts.minallowed, opts.maxallowed




def test_lanes_reset_to_the_whole_run(modelled: Any) -> None:
    index = TraceIndex(modelled.trace)
    run = (index.start, index.end)
    templates = pass_ops(modelled.ops)
    mid = (index.start + index.end) / 2
    for lo, hi in ((None, None), (mid, mid + (index.end - index.start) / 50)):
        for flat in (False, True):
            fig = trace_lanes_figure(index, lo, hi, templates=templates, flat=flat)
            assert _reset(fig) == run
            # the strip of the whole run below keeps its own fixed range
            assert fig.layout.xaxis2.autorangeoptions.minallowed is None
    fig = trace_figure(modelled.trace, mid, mid + 1_000)
    assert _reset(fig) == run and list(fig.layout.xaxis.range) == [mid, mid + 1_000]


def test_thread_lanes_reset_to_the_whole_run(measured: Any) -> None:
    """A measured run drawn as Perfetto draws it: the run starts at its first recorded
    step (a host slice at 0), before its first device event."""
    slices, trace = measured.table("host_slices"), measured.trace
    links = launch_links(slices, trace)
    run = (float(min(slices["start"].min(), trace["start"].min())),
           float(max(slices["end"].max(), trace["end"].max())))
    assert run[0] < float(trace["start"].min())
    for window in ((None, None), (run[1] / 2, run[1] / 2 + 50_000)):
        for ranks in (None, [1]):  # one rank's lanes: still the run's span
            fig = thread_lanes_figure(slices, trace, links, *window, naming=MEASURED,
                                      ranks=ranks)
            assert _reset(fig) == run


@pytest.mark.parametrize("rel", [MODELLED_REL, MEASURED_REL])
def test_the_double_click_redraw_shows_what_the_reset_shows(rel: str) -> None:
    """The server's redraw for the double-click (an autorange) is the whole run, its
    range the one the browser's autorange takes."""
    cb = create_app(ROOT, vetter=False).popviz_callbacks
    fig, _status, window, *_ = cb["trace.zoom"]({"xaxis.autorange": True}, f"?profile={rel}")
    assert tuple(fig.layout.xaxis.range) == _reset(fig) == tuple(window["range"])
