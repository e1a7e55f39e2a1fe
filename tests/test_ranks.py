"""popviz.analysis.ranks and figures.ranks: each rank's share of the step and the
stragglers, on a hand-built job whose answer is known, a real two-rank run, and a
1,024-rank job drawn as one heat map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.analysis.ranks import rank_shares, stragglers
from popviz.figures.ranks import rank_heatmap
from popviz.vocab import MEASURED

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def _job(compute_us: list[float], comm_us: float = 10.0, step_us: float = 200.0,
         stages: list[int] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One step per rank: its compute, then its all-reduce, then waiting to the step's
    end (the slowest rank sets it)."""
    rows = []
    for r, c in enumerate(compute_us):
        rows += [(r, 0.0, c * 1e3, "compute", "F"),
                 (r, c * 1e3, (c + comm_us) * 1e3, "exchange", ""),
                 (r, (c + comm_us) * 1e3, step_us * 1e3, "idle", "")]
    trace = pd.DataFrame(rows, columns=["ipu", "start", "end", "kind", "pass"])
    trace["step"] = 0
    stage_of = stages or [0] * len(compute_us)
    table = pd.DataFrame({"stage": stage_of, "ipu": range(len(compute_us))})
    return trace, table


def test_shares_add_up_and_the_slow_rank_is_named_with_its_cause() -> None:
    trace, stages = _job([100.0, 102.0, 140.0, 99.0])
    shares = rank_shares(trace, stages)
    parts = shares[[c for c in shares.columns if c.endswith("_share")]].sum(axis=1)
    assert np.allclose(parts, 1.0)
    assert shares.loc[2, "compute"] == pytest.approx(140e3)
    assert shares.loc[0, "waiting"] == pytest.approx(200e3 - 110e3)
    late = stragglers(shares)
    assert late["ipu"].tolist() == [2] and late.loc[0, "cause"] == "compute"
    # busy (compute + 10 us all-reduce): 110, 112, 150, 109 us; its peers' median 110
    assert late.loc[0, "over"] == pytest.approx(150 / 110 - 1)


def test_each_rank_is_held_against_its_own_stages_ranks() -> None:
    """A last stage that does more by design (the head, the loss) is not late: its two
    ranks match each other."""
    trace, stages = _job([100.0, 101.0, 160.0, 161.0], stages=[0, 0, 1, 1])
    assert stragglers(rank_shares(trace, stages)).empty
    trace, stages = _job([100.0, 101.0, 160.0, 190.0], stages=[0, 0, 1, 1])
    late = stragglers(rank_shares(trace, stages))
    assert late["ipu"].tolist() == [3]
    # a rank 10% busier than its one peer is late by 10%, not by the 5% a median that
    # held itself would give
    trace, stages = _job([100.0, 111.0], comm_us=0.0, stages=[0, 0])
    late = stragglers(rank_shares(trace, stages))
    assert late["ipu"].tolist() == [1] and late.loc[0, "over"] == pytest.approx(0.11)


def test_a_real_two_rank_run_has_no_peers_to_be_late_against() -> None:
    with popviz.open(PROFILES / "tutorial_measured_2ranks") as p:
        shares = rank_shares(p.trace, p.stages)
    assert list(shares.index) == [0, 1] and list(shares["stage"]) == [0, 1]
    assert stragglers(shares).empty  # one rank per stage: stage load compares them
    assert (shares["step"] > 0).all() and (shares["busy"] <= shares["step"] + 1).all()


def test_a_thousand_ranks_are_one_heat_map_with_the_stragglers_marked() -> None:
    rng = np.random.default_rng(0)
    compute = list(100.0 + rng.normal(0, 1.0, 1024))
    compute[517] = 150.0
    trace, stages = _job(compute, stages=[r // 128 for r in range(1024)])
    shares = rank_shares(trace, stages)
    late = stragglers(shares)
    assert late["ipu"].tolist() == [517]
    fig = rank_heatmap(shares, late, MEASURED)
    assert len(fig.data) == 1 and fig.data[0].z.shape == (1024, 5)
    assert fig.layout.meta["stragglers"] == [517]
    # 150 + 10 us busy against a stage median of about 100 + 10
    assert late.loc[0, "over"] == pytest.approx(160 / 110 - 1, abs=0.01)
    assert [y for y in fig.data[0].y if "late" in y] == ["rank 517 · stage 4 · late +45%"]
