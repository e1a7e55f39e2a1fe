"""Analysis functions on hand-made frames (expected values worked out by hand) and on
synthetic Reports."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from popviz import analysis
from popviz.analysis.advice import amp_for
from popviz.format.memory import ReportProfile
from tooling.testing.synthetic import synthetic_report


def _stages(busy: list[int], idle: list[int], ipus: list[int] | None = None) -> pd.DataFrame:
    n = len(busy)
    return pd.DataFrame({
        "stage": range(n), "ipu": ipus or list(range(n)),
        "forward_cycles": [b // 3 for b in busy], "backward_cycles": [b - b // 3 for b in busy],
        "recompute_cycles": 0, "exchange_cycles": 0, "idle_cycles": idle,
        "stash_bytes": 0, "peak_bytes": 0,
    })


def _tiles(rows: list[tuple[int, int, int, int]], cap: int = 1000) -> pd.DataFrame:
    """(ipu, tile, always_live, not_always_live_peak) with code=exchange=0."""
    frame = pd.DataFrame(rows, columns=["ipu", "tile", "always_live", "not_always_live_peak"])
    frame.insert(2, "capacity_bytes", cap)
    frame.insert(3, "total_bytes", frame["always_live"] + frame["not_always_live_peak"])
    frame["code"] = 0
    return frame


def test_find_bumps_matches_hand_computed_prominences() -> None:
    v = np.array([0, 1, 0, 5, 0, 2, 2, 0, 3, 1], dtype=float)
    idx, prom = analysis.find_bumps(v)
    # peak 5 has no higher point: base is the higher of the two global-side minima (0)
    # the plateau 2,2 counts once at its first index; 3's right base is the final 1
    assert idx.tolist() == [1, 3, 5, 8]
    assert prom.tolist() == [1.0, 5.0, 2.0, 2.0]
    idx, _ = analysis.find_bumps(v, min_prominence=2.5)
    assert idx.tolist() == [3]


def test_find_bumps_ignores_monotone_and_short_series() -> None:
    assert len(analysis.find_bumps(np.arange(10.0))[0]) == 0
    assert len(analysis.find_bumps(np.array([1.0, 2.0]))[0]) == 0


def test_bumps_and_peaks_on_a_liveness_curve() -> None:
    steps = np.arange(40)
    nal = np.where(steps == 10, 500, np.where(steps == 30, 300, 100))
    live = pd.DataFrame({"ipu": 0, "step": steps, "phase": "forward",
                         "always_live_bytes": 1000, "not_always_live_bytes": nal,
                         "label": [f"op{i}" for i in steps]})
    b = analysis.bumps(live)
    assert b["step"].tolist() == [10, 30]  # most prominent first
    assert b["prominence"].tolist() == [400, 200]
    assert b["total_bytes"].tolist() == [1500, 1300]
    peaks = analysis.liveness_peaks(live)
    assert peaks.loc[0, "peak_step"] == 10 and peaks.loc[0, "peak_bytes"] == 1500
    assert peaks.loc[0, "label"] == "op10"


def test_variables_live_at_a_step() -> None:
    v = pd.DataFrame({"ipu": [0, 0, 0, 1], "name": ["a", "b", "c", "d"],
                      "category": "activation", "bytes": [10, 30, 20, 99],
                      "first_step": [0, 5, 6, 0], "last_step": [4, 9, 6, 9]})
    live = analysis.variables_live_at(v, 0, 6)
    assert live["name"].tolist() == ["b", "c"]  # largest first, IPU1 excluded
    assert analysis.variables_live_at(v, 0, 20).empty


def test_stage_balance_bubble_fraction_and_bottleneck() -> None:
    stages = _stages(busy=[900, 600, 300], idle=[100, 400, 700])
    bal = analysis.stage_balance(stages)
    assert bal["bubble_fraction"].tolist() == pytest.approx([0.1, 0.4, 0.7])
    assert bal["relative_load"].tolist() == pytest.approx([1.5, 1.0, 0.5])
    assert analysis.imbalance(stages) == pytest.approx(1.5)
    b = analysis.bottleneck_stage(stages)
    assert (b["stage"], b["ipu"]) == (0, 0)


def test_ipu_balance_sums_stages_that_share_an_ipu() -> None:
    stages = _stages(busy=[300, 300, 600], idle=[0, 0, 0], ipus=[0, 0, 1])
    bal = analysis.ipu_balance(stages)
    assert bal["ipu"].tolist() == [0, 1]
    assert bal["busy_cycles"].tolist() == [600, 600]


def test_time_by_kind_from_the_trace() -> None:
    trace = pd.DataFrame({"ipu": [0, 0, 0, 1], "start": [0, 10, 15, 0], "end": [10, 15, 20, 20],
                          "kind": ["compute", "idle", "sync", "compute"]})
    t = analysis.time_by_kind(trace).set_index("ipu")
    assert t.loc[0, "compute"] == 10 and t.loc[0, "span"] == 20
    assert t.loc[0, "bubble_fraction"] == pytest.approx(0.5)
    assert t.loc[1, "bubble_fraction"] == 0


def test_memory_fit_fullest_and_totals() -> None:
    tm = _tiles([(0, 0, 100, 200), (0, 1, 600, 500), (1, 0, 50, 50), (1, 1, 900, 50)])
    fit = analysis.fit_summary(tm)
    assert fit["fits"] is False and fit["oom_tiles"] == 1 and fit["oom_by_ipu"] == {0: 1}
    assert fit["max_over_bytes"] == 100
    top = analysis.fullest_tiles(tm, n=2)
    assert list(zip(top["ipu"], top["tile"])) == [(0, 1), (1, 1)]
    assert top["largest_category"].tolist() == ["always_live", "always_live"]
    totals = analysis.ipu_totals(tm).set_index("ipu")
    assert totals.loc[0, "total_bytes"] == 1400 and totals.loc[0, "oom_tiles"] == 1
    assert totals.loc[1, "utilisation"] == pytest.approx(1050 / 2000)
    parts = analysis.tile_breakdown(tm, 0, 1).set_index("category")["bytes"]
    assert parts["always_live"] == 600 and parts["not_always_live_peak"] == 500
    with pytest.raises(ValueError, match="no tile 7"):
        analysis.tile_breakdown(tm, 0, 7)
    assert analysis.fit_summary(tm.iloc[0:0])["fits"] is None


def test_exchange_matrix_and_over_time() -> None:
    ex = pd.DataFrame({"src": [0, "host", 1, 0], "dst": [1, 0, "host", 1],
                       "bytes": [100, 10, 5, 50], "start": [0, 0, 90, 40],
                       "end": [10, 5, 100, 50], "kind": ["activation", "host_in", "host_out",
                                                         "activation"]}, dtype=object)
    ex["bytes"] = ex["bytes"].astype("int64")
    m = analysis.exchange_matrix(ex, num_ipus=3)
    assert list(m.index) == ["IPU0", "IPU1", "IPU2", "host"]
    assert m.loc["IPU0", "IPU1"] == 150 and m.loc["host", "IPU0"] == 10
    assert m.loc["IPU1", "host"] == 5 and int(m.to_numpy().sum()) == 165
    over = analysis.exchange_over_time(ex, bins=10)
    assert over["bytes"].sum() == 165
    assert over[over["kind"] == "host_out"]["bin_start"].tolist() == [90.0]


def test_query_table_filters_sorts_and_pages() -> None:
    ops = pd.DataFrame({"op": ["aten.conv", "aten.relu", "aten.conv_bw", "aten.mm"],
                        "cycles": [30, 5, 60, 20], "ipu": [0, 0, 1, 1]})
    rows, total = analysis.query_table(ops, "{op} contains conv", [], 0, 10)
    assert total == 2 and set(rows["op"]) == {"aten.conv", "aten.conv_bw"}
    rows, total = analysis.query_table(ops, "{cycles} > 10 && {ipu} = 1",
                                       [{"column_id": "cycles", "direction": "desc"}], 0, 10)
    assert rows["op"].tolist() == ["aten.conv_bw", "aten.mm"]
    rows, total = analysis.query_table(ops, "", [{"column_id": "cycles", "direction": "asc"}],
                                       1, 3)
    assert total == 4 and rows["cycles"].tolist() == [60]
    with pytest.raises(ValueError, match="no column 'nope'"):
        analysis.query_table(ops, "{nope} = 1")


def _meta(amp: dict, recomputation: bool = False, splits: list[str] | None = None,
          accumulation: int = 64) -> dict:
    return {"options": {"available_memory_proportion": amp, "recomputation": recomputation,
                        "splits": splits or ["b1", "b2"], "strategy": "pipelined",
                        "gradient_accumulation": accumulation}}


def test_amp_for_reads_every_form_of_the_option() -> None:
    meta = _meta({"all": 0.3, "IPU1": [0.2, 0.1]})
    assert amp_for(meta, 0) == 0.3 and amp_for(meta, 1) == 0.2
    assert amp_for({}, 0) == 0.6


def test_advice_for_an_oom_ipu_dominated_by_activations() -> None:
    stages = _stages(busy=[300, 300, 300], idle=[0, 0, 0])
    tm = _tiles([(0, 0, 100, 100), (1, 0, 100, 1000), (2, 0, 100, 100)])
    texts = [a.text for a in analysis.advise(_meta({"IPU1": 0.4}), stages, tm)]
    assert any("IPU1 does not fit" in t and "from 0.4 to about 0.2" in t for t in texts)
    assert any("Enable recomputation" in t for t in texts)
    # IPU2 is as empty as IPU0: the tie goes to the later IPU (move the split earlier)
    assert any("Move split 'b2' earlier" in t for t in texts)
    texts = [a.text for a in analysis.advise(_meta({"IPU1": 0.4}, recomputation=True),
                                             stages, tm)]
    assert not any("Enable recomputation" in t for t in texts)


def test_advice_for_a_bottleneck_stage_and_bubbles() -> None:
    stages = _stages(busy=[300, 900, 300], idle=[600, 0, 600])
    tm = _tiles([(0, 0, 400, 400), (1, 0, 400, 400), (2, 0, 400, 400)])
    advice = analysis.advise(_meta({}, accumulation=4), stages, tm)
    texts = [a.text for a in advice]
    # no ops table, so no split move (tests/test_pipeline_advice.py has those)
    assert any("Stage 1 on IPU1 is the bottleneck" in t and "compute-bound" in t
               for t in texts)
    assert any("raise gradient accumulation (now 4)" in t for t in texts)
    assert all(a.severity != "error" for a in advice)



def test_stages_back_on_an_earlier_ipu_are_balanced_per_ipu() -> None:
    # PopART BERT-Large: embeddings + 3 layers, 7, 7, 7 layers, the heads back on IPU0
    # (Mcycles a micro-batch): per IPU 6.09 / 12.15 / 12.15 / 12.16, mean 10.64, the
    # busiest 1.14x it (not 12.16 / 8.51 = 1.43x over the five stages)
    tm = _tiles([(i, 0, 100, 100) for i in range(4)])
    bert = _stages(busy=[5630, 12150, 12150, 12160, 460], idle=[0] * 5, ipus=[0, 1, 2, 3, 0])
    assert [a.topic for a in analysis.advise(_meta({"all": 0.6}), bert, tm)] == ["ok"]
    slow = _stages(busy=[200, 1000, 200, 200, 200], idle=[0] * 5, ipus=[0, 1, 2, 3, 0])
    (advice,) = [a for a in analysis.advise(_meta({"all": 0.6}), slow, tm)
                 if a.topic == "split"]
    # per IPU 400 / 1000 / 200 / 200: mean 450, IPU1 2.22x; no split plan is drawn
    assert advice.ipu == 1 and "IPU1 is the bottleneck: 2.22x" in advice.text
    assert "its stages [1] run in turn" in advice.text

def test_advice_when_all_is_well_or_amp_could_rise() -> None:
    stages = _stages(busy=[300, 300], idle=[10, 10])
    tm = _tiles([(0, 0, 100, 100), (1, 0, 100, 100)])
    assert [a.topic for a in analysis.advise(_meta({"all": 0.6}), stages, tm)] == ["ok"]
    raised = analysis.advise(_meta({"all": 0.2}), stages, tm)
    assert [a.ipu for a in raised if a.topic == "amp"] == [0, 1]
    # with the ops table: only where an op runs in extra passes can a higher AMP save cycles
    ops = pd.DataFrame({"ipu": [0, 0, 1, 1], "passes": [1, 1, 1, 3]})
    raised = analysis.advise(_meta({"all": 0.2}), stages, tm, ops=ops)
    amp = [a for a in raised if a.topic == "amp"]
    assert [a.ipu for a in amp] == [1] and "1 convolution / matmul op run" in amp[0].text
    ops["passes"] = 1
    assert [a.topic for a in analysis.advise(_meta({"all": 0.2}), stages, tm, ops=ops)] \
        == ["ok"]


def test_insights_on_synthetic_reports_are_deterministic() -> None:
    a = analysis.insights(ReportProfile(synthetic_report(oom_ipu=2, seed=1)))
    b = analysis.insights(ReportProfile(synthetic_report(oom_ipu=2, seed=1)))
    assert a["fit"]["fits"] is False and a["fit"]["oom_by_ipu"] == {2: 7}
    assert a["advice"][0].severity == "error" and a["advice"][0].ipu == 2
    assert a["bottleneck"] == b["bottleneck"]
    pd.testing.assert_frame_equal(a["fullest_tiles"], b["fullest_tiles"])
    assert [x.text for x in a["advice"]] == [x.text for x in b["advice"]]
    ok = analysis.insights(ReportProfile(synthetic_report(seed=1)))
    assert ok["fit"]["fits"] is True


def test_measured_other_cycles_count_as_busy() -> None:
    stages = _stages(busy=[300, 300], idle=[100, 100]).assign(other_cycles=[100, 0])
    bal = analysis.stage_balance(stages)
    assert bal["busy_cycles"].tolist() == [400, 300]
    assert analysis.bottleneck_stage(stages)["stage"] == 0


def test_query_table_text_cache_gives_the_same_rows() -> None:
    ops = pd.DataFrame({"op": ["aten.Conv", "aten.relu", "aten.conv_bw", "aten.mm"],
                        "cycles": [30, 5, 60, 20]})
    texts: dict = {}
    for _ in range(2):  # the second call reads the cached column
        rows, total = analysis.query_table(ops, "{op} contains conv && {cycles} > 10",
                                           texts=texts)
        assert rows["op"].tolist() == ["aten.Conv", "aten.conv_bw"] and total == 2
    assert list(texts) == ["op"] and texts["op"].tolist()[0] == "aten.conv"


def test_one_measured_device_gets_no_balance_verdict_but_its_idle_share() -> None:
    # two stages interleaved on rank 0, 93 % of the step idle, one stage 1.5x the other
    stages = _stages(busy=[40, 60], idle=[650, 650], ipus=[0, 0])
    meta = {"kind": "measured", "options": {}}
    advice = analysis.advise(meta, stages, _tiles([]), measured=True)
    texts = " ".join(a.text for a in advice)
    assert "balanced" not in texts and "bottleneck" not in texts
    idle = [a for a in advice if a.topic == "idle"]
    assert len(idle) == 1 and idle[0].severity == "warning"
    assert "Rank 0 is idle 93% of the step" in idle[0].text and "host-bound" in idle[0].text
    # a busy single device: an info line, still no claim about balance
    busy = analysis.advise(meta, _stages(busy=[900], idle=[100], ipus=[0]), _tiles([]),
                           measured=True)
    assert [a.topic for a in busy] == ["ok"] and "busy 90% of the step" in busy[0].text
    assert "balanced" not in busy[0].text


def test_stage_load_figure_judges_no_balance_on_one_device() -> None:
    from popviz import figures
    from popviz.vocab import MEASURED
    shared = figures.stage_load_figure(_stages(busy=[40, 90], idle=[650, 650], ipus=[0, 0]),
                                       naming=MEASURED)
    title = shared.layout.title.text
    assert "balanced" not in title and "bottleneck" not in title and "rank 0" in title
    assert "#c53a32" not in shared.data[0].marker.color
    two = figures.stage_load_figure(_stages(busy=[40, 90], idle=[650, 600]), naming=MEASURED)
    assert "bottleneck" in two.layout.title.text


def test_inference_bubbles_ask_for_device_iterations_not_accumulation() -> None:
    """An inference pipeline has no gradients to accumulate: its pipeline fills once per
    host call with device iterations x accumulation batches, so that is the knob named."""
    stages = _stages(busy=[300, 300, 300], idle=[600, 600, 600])
    tm = _tiles([(0, 0, 400, 400), (1, 0, 400, 400), (2, 0, 400, 400)])
    meta = _meta({}, accumulation=1)
    meta["options"].update(training=False, device_iterations=2)
    texts = [a.text for a in analysis.advise(meta, stages, tm)]
    (bubble,) = [t for t in texts if "pipeline bubbles" in t]
    assert "gradient accumulation" not in bubble
    assert "Raise device iterations (now 2) to at least 12" in bubble  # 4 x 3 stages
    meta["options"].update(device_iterations=12)
    assert not any("pipeline bubbles" in a.text for a in analysis.advise(meta, stages, tm))


def test_amp_to_fit_is_the_highest_step_that_saves_enough() -> None:
    """Largest temporary per tile at each AMP (KiB): 0.6 in force 200, 0.4 170, 0.3 140,
    0.2 110, 0.1 100. Over by 50 KiB: 0.3 is the highest step saving 50 or more; over by
    150 KiB: no step saves more than 100, so AMP alone cannot make it fit."""
    from popviz.analysis.amp import amp_to_fit

    kib = 1024
    steps = pd.DataFrame({"ipu": 1, "amp": [0.1, 0.2, 0.3, 0.4, 0.6],
                          "in_force": [False, False, False, False, True],
                          "temp_bytes": [100 * kib, 110 * kib, 140 * kib, 170 * kib,
                                         200 * kib]})
    assert amp_to_fit(steps, 1, 50 * kib) == (0.3, 100 * kib)
    assert amp_to_fit(steps, 1, 150 * kib) == (None, 100 * kib)
    assert amp_to_fit(steps, 0, 1) == (None, 0)  # nothing known of IPU0


def test_no_split_move_onto_a_neighbour_that_is_itself_over() -> None:
    stages = _stages(busy=[300, 300, 300], idle=[0, 0, 0])
    # (always-live, not-always-live peak) on a 1,000-byte tile: every IPU is over
    tm = _tiles([(0, 0, 100, 1000), (1, 0, 100, 1000), (2, 0, 100, 1200)])
    texts = [a.text for a in analysis.advise(_meta({"all": 0.4}), stages, tm)]
    assert not any("takes layers from IPU1" in t for t in texts)
    assert any(t.startswith("No neighbour of IPU1 has room") and "IPU0 110% used" in t
               and "IPU2 130% used" in t for t in texts)
    # with room on IPU2 the move is named again
    tm = _tiles([(0, 0, 100, 1000), (1, 0, 100, 1000), (2, 0, 100, 150)])
    texts = [a.text for a in analysis.advise(_meta({"all": 0.4}), stages, tm)]
    assert any("IPU2 (25% used) takes layers from IPU1" in t for t in texts)


def test_stage_figures_of_many_ranks_are_areas_with_their_figures_in_the_hover() -> None:
    """200 stages: each series one stepped area (stacked for the time), no text a bar, the
    idle share in the hover, the bottleneck a red point; 4 stages keep their bars."""
    from popviz import figures
    from popviz.figures.stages import LABELLED_BARS
    from popviz.vocab import MEASURED

    busy = [100] * 200
    busy[137] = 300  # the bottleneck
    many = _stages(busy=busy, idle=[50] * 200)
    many["peak_bytes"] = 2 << 20
    time = figures.ipu_time_figure(many, naming=MEASURED)
    parts = [t for t in time.data if t.showlegend is not False]
    assert parts and all(t.type == "scatter" and t.stackgroup == "time" for t in parts)
    assert not any(t.mode == "text" for t in time.data)
    assert "(%{customdata})" in parts[-1].hovertemplate and parts[-1].customdata[137] == \
        f"{50 / 350:.0%} idle"
    load = figures.stage_load_figure(many, naming=MEASURED)
    assert load.data[0].type == "scatter" and load.data[0].text is None
    red = [t for t in load.data if t.mode == "markers"]
    assert len(red) == 1 and red[0].x[0] == "stage 137 (rank 137)"
    stash = figures.stash_figure(many, naming=MEASURED)
    assert {t.type for t in stash.data} == {"scatter"}
    few = _stages(busy=[100, 300, 100, 100], idle=[50] * 4)
    assert len(few) <= LABELLED_BARS
    assert figures.stage_load_figure(few, naming=MEASURED).data[0].type == "bar"
    assert any(getattr(t, "mode", None) == "text"
               for t in figures.ipu_time_figure(few, naming=MEASURED).data)


def test_the_mean_line_strikes_no_load_label_and_its_name_sits_off_the_bars() -> None:
    """A bar at 1.06x had its label struck through by the mean line, and 'mean' sat on the
    line over the last bar: the line is drawn under the bars, its name right of the plot
    with a margin to hold it."""
    from popviz import figures
    from popviz.vocab import MEASURED

    fig = figures.stage_load_figure(_stages(busy=[106, 94], idle=[10, 10]), naming=MEASURED)
    line = [s for s in fig.layout.shapes if s.y0 == 1.0 and s.y1 == 1.0]
    assert len(line) == 1 and line[0].layer == "below"
    name = [a for a in fig.layout.annotations if a.text == "mean"]
    assert len(name) == 1 and name[0].x >= 1 and name[0].xanchor == "left"
    assert fig.layout.margin.r >= 40
