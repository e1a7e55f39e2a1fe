"""Figure builders and level-of-detail helpers: the data drawn, not just 'no exception'."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from popviz import analysis, figures
from popviz.figures.lod import (
    CATEGORIES,
    StepPyramid,
    TraceIndex,
    maxpool2d,
    minmax_indices,
    share_of_row,
)
from popviz.figures.style import MiB
from popviz.format.memory import ReportProfile
from tooling.testing.synthetic import synthetic_report


@pytest.fixture(scope="module")
def profile() -> ReportProfile:
    return ReportProfile(synthetic_report(oom_ipu=1, events=6000, steps=600))


def _random_trace(seed: int = 0, n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for ipu in range(2):
        t = 0
        for _ in range(n):
            gap, dur = rng.integers(0, 5), rng.integers(1, 50)
            kind = rng.choice(["compute", "exchange", "sync", "idle"])
            rows.append((ipu, t + gap, t + gap + dur, kind, rng.choice(["F", "B"])))
            t += gap + dur
    return pd.DataFrame(rows, columns=["ipu", "start", "end", "kind", "pass"]).assign(
        stage=0, microbatch=0, op="x")


def test_minmax_keeps_a_one_sample_spike() -> None:
    y = np.zeros(100_000)
    y[54_321] = 7.0
    y[1_234] = -3.0
    keep = minmax_indices(y, 500)
    assert len(keep) <= 2 * 500 + 2
    assert 54_321 in keep and 1_234 in keep
    assert np.all(np.diff(keep) > 0)
    assert len(minmax_indices(np.arange(10.0), 500)) == 10


def test_maxpool_keeps_the_hottest_cell() -> None:
    a = np.zeros((1000, 1472), dtype=np.uint32)
    a[777, 1001] = 99
    pooled, kr, kc = maxpool2d(a, 100, 368)
    assert pooled.shape == (100, 368) and (kr, kc) == (10, 4)
    assert pooled.max() == 99 and pooled[77, 250] == 99


def test_occupancy_matches_brute_force() -> None:
    trace = _random_trace()
    index = TraceIndex(trace)
    edges = np.linspace(index.start, index.end, 37)
    occ = index.occupancy(1, edges)
    lane = trace[trace["ipu"] == 1]
    codes = {"compute": None, "exchange": "exchange", "sync": "sync", "idle": "idle"}
    for b in range(len(edges) - 1):
        lo, hi = edges[b], edges[b + 1]
        overlap = (np.minimum(lane["end"], hi) - np.maximum(lane["start"], lo)).clip(lower=0)
        for kind, name in codes.items():
            sel = lane["kind"] == kind
            if name is None:  # compute splits by pass
                for p in ("F", "B"):
                    want = overlap[sel & (lane["pass"] == p)].sum()
                    assert occ[CATEGORIES.index(p), b] == pytest.approx(want)
            else:
                assert occ[CATEGORIES.index(name), b] == pytest.approx(overlap[sel].sum())
    assert index.count_visible(edges[3], edges[5]) == int(
        ((trace["end"] > edges[3]) & (trace["start"] < edges[5])).sum())


def test_row_shares_keep_a_short_exchange_visible() -> None:
    occ = np.zeros((len(CATEGORIES), 3))
    occ[CATEGORIES.index("B"), 0] = 99.5
    occ[CATEGORIES.index("exchange"), 0] = 0.5
    occ[CATEGORIES.index("F"), 1] = 30
    occ[CATEGORIES.index("idle"), 1] = 70
    frac = share_of_row(occ, np.array([0.0, 100.0, 200.0, 300.0]))
    assert frac[:, 0].sum() == pytest.approx(1.0)
    assert frac[CATEGORIES.index("exchange"), 0] == pytest.approx(0.04 / (0.995 + 0.04))
    assert frac[CATEGORIES.index("F"), 1] == pytest.approx(0.3)
    assert frac[:, 2].sum() == 0  # nothing recorded there: drawn empty, not as idle


def test_trace_figure_levels_of_detail(profile: ReportProfile) -> None:
    trace = profile.trace
    full = figures.trace_figure(trace, max_events=1000)
    assert full.layout.meta["mode"] == "buckets"
    assert full.layout.meta["visible_events"] == len(trace)
    assert {d.name for d in full.data} >= {"compute: forward", "compute: backward", "idle"}
    lo, hi = 0, float(trace["end"].max()) / 200
    zoom = figures.trace_figure(trace, lo, hi, max_events=1000)
    visible = trace[(trace["end"] > lo) & (trace["start"] < hi)]
    assert zoom.layout.meta["mode"] == "events"
    assert sum(len(d.x) for d in zoom.data) == len(visible)
    assert list(zoom.layout.xaxis.range) == [lo, hi]
    assert list(zoom.layout.yaxis.ticktext) == ["IPU0", "IPU1", "IPU2", "IPU3"]
    # overview: one filled strip per category per IPU, whatever the number of events
    strips = {d.name: d for d in full.data}
    assert all(d.fill == "toself" for d in full.data)
    fwd = strips["compute: forward"]
    assert np.nanmin(fwd.y) >= -0.5 and np.nanmax(fwd.y) <= 3.5


def test_liveness_figure_keeps_the_peak_and_marks_bumps(profile: ReportProfile) -> None:
    live = profile.liveness
    bumps = analysis.bumps(live)
    cap = 1472 * 624 * 1024
    fig = figures.liveness_figure(live, bumps, cap, pixels=50)
    assert all(n <= 2 * 50 + 2 for n in fig.layout.meta["points"].values())
    totals = [d for d in fig.data if d.name == "always-live + not-always-live"]
    assert len(totals) == 4
    true_peak = (live.always_live_bytes + live.not_always_live_bytes).groupby(live.ipu).max()
    for ipu, d in enumerate(totals):
        assert max(d.y) == pytest.approx(true_peak[ipu] / MiB)
    markers = [d for d in fig.data if d.name == "bump"]
    assert sum(len(d.x) for d in markers) == len(bumps)
    assert [s.y0 for s in fig.layout.shapes] == [pytest.approx(cap / MiB)] * 4


def test_memory_figures_show_every_tile_and_the_oom_ones(profile: ReportProfile) -> None:
    tm = profile.tile_memory
    fig = figures.tile_memory_figure(tm, 1)
    areas = [d for d in fig.data if d.stackgroup == "tiles"]
    assert len(areas) == 4 and all(len(a.x) == 1472 for a in areas)
    on_tile = tm[(tm.ipu == 1) & (tm.tile == 740)].iloc[0]
    assert sum(a.y[740] for a in areas) == pytest.approx(on_tile.total_bytes / 1024)
    oom = next(d for d in fig.data if d.name.startswith("out of memory"))
    assert len(oom.x) == 7 and "7 tiles" in oom.name
    tmap = figures.tile_map_figure(tm, 1)
    z = np.array(tmap.data[0].z, dtype=float)
    assert z.shape == (23, 64) and np.isfinite(z).sum() == 1472
    assert len(tmap.data[1].x) == 7
    totals = figures.ipu_totals_figure(analysis.ipu_totals(tm))
    code = next(d for d in totals.data if d.name == "code")
    assert list(code.y) == pytest.approx(list(tm.groupby("ipu")["code"].sum() / MiB))


def test_stage_and_exchange_figures(profile: ReportProfile) -> None:
    fig = figures.ipu_time_figure(profile.stages)
    fwd = next(d for d in fig.data if d.name == "forward")
    assert list(fwd.y) == profile.stages.sort_values("ipu")["forward_cycles"].tolist()
    load = figures.stage_load_figure(profile.stages)
    assert load.data[0].marker.color[0] == "#c53a32"  # stage 0 is the heaviest here
    m = analysis.exchange_matrix(profile.exchange)
    mat = figures.exchange_matrix_figure(m)
    assert np.array(mat.data[0].z) == pytest.approx(m.to_numpy() / MiB)
    assert figures.amp_figure(profile.stages, profile.meta).data[0].y == (0.6, 0.3, 0.6, 0.6)


def test_empty_inputs_explain_themselves() -> None:
    for fig in (figures.trace_figure(pd.DataFrame(columns=["ipu", "start", "end", "kind"])),
                figures.exchange_matrix_figure(pd.DataFrame()),
                figures.tile_liveness_figure(np.zeros((0, 0)))):
        assert len(fig.data) == 0 and fig.layout.annotations[0].text


def test_step_pyramid_overview_and_narrow_views() -> None:
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 100, size=(10_000, 64)).astype(np.uint32)
    arr[7_777, 5] = 1000
    reads: list[tuple[int, int]] = []

    def read(a: int, b: int) -> np.ndarray:
        reads.append((a, b))
        return arr[a:b]

    pyr = StepPyramid(read, 10_000, rows=1000, raw_rows=500)
    reads.clear()
    coarse, first, stride = pyr.view(0, 10_000)
    assert stride == 10 and coarse.shape == (1000, 64) and coarse.max() == 1000
    assert reads == []  # the overview never rereads the array
    raw, first, stride = pyr.view(7_700, 7_900)
    assert stride == 1 and first == 7_700 and raw[77, 5] == 1000


def test_layers_import_only_to_their_left() -> None:
    """analysis never pulls in Plotly or Dash; figures never pulls in Dash (notebooks)."""
    import subprocess
    import sys

    code = ("import sys, popviz.analysis; bad = {'plotly', 'dash'} & set(sys.modules); "
            "assert not bad, bad; import popviz.figures; "
            "assert 'dash' not in sys.modules, 'figures imported dash'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_liveness_point_knows_its_ipu(profile: ReportProfile) -> None:
    """The click callback reads the IPU from customdata[3], on curves and bumps alike."""
    fig = figures.liveness_figure(profile.liveness, analysis.bumps(profile.liveness))
    for trace in fig.data:
        if trace.x is None or trace.x[0] is None:
            continue  # the capacity legend entry
        panel = int(trace.xaxis[1:] or 1) - 1  # x, x2, ... -> IPU0, IPU1, ...
        assert {int(c[3]) for c in trace.customdata} == {panel}, trace.name


def test_tile_capacity_label_goes_on_the_emptier_end() -> None:
    """Issue 31: over-full tiles drew their curve across the "tile capacity" label (top
    left). The label goes to the end whose tiles are emptier, on a white ground, and the
    axis leaves room above the fuller of the line and the curve."""
    cap = 1000
    for full_left in (True, False):
        used = np.linspace(1200, 300, 100) if full_left else np.linspace(300, 1200, 100)
        tm = pd.DataFrame({"ipu": 0, "tile": np.arange(100), "capacity_bytes": cap * 1024,
                           "total_bytes": used * 1024, "code": 0.0,
                           "not_always_live_peak": used * 1024})
        fig = figures.tile_memory_figure(tm, 0)
        (note,) = [a for a in fig.layout.annotations if "tile capacity" in a.text]
        assert note.xanchor == ("right" if full_left else "left") or \
            note.x == (1 if full_left else 0)
        assert note.bgcolor is not None
        assert fig.layout.yaxis.range[1] >= 1200 * 1.1
