"""The /tune page's table: Pareto front by hand, and a real (small) tune run."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

import popviz
from popviz.advise.plans import pareto, plans_table, run_tune, write_plan
from popviz.figures.tune import point_labels, tune_figure

TUTORIAL = Path(__file__).resolve().parents[1] / "profiles" / "tutorial_pipelined" / "training"


def test_pareto_keeps_fitting_plans_nothing_beats_on_both() -> None:
    plans = pd.DataFrame({"plan": list("abcde"), "fits": [True, True, True, True, False],
                          "throughput": [10, 8, 12, 9, 50],
                          "peak_bytes": [100, 50, 200, 120, 10]})
    # d is beaten by a (more throughput, less memory); e does not fit
    assert pareto(plans).tolist() == [True, True, True, False, False]


def test_tune_plans_table_and_written_plan(tmp_path: Path) -> None:
    if not TUTORIAL.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    profile = popviz.open(TUTORIAL)
    result = run_tune(profile, max_compiles=4, top=3)
    plans = plans_table(result)
    assert plans["plan"].tolist()[0] == "now" and len(plans) == 1 + len(result.candidates)
    assert plans.loc[0, "throughput"] == pytest.approx(result.baseline.throughput)
    best = plans.iloc[1:][plans.iloc[1:]["fits"]]
    assert best["throughput"].is_monotonic_decreasing  # ranked
    fig = tune_figure(plans, 900 * 2**20)
    assert {d.name for d in fig.data} >= {"now (this profile)"}
    written = write_plan(profile, result, 1, tmp_path / "plan1" / "profile.h5")
    with popviz.open(written) as plan:
        assert plan.summary["throughput"] == pytest.approx(result.candidates[0].throughput)
    with pytest.raises(ValueError, match="no plan #9"):
        write_plan(profile, result, 9, tmp_path / "x.h5")


def test_plans_on_top_of_each_other_share_one_label() -> None:
    """Issue 21: labels of near-identical plans printed over each other. A cluster is
    labelled once, on its first point; the hover still names each point."""
    plans = pd.DataFrame({
        "plan": ["now", "#1", "#2", "#3"],
        "peak_bytes": [400e6, 500e6, 501e6, 300e6],
        "throughput": [5000.0, 6431.0, 6406.0, 5100.0],
        "pareto": [False, True, False, True], "fits": [True] * 4, "oom_tiles": [0] * 4,
        "splits": ["a"] * 4, "amp": [0.6] * 4, "recomputation": [True] * 4,
        "schedule": ["Grouped"] * 4, "vs_now": [1.0, 1.29, 1.28, 1.02]})
    assert point_labels(plans) == ["now", "#1, #2", "", "#3"]
    fig = tune_figure(plans, 900 * 2**20)
    fits = next(d for d in fig.data if d.name == "fits")
    assert list(fits.text) == ["#1, #2", "", "#3"]
    assert [c[6] for c in fits.customdata] == ["#1", "#2", "#3"]
    # drawn apart, each point keeps its own label
    apart = plans.assign(peak_bytes=[100e6, 300e6, 500e6, 700e6])
    assert point_labels(apart) == ["now", "#1", "#2", "#3"]


def test_run_tune_judges_fit_by_the_ceiling() -> None:
    if not TUTORIAL.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    profile = popviz.open(TUTORIAL)
    free = run_tune(profile, max_compiles=2, top=3)
    # a whole percent just under the current layout's fullest tile: 'now' must not fit
    fill = math.floor(max(free.baseline.max_tile_fill) * 100) / 100
    capped = run_tune(profile, max_compiles=2, top=3, max_tile_fill=fill)
    assert free.max_tile_fill == 1.0 and capped.max_tile_fill == fill
    assert free.baseline.fits and not capped.baseline.fits
    plans = plans_table(capped)
    now = plans.iloc[0]
    assert not now["fits"] and now["oom_tiles"] > 0 and now["fullest_tile"] > fill
    for c in capped.candidates:
        assert c.fits == (max(c.max_tile_fill) <= fill)
    fig = tune_figure(plans, 900 * 2**20, max_tile_fill=fill)
    star = next(d for d in fig.data if d.name == "now (this profile)")
    assert star.customdata[0][5].endswith(f" > {fill:.0%})")
    with pytest.raises(ValueError, match="max-tile-fill"):
        run_tune(profile, max_compiles=2, max_tile_fill=0)


def _plans(plan: list[str], peak: list[float], throughput: list[float]) -> pd.DataFrame:
    n = len(plan)
    return pd.DataFrame({
        "plan": plan, "peak_bytes": peak, "throughput": throughput,
        "pareto": [False] * n, "fits": [True] * n, "oom_tiles": [0] * n,
        "splits": ["a"] * n, "amp": [0.6] * n, "recomputation": [True] * n,
        "schedule": ["Grouped"] * n, "vs_now": [1.0] * n})


def test_labels_of_neighbouring_plans_do_not_print_into_each_other() -> None:
    """rn50_pipeline's tune (budget 4) drew "now, #2" and "#1" into one "now#1#2": plans
    0.1% apart were told apart relative to each other, but both axes run from zero, where
    they are one spot. Now one label names all three; and clusters just apart in the
    plot's own frame get labels that cover no other label."""
    import numpy as np

    from popviz.figures.tune import PLOT_PX, _overlap, label_box

    real = _plans(["now", "#1", "#2"], [535330424.0, 535801464.0, 535330424.0],
                  [4475.85, 4504.23, 4483.02])
    assert point_labels(real) == ["now, #1, #2", "", ""]
    plans = _plans(["now", "#1", "#2", "#3", "#4"], [400e6, 420e6, 400e6, 100e6, 400e6],
                   [5000.0, 5000.0, 5000.0, 3000.0, 5000.0])
    assert point_labels(plans) == ["now, #2, #4", "#1", "", "#3", ""]
    fig = tune_figure(plans, 900 * 2**20)
    drawn = [(float(x), float(y), str(t), float(d.marker.size), str(p))
             for d in fig.data if d.mode == "markers+text"
             for x, y, t, p in zip(d.x, d.y, d.text, d.textposition, strict=True)]
    xs, ys = np.array([d[0] for d in drawn]), np.array([d[1] for d in drawn])

    def scale(v: np.ndarray, px: float) -> np.ndarray:  # an axis from zero, padded
        pad = v.max() * 0.05
        return (v + pad) / (v.max() + 2 * pad) * px

    sx, sy = scale(xs, PLOT_PX[0]), scale(ys, PLOT_PX[1])
    boxes = [label_box(x, y, d[2], d[3], d[4]) for x, y, d in zip(sx, sy, drawn, strict=True)]
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert _overlap(boxes[i], boxes[j]) == 0, (drawn[i][2], drawn[j][2])


def test_a_sharded_profiles_plans_are_written_in_its_flags() -> None:
    """/tune's 'now' of tutorial_sharded read '--shards 4 --pipeline --pipeline-schedule
    Sequential', beside the summary's advice to pipeline it: the page gave every plan
    pipelined flags where `popviz tune` gives the profile's own strategy's."""
    path = Path(__file__).resolve().parents[1] / "profiles" / "tutorial_sharded" / "training"
    with popviz.open(path / "profile.h5") as profile:
        assert profile.meta["options"]["strategy"] == "sharded"
        result = run_tune(profile, max_compiles=3)
    flags = plans_table(result, "sharded")["train_args"].tolist()
    assert flags and all("--shards 4" in f and "--pipeline " not in f for f in flags)
    assert all("--pipeline-schedule" in f
               for f in plans_table(result)["train_args"])  # pipelined: as before
