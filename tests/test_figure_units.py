"""Units, colours and layout the analyser promises: exchange never in the red of capacity
/ OOM / bottleneck, heat-map cells in the colour bar's unit, bin widths named, histograms
side by side, tile-map axes in words, the capacity tick visible over an OOM bar."""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz import analysis, figures
from popviz.figures.style import CAPACITY_COLOUR, CATEGORY_COLOURS, MEMORY_COLOURS, OOM_COLOUR
from popviz.format.memory import ReportProfile
from tooling.testing.synthetic import synthetic_report

PROFILE = ReportProfile(synthetic_report(oom_ipu=1, model="units"))


def test_exchange_is_not_the_red_of_capacity_oom_or_bottleneck() -> None:
    reds = {CAPACITY_COLOUR, OOM_COLOUR, "#c53a32"}
    assert CATEGORY_COLOURS["exchange"] not in reds
    assert MEMORY_COLOURS["exchange"] not in reds


def test_exchange_cells_in_the_colour_bar_unit() -> None:
    ex = pd.DataFrame({"src": [0, 1], "dst": [1, 0], "bytes": [3 * 2**30, 5 * 2**20],
                       "start": [0, 0], "end": [1, 1], "kind": ["activation"] * 2})
    fig = figures.exchange_matrix_figure(analysis.exchange_matrix(ex, 2))
    heat = fig.data[0]
    unit = heat.colorbar.title.text
    assert unit == "MiB" and unit in fig.layout.title.text
    cells = {t for row in heat.text for t in row if t}
    assert cells == {"3,072.0", "5.0"}  # the 3 GiB cell says 3,072 on a MiB bar


def test_exchange_bins_named_and_histograms_side_by_side() -> None:
    over = figures.exchange_time_figure(analysis.exchange_over_time(PROFILE.exchange, bins=40))
    assert "bins of" in over.layout.title.text
    hist = figures.memory_histogram(PROFILE.tile_memory)
    assert hist.layout.barmode == "group" and "bins of" in hist.layout.xaxis.title.text


def test_tile_map_axes_in_words() -> None:
    fig = figures.tile_map_figure(PROFILE.tile_memory, 0)
    assert "div" not in fig.layout.yaxis.title.text and "mod" not in fig.layout.xaxis.title.text
    assert int(fig.layout.yaxis.ticktext[1]) % 64 == 0


def test_capacity_tick_drawn_over_an_oom_bar() -> None:
    totals = analysis.ipu_totals(PROFILE.tile_memory)
    fig = figures.ipu_totals_figure(totals)
    ticks = [d for d in fig.data if d.type == "scatter" and d.mode == "markers"]
    assert len(ticks) == 2 and ticks[0].marker.color == "#111"
    assert np.allclose(ticks[0].y, totals["capacity_bytes"] / 2**20)
    # drawn after every bar, so on top of an out-of-memory one
    order = [d.type for d in fig.data]
    assert max(i for i, t in enumerate(order) if t == "bar") < order.index("scatter")
