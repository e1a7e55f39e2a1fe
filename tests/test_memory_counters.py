"""/memory of a run imported without a memory snapshot: the allocated bytes its trace's
memory events give, per rank over time, each rank's peak kept and starred."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

import popviz
from popviz.figures.memory_counters import MAX_POINTS, allocated_over_time
from popviz.metrics import peak_liveness
from popviz.vocab import MEASURED

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def test_each_ranks_peak_is_the_liveness_peak() -> None:
    with popviz.open(PROFILES / "tutorial_measured_2ranks") as p:
        live = p.liveness
    fig = allocated_over_time(live, MEASURED)
    want = {int(k): float(v) for k, v in peak_liveness(live).items()}
    assert fig.layout.meta["peaks"] == want
    stars = [t for t in fig.data if t.name.endswith("peak")]
    assert sorted(round(float(t.y[0]) * 2**20) for t in stars) == sorted(
        round(v) for v in want.values())


def test_a_long_run_keeps_its_peak_in_few_points() -> None:
    n = 200_000
    rng = np.random.default_rng(1)
    y = rng.integers(0, 1000, n)
    y[123_457] = 10**6  # one short spike
    live = pd.DataFrame({"ipu": 0, "time": np.arange(n) * 10, "always_live_bytes": 0,
                         "not_always_live_bytes": y})
    fig = allocated_over_time(live, MEASURED)
    line = fig.data[0]
    assert len(line.x) <= MAX_POINTS
    assert float(np.max(line.y)) * 2**20 == 10**6  # the spike survives the thinning


def test_a_job_of_many_ranks_draws_the_fullest_and_a_band_of_all() -> None:
    """40 ranks: the 16 with the highest peak as lines, and one band holding every rank's
    curve (its top is the job's peak, its bottom the least any rank held)."""
    from popviz.figures.memory_counters import MAX_LINES

    rng = np.random.default_rng(7)
    frames = []
    for rank in range(40):
        t = np.sort(rng.integers(0, 10_000, 300)) + rank  # each rank its own event times
        y = rng.integers(0, 1000, 300) + 10 * rank
        y[rank * 5] = 5000 + (rank * 37) % 40 * 100  # peaks in a shuffled order
        frames.append(pd.DataFrame({"ipu": rank, "time": t, "always_live_bytes": 100,
                                    "not_always_live_bytes": y}))
    live = pd.concat(frames, ignore_index=True)
    fig = allocated_over_time(live, MEASURED)
    peaks = peak_liveness(live)
    fullest = set(peaks.sort_values(ascending=False).index[:MAX_LINES].astype(int))
    lines = [t for t in fig.data if t.legendgroup not in (None, "band")
             and not t.name.endswith("peak")]
    assert {int(t.name.split()[-1]) for t in lines} == fullest
    assert set(fig.layout.meta["peaks"]) == fullest
    band = [t for t in fig.data if t.legendgroup == "band"]
    assert len(band) == 2 and "40" in band[1].name
    low, high = (np.asarray(t.y, dtype=float) * 2**20 for t in band)
    assert high.max() == float(peaks.max())
    assert (low <= high).all()
    # before its first event a rank's trace says nothing, and the band leaves it out
    assert low.min() == float(live.groupby("ipu")["not_always_live_bytes"].min().min() + 100)
    # the band holds each rank's value wherever the rank has one: a bucket's top is at
    # least the value any rank holds at the bucket's middle
    mids = np.asarray(band[1].x, dtype=float)
    for rank in (0, 17, 39):
        rows = live[live["ipu"] == rank]
        t = rows["time"].to_numpy(float)
        y = (rows["always_live_bytes"] + rows["not_always_live_bytes"]).to_numpy(float)
        at = np.searchsorted(t, mids, side="right") - 1
        known = at >= 0
        held = y[at[known]]
        assert (high[known] >= held - 1e-6).all() and (low[known] <= held + 1e-6).all()
    assert "16 of 40" in fig.layout.title.text


def test_the_plot_looks_like_the_other_pages() -> None:
    """A white plot as the other pages draw (base_layout), not Plotly's default grey."""
    with popviz.open(PROFILES / "tutorial_measured_2ranks") as p:
        live = p.liveness
    fig = allocated_over_time(live, MEASURED)
    assert fig.layout.template.layout.plot_bgcolor == "white"
    assert fig.layout.title.text.startswith("Allocated memory per rank")
