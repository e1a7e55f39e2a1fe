"""The metrics core (popviz.metrics): hand-worked cases, and every committed profile's stored
figures equal to what the core computes from its tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz import metrics

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted((ROOT / "profiles").rglob("profile.h5"))


def _trace(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["ipu", "stage", "start", "end", "kind", "pass"])


def test_the_committed_profiles_are_there() -> None:
    # a missing folder must fail here, not turn the parametrised test below into no test
    assert len(PROFILES) == 9, PROFILES  # 5 single, 2 x (training, inference)


def test_stage_time_counts_each_instant_of_a_device_once() -> None:
    # IPU0: forward 0-10, an async send 6-14 under it (4 of its 8 ns are under compute),
    # idle 14-20; IPU1 (stage 1): sync 0-5, backward 5-20. Worked by hand.
    tr = _trace([(0, 0, 0, 10, "compute", "F"), (0, 0, 6, 14, "exchange", ""),
                 (0, 0, 14, 20, "idle", ""), (1, 1, 0, 5, "sync", ""),
                 (1, 1, 5, 20, "compute", "B")])
    st = metrics.stage_columns(metrics.stage_time(tr, 2))
    assert st.loc[0, ["forward_cycles", "exchange_cycles", "idle_cycles"]].tolist() == \
        [10.0, 4.0, 6.0]
    assert st.loc[1, ["backward_cycles", "idle_cycles", "sync_cycles"]].tolist() == \
        [15.0, 5.0, 5.0]
    # idle over rank-time: (6 + 5) / (2 x 20)
    assert metrics.idle_fraction(tr) == pytest.approx(11 / 40)
    # a third IPU of the target with no events adds 20 of rank-time and no idle
    assert metrics.idle_fraction(tr, num_devices=3) == pytest.approx(11 / 60)
    assert metrics.step_time(tr) == 20.0
    assert metrics.stage_idle_fraction(st.assign(stage=[0, 1])) == pytest.approx(11 / 40)


def test_stage_table_times_other_is_the_rest_of_the_step() -> None:
    # rank 0 holds stages 0 and 2: forward 0-10 (stage 0), compute with no pass 12-16
    # (stage 2), an exchange 14-18 half under it (stage 2), nothing 18-30. Rank 1:
    # idle 0-20, backward 20-30 (stage 1). Step window 0-30, shared. Worked by hand.
    tr = _trace([(0, 0, 0, 10, "compute", "F"), (0, 2, 12, 16, "compute", ""),
                 (0, 2, 14, 18, "exchange", ""), (1, 1, 0, 20, "idle", ""),
                 (1, 1, 20, 30, "compute", "B")])
    pairs = pd.DataFrame({"stage": [0, 1, 2], "ipu": [0, 1, 0]}, index=[7, 8, 9])
    t = metrics.stage_table_times(tr, pairs)
    assert list(t.index) == [7, 8, 9]
    assert t.loc[7, "forward_cycles"] == 10.0
    assert t.loc[9, "exchange_cycles"] == 2.0  # 16-18: compute (any pass) beats exchange
    # rank 0: 30 - (10 + 2) = 18 (the pass-less compute 4 and 14 untraced), shared by 2
    assert t.loc[[7, 9], "other_cycles"].tolist() == [9.0, 9.0]
    assert t.loc[8, ["backward_cycles", "idle_cycles", "other_cycles"]].tolist() == \
        [10.0, 20.0, 0.0]
    cols = [c for c in metrics.STAGE_TIME_COLUMNS if c != "sync_cycles"]
    per_rank = t[cols].sum(axis=1).groupby(pairs["ipu"]).sum()
    assert per_rank.tolist() == [30.0, 30.0]  # each rank's columns add up to its step
    # two steps: means per step
    assert metrics.stage_table_times(tr, pairs, steps=2).loc[7, "forward_cycles"] == 5.0


def test_peaks_fit_and_oom_tiles() -> None:
    live = pd.DataFrame({"ipu": [0, 0, 1, 1], "step": [0, 1, 0, 1],
                         "always_live_bytes": [10, 10, 5, 5],
                         "not_always_live_bytes": [3, 7, 9, 1]})
    assert metrics.peak_liveness(live).to_dict() == {0: 17, 1: 14}
    assert metrics.peak_rows(live).to_dict() == {0: 1, 1: 2}
    tiles = pd.DataFrame({"ipu": [0, 0, 1], "tile": [0, 1, 0],
                          "capacity_bytes": [100, 100, 100], "total_bytes": [120, 90, 150]})
    over = metrics.oom_tiles(tiles)
    assert over[["ipu", "tile", "bytes_over"]].to_numpy().tolist() == [[1, 0, 50], [0, 0, 20]]
    assert metrics.fits(tiles) is False
    assert metrics.fits(tiles[tiles["total_bytes"] <= 100]) is True
    assert metrics.fits(tiles.iloc[:0]) is None  # no tiles: unknown, not "fits"
    assert metrics.fits(tiles.assign(capacity_bytes=0)) is None  # no capacity either


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: str(p.relative_to(ROOT / "profiles")))
def test_stored_figures_are_the_cores(path: Path) -> None:
    with popviz.open(path) as p:
        s, trace, stages = p.summary, p.trace, p.stages
        measured = p.kind == "measured"
        n_dev = None if measured else int(p.meta["target"]["num_ipus"])
        assert s["idle_fraction"] == pytest.approx(metrics.idle_fraction(trace, n_dev),
                                                   rel=1e-12, abs=1e-15)
        peaks = metrics.peak_liveness(p.liveness)
        assert {int(k): v for k, v in s["peak_liveness_bytes"].items() if v} == \
            {int(k): int(v) for k, v in peaks.items()}
        assert s["fits"] is metrics.fits(p.tile_memory)
        over = metrics.oom_tiles(p.tile_memory)
        assert s["oom_tiles"] == len(over)
        assert sorted(s["oom_ipus"]) == sorted({int(i) for i in over["ipu"]})
        # the oom table lists the same tiles by the same amounts
        oom = p.oom.sort_values(["ipu", "tile"]).reset_index(drop=True)
        want = over.sort_values(["ipu", "tile"]).reset_index(drop=True)
        assert oom[["ipu", "tile", "bytes_over"]].to_numpy().tolist() == \
            want[["ipu", "tile", "bytes_over"]].to_numpy().tolist()
        # stages: idle (and every time column) per stage as the core attributes it
        steps = float(stages["steps"].max()) if measured else 1.0
        core = metrics.stage_columns(metrics.stage_time(trace, len(stages))) / steps
        got = stages.set_index("stage")
        cols = ["idle_cycles", "forward_cycles", "backward_cycles", "exchange_cycles"]
        if not measured:
            cols += ["recompute_cycles", "optimiser_cycles", "sync_cycles"]
            assert (got["peak_bytes"] == peaks.reindex(got["ipu"]).to_numpy()).all()
        np.testing.assert_allclose(got[cols].to_numpy(float),
                                   core.loc[got.index, cols].to_numpy(float), rtol=1e-12)
