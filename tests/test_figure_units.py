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


def test_a_transfer_too_small_for_the_unit_is_not_shown_as_none() -> None:
    """8 KiB beside 1 GiB on a MiB bar: "<0.1", not a 0.0 that reads as no transfer (as
    resnext101_inference_mk1's IPU0 -> host cell read)."""
    ex = pd.DataFrame({"src": [0, 1], "dst": [1, 0], "bytes": [2**30, 8 * 2**10],
                       "start": [0, 0], "end": [1, 1], "kind": ["activation"] * 2})
    heat = figures.exchange_matrix_figure(analysis.exchange_matrix(ex, 2)).data[0]
    assert {t for row in heat.text for t in row if t} == {"1,024.0", "<0.1"}


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


def test_exchange_time_axis_starts_at_zero_not_below() -> None:
    """Two transfers far apart (resnext101_inference_mk1: a host_in at the start, a
    host_out at the end): Plotly padded the axis by half the gap between the two bars,
    from about -1.7M cycles. The axis is the bins' span, from 0."""
    ex = pd.DataFrame({"src": ["host", 0], "dst": [0, "host"], "bytes": [1_204_224, 8_000],
                       "start": [600, 3_512_155], "end": [64_012, 3_515_755],
                       "kind": ["host_in", "host_out"]})
    over = analysis.exchange_over_time(ex)
    fig = figures.exchange_time_figure(over)
    assert list(fig.layout.xaxis.range) == [0.0, 3_515_755.0]
    # every bar inside it
    for bar in fig.data:
        assert min(np.asarray(bar.x) - np.asarray(bar.width) / 2) >= 0.0
        assert max(np.asarray(bar.x) + np.asarray(bar.width) / 2) <= 3_515_755.0
    # a clock that does not count from the profile's start keeps the bins' own start
    late = figures.exchange_time_figure(analysis.exchange_over_time(
        ex.assign(start=ex["start"] + 10**12, end=ex["end"] + 10**12)))
    assert late.layout.xaxis.range[0] == 10**12 + 600


def test_an_exchange_matrix_of_equal_cells_is_coloured_from_zero() -> None:
    """Two stages exchanging 20 MiB each way: Plotly's own range for equal cells runs
    19.5 to 20.5 (a bar that says nothing); the bar starts at none."""
    import pandas as pd

    from popviz.figures.exchange import exchange_matrix_figure, stage_links_figure

    both = 20 * 2**20
    matrix = pd.DataFrame([[0, both], [both, 0]], index=["0", "1"], columns=["0", "1"])
    fig = exchange_matrix_figure(matrix)
    assert fig.data[0].zmin == 0 and fig.data[0].zmax == 20  # MiB; both, or Plotly's own
    links = pd.DataFrame({"src_stage": [0, 1], "dst_stage": [1, 0], "bytes": [both, both],
                          "transfers": [1, 1], "kind": ["p2p", "p2p"],
                          "transfer_ns": [1e6, 1e6], "receiver_wait_ns": [0.0, 0.0],
                          "sender_wait_ns": [0.0, 0.0]})
    heat = stage_links_figure(links).data[0]
    assert heat.zmin == 0 and heat.zmax == 20
