"""The trace below passes (ops laid out in modelled order), range statistics and the lane
figure, checked against sums taken straight from the profile's tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.analysis.range_stats import range_statistics
from popviz.analysis.trace_detail import op_events, pass_ops, readable_window
from popviz.figures.lod import TraceIndex
from popviz.figures.naming import MEASURED
from popviz.figures.trace import PIXELS
from popviz.figures.trace_lanes import (
    LANE_PIXELS,
    LANE_PX,
    OVERVIEW_BUCKETS,
    OVERVIEW_ROW_PX,
    WINDOW_BOX_MIN,
    trace_lanes_figure,
)
from popviz.figures.trace_outline import MARKER_COLUMNS
from tooling.testing.synthetic import synthetic_report

ROOT = Path(__file__).resolve().parents[1] / "profiles"
RECOMPUTE = ROOT / "rn50_recompute"
LONG = ROOT / "rn50_pipeline"
MEASURED_RUN = ROOT / "tutorial_measured_2ranks"


@pytest.fixture(scope="module")
def recompute() -> popviz.Profile:
    if not RECOMPUTE.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    return popviz.open(RECOMPUTE)


def test_ops_tile_each_pass_exactly_in_program_order(recompute: popviz.Profile) -> None:
    trace, ops = recompute.trace, recompute.ops
    events = op_events(trace, pass_ops(ops))
    compute = trace[trace["kind"] == "compute"]
    assert len(events) == sum(  # every op that takes time (zero-cycle ops take no room)
        int(((ops["stage"] == s) & (ops["pass"] == p) & (ops["cycles"] > 0)).sum())
        for s, p in zip(compute["stage"], compute["pass"], strict=True))
    for ev in compute.itertuples():
        mine = events[(events["ipu"] == ev.ipu) & (events["microbatch"] == ev.microbatch)
                      & (events["pass"] == ev._7)]
        assert mine["start"].min() == pytest.approx(ev.start)
        assert mine["end"].max() == pytest.approx(ev.end)
        # back to back, in the order of the program's steps
        assert np.allclose(mine["start"].to_numpy()[1:], mine["end"].to_numpy()[:-1])
        steps = ops.set_index("op_id").loc[mine["op_id"], "step"].to_numpy()
        assert (np.diff(steps) >= 0).all()
    # modelled cycles of a (stage, pass) sum to its pass, so each op lasts its own cycles
    first = events[(events["microbatch"] == 0) & (events["pass"] == "F")]
    cycles = ops.set_index("op_id").loc[first["op_id"], "cycles"].to_numpy(float)
    assert np.allclose(first["end"] - first["start"], cycles)


def test_range_statistics_match_plain_sums(recompute: popviz.Profile) -> None:
    trace, ops = recompute.trace, recompute.ops
    lo, hi = float(trace["start"].min()), float(trace["end"].max())
    stats = range_statistics(trace, pass_ops(ops), lo, hi)
    plain = (trace["end"] - trace["start"]).groupby(trace["kind"].astype(str)).sum()
    got = stats.by_kind.set_index("kind")["time"]
    assert got.to_dict() == pytest.approx(plain.to_dict())
    # every pass wholly inside: each op counted once per run of its pass
    runs = trace[trace["kind"] == "compute"].groupby(["stage", "pass"]).size()
    weight = ops.apply(lambda r: runs.get((r["stage"], r["pass"]), 0), axis=1)
    by_class = (ops["cycles"] * weight).groupby(ops["op_class"]).sum()
    got = stats.by_class.set_index("op_class")["time"]
    assert got.to_dict() == pytest.approx(by_class[by_class > 0].to_dict())
    assert stats.top_ops["time"].is_monotonic_decreasing


def test_range_statistics_clip_a_pass_cut_by_the_range(recompute: popviz.Profile) -> None:
    trace, ops = recompute.trace, recompute.ops
    fwd = trace[(trace["pass"] == "F") & (trace["microbatch"] == 0)].iloc[0]
    lo, hi = float(fwd["start"]), float(fwd["start"] + (fwd["end"] - fwd["start"]) / 3)
    stats = range_statistics(trace, pass_ops(ops), lo, hi)
    assert stats.by_kind.set_index("kind")["time"]["compute"] == pytest.approx(hi - lo)
    assert stats.by_class["time"].sum() == pytest.approx(hi - lo)
    brute = op_events(trace, pass_ops(ops), lo, hi)
    brute_time = brute["end"].clip(upper=hi) - brute["start"].clip(lower=lo)
    assert stats.top_ops["time"].iloc[0] == pytest.approx(brute_time.max())


def test_a_long_run_opens_on_ramp_up_and_a_few_steps() -> None:
    if not LONG.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    trace = popviz.open(LONG).trace
    lo, hi = readable_window(trace)
    inside = trace[(trace["start"] >= lo) & (trace["end"] <= hi)]
    ramp = trace[trace["schedule_phase"] == "ramp_up"]
    assert hi >= ramp["end"].max() and hi < trace["end"].max() / 50
    steady = inside[inside["schedule_phase"] == "main"]["superstep"].nunique()
    assert 3 <= steady <= 5
    assert readable_window(trace.head(100)) is None  # a short trace is shown whole


def test_zoomed_out_lanes_draw_the_buckets_the_title_and_docs_name(
        recompute: popviz.Profile) -> None:
    whole = trace_lanes_figure(TraceIndex(recompute.trace), templates=pass_ops(recompute.ops),
                               max_events=10)  # zoomed out: buckets
    assert whole.layout.meta["mode"] == "buckets"
    assert f"in {LANE_PIXELS} buckets per lane" in whole.layout.title.text
    strip = next(d for d in whole.data if d.name == "compute: forward")
    # each filled polygon: the bucket edges out and back, then a gap
    lanes = int(np.isnan(np.asarray(strip.x, dtype=float)).sum())
    assert len(strip.x) == lanes * (2 * 2 * LANE_PIXELS + 1)
    overview = next(d for d in whole.data if d.type == "heatmap")
    assert np.asarray(overview.z).shape[1] == OVERVIEW_BUCKETS
    docs = " ".join((Path(__file__).parents[1] / "docs" / "app.md").read_text().split())
    assert f"cut into {LANE_PIXELS} buckets" in docs  # issue 21: the docs said 600
    assert f"has {OVERVIEW_BUCKETS} buckets per device" in docs
    assert f"cuts each row into {PIXELS}" in docs


def test_lane_figure_draws_ops_with_true_durations(recompute: popviz.Profile) -> None:
    index, templates = TraceIndex(recompute.trace), pass_ops(recompute.ops)
    whole = trace_lanes_figure(index, templates=templates)
    assert whole.layout.meta["ops_drawn"] == 0 and whole.layout.meta["ops_hidden"] > 3000
    fwd = recompute.trace[recompute.trace["pass"] == "F"].iloc[0]
    zoom = trace_lanes_figure(index, fwd["start"], fwd["start"] + 200_000, templates=templates)
    meta = zoom.layout.meta
    assert meta["mode"] == "events" and meta["ops_drawn"] > 0
    assert "IPU0 ops" in meta["lanes"] and "IPU0 compute" in meta["lanes"]
    ops = [d for d in zoom.data if d.name.startswith("op: ")]
    assert sum(len(d.x) for d in ops) == meta["ops_drawn"]
    lo, hi = meta["range"]
    for bar in zoom.data:
        if bar.type != "bar" or bar.name == "modules":
            continue
        # customdata: the true start, end and duration; the bar: its part in [lo, hi]
        dur_col, end_col, start_col = (7, 6, 9) if bar.name.startswith("op: ") else (6, 4, 8)
        for base, width, custom in zip(bar.base, bar.x, bar.customdata, strict=True):
            assert custom[dur_col] == pytest.approx(custom[end_col] - custom[start_col])
            assert base == pytest.approx(max(custom[start_col], lo))
            assert base + width == pytest.approx(min(custom[end_col], hi))
            assert lo <= base <= base + width <= hi
        assert "duration %{customdata[" in bar.hovertemplate
        assert "%{x" not in bar.hovertemplate  # Plotly's x of an offset bar is its end
        assert "%{base" not in bar.hovertemplate  # the drawn part's start, not the bar's


def test_a_bar_cut_by_the_window_is_drawn_over_its_visible_part_with_its_label() -> None:
    """A pass, op or module bar that starts before the window is drawn from the window's
    left edge (Plotly centres its label on the bar drawn: on the whole bar the label sat
    off-screen), its hover still says its true start, end and duration, and its label
    stays where the visible part holds it."""
    with popviz.open(LONG) as profile:
        trace, templates = profile.trace, pass_ops(profile.ops)
        index = TraceIndex(trace)
    comp = trace[trace["kind"] == "compute"]
    bar = comp.loc[(comp["end"] - comp["start"]).idxmax()]  # the widest pass
    start, end = float(bar["start"]), float(bar["end"])
    lo = start + 0.4 * (end - start)  # the left edge cuts it; most of what is seen is it
    hi = end + 0.3 * (end - start)
    fig = trace_lanes_figure(index, lo, hi, templates=templates, module_levels=2)
    assert fig.layout.meta["range"] == [lo, hi] and fig.layout.meta["mode"] == "events"
    hit = []
    for trace_ in fig.data:
        if trace_.type != "bar" or not trace_.name.startswith("compute"):
            continue
        for j, custom in enumerate(trace_.customdata):
            if custom[0] == bar["op"] and int(custom[5]) == int(bar["ipu"]):
                hit.append((trace_, j, custom))
    assert len(hit) == 1
    drawn, j, custom = hit[0]
    assert drawn.base[j] == pytest.approx(lo)  # drawn from the window's left edge
    assert drawn.base[j] + drawn.x[j] == pytest.approx(end)
    assert (custom[8], custom[4], custom[6]) == pytest.approx((start, end, end - start))
    assert "%{customdata[8]:,.0f} → %{customdata[4]:,.0f}" in drawn.hovertemplate
    assert drawn.text[j] == bar["op"]  # 0.6 of it in 0.9 of the window: the label fits
    # ops and modules cut by the left edge likewise: drawn from lo, true times in customdata
    cut = 0
    for trace_ in fig.data:
        if trace_.type != "bar" or trace_.name in ("modules",) or \
                trace_.name.startswith("compute"):
            continue
        assert min(trace_.base) >= lo and max(np.add(trace_.base, trace_.x)) <= hi + 1e-6
        if trace_.name.startswith("op: "):
            first = np.asarray([c[9] for c in trace_.customdata], dtype=float)
            cut += int((first < lo).sum())
            np.testing.assert_allclose(np.maximum(first, lo), np.asarray(trace_.base, float))
    assert cut >= 1  # the window's left edge cuts an op too
    modules = [t for t in fig.data if t.name == "modules"]
    assert modules and min(modules[0].base) == pytest.approx(lo)


def test_highlighted_module_is_outlined(recompute: popviz.Profile) -> None:
    index, templates = TraceIndex(recompute.trace), pass_ops(recompute.ops)
    fwd = recompute.trace[recompute.trace["pass"] == "F"].iloc[0]
    fig = trace_lanes_figure(index, fwd["start"], fwd["end"], templates=templates,
                             highlight="layer1")
    lit = [d for d in fig.data if "(selected module)" in d.name]
    assert lit and all(m.startswith("layer1.") for d in lit for m in
                       (c[2] for c in d.customdata))


def test_the_whole_run_strip_gives_each_device_a_row_and_boxes_a_narrow_window() -> None:
    """Sixteen IPUs' rows in the whole-run strip are 14 px each (they shared 70 px: 4 px a
    row), and a window of 0.05% of the run is boxed at least WINDOW_BOX_MIN of it wide,
    around the window, inside the run."""
    trace = synthetic_report(num_ipus=16, events=2000, steps=20, num_ops=20,
                             seed=1).tables["trace"]
    first, last = float(trace["start"].min()), float(trace["end"].max())
    lo = first + 0.6 * (last - first)
    hi = lo + 0.0005 * (last - first)
    fig = trace_lanes_figure(TraceIndex(trace), lo, hi)
    lanes = len(fig.layout.meta["lanes"])
    strip = fig.layout.height - 140 - LANE_PX * lanes - 55
    assert strip == 16 * OVERVIEW_ROW_PX
    box = next(s for s in fig.layout.shapes if s.xref == "x2")
    assert box.x1 - box.x0 == pytest.approx(WINDOW_BOX_MIN * (last - first))
    assert box.x0 <= lo and box.x1 >= hi and first <= box.x0 and box.x1 <= last
    wide = trace_lanes_figure(TraceIndex(trace), first, first + 0.3 * (last - first))
    box = next(s for s in wide.layout.shapes if s.xref == "x2")
    assert (box.x0, box.x1) == (first, first + 0.3 * (last - first))  # as shown


def test_measured_trace_has_rank_lanes_and_no_op_level() -> None:
    if not MEASURED_RUN.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    p = popviz.open(MEASURED_RUN)
    # a measured run's ops carry measured times (an import's), which the app never lays
    # out as a modelled op level (it passes measured=True, from the profile's naming)
    assert "cycles" in p.ops.columns and pass_ops(p.ops) != {}
    assert pass_ops(p.ops, measured=True) == {}
    fig = trace_lanes_figure(TraceIndex(p.trace), naming=MEASURED, templates={})
    assert fig.layout.yaxis.ticktext[0] == "rank 0 · compute"
    assert not any(lane.endswith(" ops") for lane in fig.layout.meta["lanes"])
    assert fig.layout.xaxis.title.text == "time (ns)"


def test_pass_ops_empty_without_cycles() -> None:
    assert pass_ops(pd.DataFrame({"op": ["a"], "stage": [0], "pass": ["F"]})) == {}


def _outlined(fig: object) -> list:
    return [t for t in fig.data if "(selected op" in str(t.name or "")]  # type: ignore[attr-defined]


def test_an_op_of_zero_cycles_is_outlined_a_few_pixels_wide() -> None:
    """An op link (`&op=`) to an op of zero modelled cycles drew a box of zero width: no
    outline at all. Its outline is at least MIN_FRACTION of the window wide, about it."""
    from popviz.analysis.trace_detail import op_occurrences
    from popviz.figures.trace_outline import MIN_FRACTION

    with popviz.open(LONG) as p:
        ops, trace = p.ops, p.trace
    templates = pass_ops(ops)
    zero = int(ops.loc[(ops["cycles"] == 0) & (ops["pass"] == "F"), "op_id"].iloc[0])
    at = op_occurrences(trace, templates, zero)
    assert len(at) and (at["end"] == at["start"]).all()
    t = float(at["start"].iloc[0])
    lo, hi = t - 20_000, t + 20_000
    fig = trace_lanes_figure(TraceIndex(trace), lo, hi, templates=templates,
                             highlight_op=zero)
    assert fig.layout.meta["ops_drawn"] > 0  # the op level is drawn, the op's box too
    box = _outlined(fig)
    assert len(box) == 1 and box[0].type == "bar"
    assert float(box[0].x[0]) >= MIN_FRACTION * (hi - lo) * 0.999
    assert float(box[0].base[0]) < t < float(box[0].base[0]) + float(box[0].x[0])


def test_an_outlined_op_stays_marked_on_the_whole_run() -> None:
    """Zoomed out to the whole run (buckets, no op level), the linked op was no longer
    outlined: a marker stands in the op lane wherever it runs (one per pixel column)."""
    from popviz.analysis.trace_detail import op_occurrences

    with popviz.open(LONG) as p:
        ops, trace = p.ops, p.trace
    templates = pass_ops(ops)
    op = int(ops.loc[(ops["cycles"] > 0) & (ops["pass"] == "F"), "op_id"].iloc[0])
    fig = trace_lanes_figure(TraceIndex(trace), templates=templates, highlight_op=op)
    assert fig.layout.meta["mode"] == "buckets" and fig.layout.meta["ops_drawn"] == 0
    marks = _outlined(fig)
    assert len(marks) == 1 and marks[0].mode == "markers" and marks[0].showlegend  # named
    ops_rows = {r for r, lane in enumerate(fig.layout.meta["lanes"]) if lane.endswith(" ops")}
    assert set(marks[0].y) <= ops_rows and 0 < len(marks[0].x) <= MARKER_COLUMNS
    places = op_occurrences(trace, templates, op)
    assert sum(marks[0].customdata) == len(places)  # every place counted in a marker
    centres = set(((places["start"] + places["end"]) / 2).round(3))
    assert {round(float(x), 3) for x in marks[0].x} <= centres  # each marker on a place
