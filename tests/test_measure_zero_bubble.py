"""Real 2-rank gloo pipelines on torch's zero-bubble schedules (ScheduleZBVZeroBubble,
ScheduleInterleavedZeroBubble): the run's own `PP:` actions come in the order popviz
plans them (`compiler.schedule_zb`), the import names the schedule from that order, and
the stages sit where torch put them (ZBV: a V)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import popviz
from popviz.compiler.schedule import build_schedule
from popviz.compiler.schedule_zb import stage_gpus
from popviz.measure.launch import measure
from popviz.measure.runner import MeasureConfig

MICROBATCHES, STEPS, RANKS = 4, 2, 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zero_bubble")
    out = {}
    for schedule in ("ZBV", "InterleavedZB"):
        paths = measure(MeasureConfig(model="tutorial", ranks=RANKS, steps=STEPS,
                                      microbatches=MICROBATCHES, micro_batch_size=2,
                                      schedule=schedule, profile_dir=str(root / schedule)))
        out[schedule] = paths[0]
    return out


def _planned(schedule: str) -> dict[int, list[str]]:
    """Each GPU's actions in the plan's schedule, in the order the plan runs them."""
    plan = build_schedule(2 * RANKS, MICROBATCHES, 1, True, schedule, 1, False, ranks=RANKS)
    a = plan.actions
    a = a.assign(gpu=stage_gpus(schedule, 2 * RANKS, RANKS)[a["stage"].to_numpy()])
    return {int(g): [f"{s}{p}{m}" for s, p, m in zip(rows["stage"], rows["pass"],
                                                       rows["microbatch"], strict=True)]
            for g, rows in a.sort_values("superstep", kind="stable").groupby("gpu")}


def _ran(slices: pd.DataFrame, rank: int, step_bounds: list[int]) -> list[list[str]]:
    """Each step's forward, input-gradient and weight-gradient actions of `rank` as the
    run annotated them (torch's I written as B)."""
    mine = slices[(slices["ipu"] == rank)
                  & slices["name"].astype(str).str.match(r"^PP:\d+[FIW]\d+$")]
    mine = mine.sort_values("start")
    steps = pd.cut(mine["start"], step_bounds, labels=False, right=False)
    return [[n[3:].replace("I", "B") for n in mine.loc[steps == k, "name"].astype(str)]
            for k in range(len(step_bounds) - 1)]


@pytest.mark.parametrize("schedule", ["ZBV", "InterleavedZB"])
def test_the_run_follows_the_planned_order(runs: dict[str, Path], schedule: str) -> None:
    planned = _planned(schedule)
    with popviz.open(runs[schedule]) as p:
        assert p.meta["options"]["schedule"] == schedule
        assert p.meta["measure"]["schedule_seen"] == schedule  # from its PP: actions
        assert p.stages.sort_values("stage")["ipu"].tolist() == \
            stage_gpus(schedule, 2 * RANKS, RANKS).tolist()
        slices = p.table("host_slices")
        compute = p.trace[p.trace["kind"] == "compute"]
        for rank in range(RANKS):  # each rank's own steps: ranks do not start them together
            steps = compute[compute["ipu"] == rank].groupby("step")["start"].min()
            bounds = [*steps.sort_index().tolist(), int(slices["end"].max()) + 1]
            assert len(bounds) == STEPS + 1
            for k, actions in enumerate(_ran(slices, rank, bounds)):
                assert actions == planned[rank], (schedule, rank, k)


def test_zbv_stages_fold_into_a_v(runs: dict[str, Path]) -> None:
    """ZBV: rank 0 holds the first and the last stage, so the loss's gradient starts on
    the rank that read the input; every stage runs every micro-batch's backward."""
    with popviz.open(runs["ZBV"]) as p:
        stages = p.stages.set_index("stage")["ipu"]
        assert stages.to_dict() == {0: 0, 1: 1, 2: 1, 3: 0}
        compute = p.trace[(p.trace["kind"] == "compute") & (p.trace["step"] == 0)]
        for stage in range(2 * RANKS):
            back = compute[(compute["stage"] == stage) & (compute["pass"] == "B")]
            assert sorted(back["microbatch"].unique()) == list(range(MICROBATCHES))
