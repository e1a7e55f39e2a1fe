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
