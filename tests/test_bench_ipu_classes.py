"""bench/bench_ipu_classes.py: the per-class split of one calibration point's cycles, at the
estimates and as fitted, against the two factors it is made of."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench_util import load_bench


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_bench("bench_ipu_classes")


def test_resnet50_classes_at_the_estimates_and_as_fitted(bench: Any) -> None:
    table, facts = bench.class_table("mk2-rn50-train-16x1ipu-mb20")
    assert table["estimate_share"].sum() == pytest.approx(1.0)
    assert table["fitted_share"].sum() == pytest.approx(1.0)
    # a conv's cycles are its plan's over conv_efficiency; a vector op's its vertex
    # cycles over vector_efficiency (the compute sets' fixed costs are in both: the ratio
    # is nearer 1 than the factor)
    conv = table.loc["conv", "fitted_over_estimate"]
    assert 0.95 / facts["conv_efficiency"] < conv <= 1 / facts["conv_efficiency"]
    norm = table.loc["norm", "fitted_over_estimate"]
    assert 0.8 / facts["vector_efficiency"] < norm < 1 / facts["vector_efficiency"]
    # bounded factors cannot move work between classes by more than 1 / 0.7 (v3's moved a
    # fifth of ResNet-50's cycles from convolutions to norms)
    assert (table["fitted_over_estimate"] <= 1 / 0.7 + 1e-9).all()
    assert (table["fitted_over_estimate"] >= 1.0).all()
    assert table.loc["conv", "fitted_share"] > table.loc["norm", "fitted_share"] * 3
    assert facts["step_fitted"] > facts["step_estimate"]
    text = bench.render("x", table, facts)
    assert "conv" in text and "norm" in text and "median op" in text


def test_an_unknown_point_is_one_line(bench: Any) -> None:
    with pytest.raises(SystemExit, match="unknown point"):
        bench.class_table("no-such-point")
