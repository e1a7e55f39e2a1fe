"""Vector work as popops vertices cost it (popviz/target/popops.py), worked by hand from
the published PopLibs figures: a 64-bit data path (4 halves or 2 floats a loop step), six
workers, ~20 cycles to start a worker and ~11 for the supervisor."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from popviz.target import get_target
from popviz.target.cost import Precision, op_costs
from popviz.target.costmodel import CostModel
from popviz.target.popops import (
    CAST,
    COPY,
    EXP,
    FAST_BINARY,
    GELU_BACKWARD,
    NORM,
    NORM_BACKWARD,
    OTHER,
    REDUCE,
    RELU,
    SOFTMAX,
    base_name,
    kind_of,
    vector_cycles,
)
from tooling.calibration import bandwidth

MK2 = get_target("mk2")


def one(op: str, op_class: str, elements: int, dtype: str = "float16",
        read_elements: int | None = None) -> pd.DataFrame:
    size = 2 if dtype == "float16" else 4
    return pd.DataFrame([{"op": op, "op_class": op_class, "phase": "forward",
                          "flops": elements, "dtype": dtype, "shapes": "", "out_shape": "",
                          "bytes_read": size * (read_elements or 2 * elements),
                          "bytes_written": size * elements}])


@pytest.mark.parametrize(("op", "op_class", "kind"), [
    ("aten.add.Tensor", "elementwise", FAST_BINARY),
    ("aten.add_.Tensor", "elementwise", FAST_BINARY),
    ("aten._foreach_mul_.Scalar", "elementwise", FAST_BINARY),
    ("aten::relu", "elementwise", RELU),
    ("aten.exp.default", "elementwise", EXP),
    ("aten.native_batch_norm.default", "norm", NORM),
    ("aten.native_layer_norm_backward.default", "norm", NORM_BACKWARD),
    ("aten.gelu_backward.default", "elementwise", GELU_BACKWARD),
    ("aten._softmax.default", "elementwise", SOFTMAX),
    ("aten._to_copy.default", "data_movement", CAST),
    ("aten.clone.default", "data_movement", COPY),
    ("aten.sum.dim_IntList", "reduction", REDUCE),
    ("aten.some_new_norm.default", "norm", NORM),
    ("aten.frobnicate.default", "elementwise", OTHER),
])
def test_ops_map_to_their_popops_kind(op: str, op_class: str, kind: object) -> None:
    assert kind_of(op, op_class) is kind


def test_base_names() -> None:
    assert base_name("aten.native_batch_norm_backward.default") == "batch_norm_backward"
    assert base_name("aten._foreach_addcmul_.Scalar") == "addcmul"
    assert base_name("aten::add_") == "add"


def test_a_half_add_by_hand() -> None:
    # 1,000,000 halves over 1,000 tiles: 1,000 a tile, 167 a worker = 42 vectors of 4
    # at 1 + 2 cycles; six workers interleave, so the tile takes 6 x (20 + 42 x 3) + 11.
    got = vector_cycles([FAST_BINARY], np.array([2e6]), np.array([1e6]), np.array([2e6]),
                        np.array([1000]), fp16=True)
    worker = 20 + math.ceil(math.ceil(1000 / 6) / 4) * 3
    assert got.vertex[0] == pytest.approx(6 * worker + 11, rel=0.01)
    # one compute set, its operands already on the tile: a sync, no exchange
    assert (got.sets[0], got.exchanging[0], got.exchange[0]) == (1, 0, 0)


def test_float_work_takes_twice_the_steps_and_exp_more() -> None:
    n = np.array([1e6])
    tiles = np.array([1000])

    def cost(kind: object, fp16: bool) -> float:
        return float(vector_cycles([kind], n, n, 2 * n, tiles, fp16).vertex[0])
    base = 6 * 20 + 11
    assert (cost(FAST_BINARY, False) - base) == pytest.approx(2 * (cost(FAST_BINARY, True)
                                                                   - base))
    # f16v2exp: 4 cycles per 4 halves; float exp: 6 per 2
    assert (cost(EXP, True) - base) == pytest.approx(1000 * 4 / 4)
    assert (cost(EXP, False) - base) == pytest.approx(1000 * 6 / 2)


def test_a_batch_norm_is_its_compute_sets_against_an_add() -> None:
    # [16, 64, 112, 112] halves (ResNet-50's stem) over all 1,472 tiles: 8,727 a tile. The
    # forward is two sums in one pass (0.5 a half each), then one scale and one shift per
    # channel (0.25 a half each: the frameworks fold gamma, beta and the statistics): 1.5
    # cycles a half, against an add's 0.75
    half = Precision.parse("16.16", True)
    elements = 16 * 64 * 112 * 112
    row = one("aten.native_batch_norm.default", "norm", elements, read_elements=elements)
    row["out_shape"] = "[16,64,112,112]"
    norm = op_costs(row, MK2, half, np.array([0.6]))
    add = op_costs(one("aten.add.Tensor", "elementwise", elements), MK2, half,
                   np.array([0.6]))
    assert norm["compute_cycles"].iloc[0] / add["compute_cycles"].iloc[0] == \
        pytest.approx(1.5 / 0.75, rel=0.15)
    # and its fixed costs: eight compute sets, four of them exchanging (two reduction
    # stages, two broadcasts), where the add has one compute set with no exchange
    cost = MK2.cost
    fixed = 8 * cost.sync_cycles_internal + 4 * cost.exchange_fixed_cycles
    assert norm["cycles"].iloc[0] - norm["compute_cycles"].iloc[0] >= fixed
    assert add["cycles"].iloc[0] - add["compute_cycles"].iloc[0] == \
        pytest.approx(cost.sync_cycles_internal, abs=1)


def test_the_read_bandwidth_point_by_hand() -> None:
    # a sum over fp32: one vector of 2 floats a worker step -> 8 bytes per tile cycle at
    # vector_efficiency 1; Mk1 1,216 tiles at 1.6 GHz -> about 15.6 TB/s
    point = {"config": {"target": "mk1", "bytes": 1216 * 200_000}}
    got = bandwidth(point, CostModel(vector_efficiency=1.0, sync_cycles_internal=0,
                                     exchange_fixed_cycles=0))
    mk1 = get_target("mk1")
    assert got == pytest.approx(mk1.tiles_per_ipu * 8 * mk1.clock_hz, rel=0.02)
