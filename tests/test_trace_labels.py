"""Labels inside trace bars only where they can fit (figures.trace.drop_unfitting_labels):
Plotly lays out every label before uniformtext hides the ones that do not fit, which cost
the bundled pipeline's /trace about half a second in Chromium."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go

import popviz
from popviz.analysis.trace_detail import pass_ops, readable_window
from popviz.figures.lod import TraceIndex
from popviz.figures.trace import LABEL_CHAR_PX, LABEL_PLOT_PX, drop_unfitting_labels
from popviz.figures.trace_lanes import trace_lanes_figure

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def test_a_label_stays_where_its_bar_holds_it_in_the_window() -> None:
    # window 0..1800 at LABEL_PLOT_PX px: 1 time unit = 1 px
    bars = go.Bar(orientation="h", y=[0, 0, 0, 0], base=[0, 100, 1790, -500],
                  x=[60, 10, 100, 530], text=["conv", "conv", "conv", "relu"])
    scatter = go.Scatter(x=[0, 1], y=[0, 1], text=["a", "b"])
    drop_unfitting_labels([bars, scatter], 0, LABEL_PLOT_PX)
    need = 4 * LABEL_CHAR_PX + 4  # 22 px
    # 60 px wide: fits; 10 px: no; 100 px of which 10 inside the window: no; 530 px of
    # which 30 inside: fits
    assert list(bars.text) == ["conv", "", "", "relu"] and 30 >= need > 10
    assert list(scatter.text) == ["a", "b"]  # not a bar: untouched


def test_the_bundled_pipeline_keeps_the_labels_that_fit_and_no_others() -> None:
    """At the window /trace opens on, with its op lanes: a label on a bar only where the
    bar is wide enough for it, and both kinds present."""
    with popviz.open(PROFILES / "rn50_pipeline") as profile:
        index = TraceIndex(profile.trace)
        window = readable_window(profile.trace)
        assert window is not None
        lo, hi = window
        fig = trace_lanes_figure(index, lo, hi, templates=pass_ops(profile.ops),
                                 module_levels=2)
    assert fig.layout.meta["mode"] == "events" and fig.layout.meta["ops_drawn"] > 0
    kept = dropped = 0
    for bar in fig.data:
        if not isinstance(bar, go.Bar) or bar.text is None:
            continue
        start = np.asarray(bar.base, float)
        px = (np.clip(start + np.asarray(bar.x, float), lo, hi) - np.clip(start, lo, hi)) \
            / (hi - lo) * LABEL_PLOT_PX
        for text, width in zip(bar.text, px, strict=True):
            if text:
                kept += 1
                assert width >= len(text) * LABEL_CHAR_PX + 4
            else:
                dropped += 1
    assert kept > 0 and dropped > 0
