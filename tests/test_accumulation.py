"""Gradient accumulation on an IPU: each micro-batch adds every weight's gradient into its
accumulator (plan_common.with_gradient_accumulation), on the stage that makes it."""

from __future__ import annotations

import numpy as np
import pytest

from popviz.compiler import compile
from popviz.compiler.plan_common import ACCUMULATE_GRADIENT, with_gradient_accumulation
from popviz.options import Options
from popviz.target.popops import FAST_BINARY, kind_of
from tooling.testing.programs import synthetic_program

SPLITS = ["l2", "l4", "l6"]


@pytest.fixture(scope="module")
def program():
    return synthetic_program(layers=8, batch=4, channels=16, hw=16)


def _accumulations(report):
    ops = report.tables["ops"]
    return ops[ops["op"] == ACCUMULATE_GRADIENT]


def test_each_weight_gradient_is_added_to_its_accumulator_on_its_own_stage(program) -> None:
    report = compile(program, Options(splits=SPLITS, gradient_accumulation=8))
    acc = _accumulations(report)
    t = program.tensors
    grads = t[t["category"] == "gradient"]
    assert len(acc) == len(grads) > 0
    ops = report.tables["ops"]
    made_on = ops.set_index("op_id")["stage"].reindex(grads["producer"]).to_numpy()
    assert sorted(acc["stage"].tolist()) == sorted(made_on.tolist())
    assert set(acc["pass"]) == {"B"}
    # a gradient's elements, read with the accumulator's and written back in place
    assert sorted(acc["bytes_written"].tolist()) == sorted(grads["bytes"].tolist())
    assert (acc["bytes_read"] == 2 * acc["bytes_written"]).all()
    assert kind_of(ACCUMULATE_GRADIENT, "elementwise") is FAST_BINARY  # popops::addInPlace
    assert (acc["cycles"] > 0).all()


def test_a_stage_pays_its_accumulation_every_micro_batch(program) -> None:
    one = compile(program, Options(splits=SPLITS, gradient_accumulation=1))
    eight = compile(program, Options(splits=SPLITS, gradient_accumulation=8))
    assert _accumulations(one).empty
    added = _accumulations(eight).groupby("stage")["cycles"].sum()
    grew = (eight.tables["stages"]["backward_cycles_per_microbatch"]
            - one.tables["stages"]["backward_cycles_per_microbatch"])
    assert np.array_equal(grew.to_numpy(), added.reindex(grew.index, fill_value=0).to_numpy())
    assert eight.summary["step_cycles"] > 0


def test_inference_accumulates_nothing(program) -> None:
    report = compile(program, Options(splits=SPLITS, gradient_accumulation=8, training=False))
    assert _accumulations(report).empty


def test_a_rebuilt_program_gets_its_accumulations_once(program) -> None:
    options = Options(splits=SPLITS, gradient_accumulation=8)
    once = with_gradient_accumulation(program, options)
    twice = with_gradient_accumulation(once, options)
    names = twice.ops["op"]
    assert (names == ACCUMULATE_GRADIENT).sum() == (once.ops["op"] == ACCUMULATE_GRADIENT).sum()
    assert len(twice.ops) == len(once.ops)
    # and one without accumulation loses the old ones
    plain = with_gradient_accumulation(once, Options(splits=SPLITS))
    assert not (plain.ops["op"] == ACCUMULATE_GRADIENT).any()
    assert len(plain.ops) == len(program.ops)
