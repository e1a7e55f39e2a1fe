"""Vector work of several compute sets (popviz/target/supersteps.py) worked by hand from
PopLibs' rules (graphcore/poplibs 7eac0f2): a reduction's cross-tile stages
(ReductionPlan.cpp), a batch / layer norm's compute sets (Norms.cpp), and the fixed cost
of each compute set in an op's cycles."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from popviz.compiler.plan_common import INFERENCE_BATCH_NORM
from popviz.target import get_target
from popviz.target.convplan import reduce_stages
from popviz.target.cost import Precision, op_costs
from popviz.target.popops import kind_of
from popviz.target.supersteps import (
    VERTEX_CYCLES,
    cross_tile,
    norm_backward,
    norm_forward,
    norm_inference,
    norm_layout,
    param_layout,
    reduction,
    stage_depths,
)

MK2 = get_target("mk2")
HALF = Precision.parse("16.16", True)


def test_a_reductions_stages_follow_poplibs_thresholds() -> None:
    # one tile holds the inputs: no cross-tile stage; under 2 sqrt(1472) = 76.7 tiles (and
    # up to 64 anyway): straight to the output; else an intermediate stage near sqrt
    assert stage_depths(1, 1472) == []
    assert stage_depths(50, 1472) == [50]
    assert stage_depths(76, 1472) == [76]
    assert stage_depths(77, 1472) == [9, 9]
    assert stage_depths(368, 1472) == [20, 19]
    # Mk1's 1,216 tiles: 2 sqrt = 69.7
    assert stage_depths(69, 1216) == [69] and stage_depths(70, 1216) == [9, 8]
    # a conv's partials (poplin getNumReduceStages): 1 stage under 16, 2 under 125
    assert [reduce_stages(d) for d in (1, 2, 15, 16, 124, 125)] == [0, 1, 1, 2, 2, 3]


def test_resnet50_layer1_batch_norm_layout_by_hand() -> None:
    # [20, 64, 56, 56] over 1,472 tiles: 2,727 elements a tile, less than one run of 16
    # channels x 3,136 positions, so a tile holds 16 channels; a channel's 62,720 elements
    # sit 2,727 / 16 = 170.4 to a tile: on 368 tiles
    elements = 20 * 64 * 56 * 56
    layout = norm_layout("aten.native_batch_norm.default", "[20,64,56,56]", elements, 1472)
    assert layout.per_tile == math.ceil(elements / 1472) == 2727
    assert (layout.groups, layout.groups_on_tile) == (64, 16)
    assert layout.sources == math.ceil(elements / 64 / (2727 / 16)) == 368
    assert layout.per_channel


def test_a_batch_norm_forward_by_hand() -> None:
    elements = 20 * 64 * 56 * 56
    layout = norm_layout("aten.native_batch_norm.default", "[20,64,56,56]", elements, 1472)
    got = norm_forward(layout, 1472, fp16=True, rate=4.0)
    # compute sets: statistics, 2 cross-tile stages, inverse std, gamma x inv-std and
    # beta - mean x that over the 64 channels, then one scale and one shift (PopART's and
    # TensorFlow's batchNormalise with a combined multiplicand)
    assert (got.sets, got.exchanging) == (8, 4)
    # statistics: 2 sums x 0.5 a half; two broadcasts x 2 cycles per 8 halves
    local = VERTEX_CYCLES + 2 * 2727 * 0.5
    broadcasts = 2 * (VERTEX_CYCLES + 2727 * 0.25)
    # stage 1 (depth 20): 128 outputs x ceil(368 / 20) = 2,432 results over 1,472 tiles,
    # 2 a tile, 20 partials each; stage 2 (depth 19): 128 results on 128 tiles, 1 each
    stage1 = VERTEX_CYCLES + 2 * 20 * 0.5
    stage2 = VERTEX_CYCLES + 1 * 19 * 0.5
    inv_std = VERTEX_CYCLES + 1 * 19 / 4  # 64 values on 64 tiles, rsqrt 19 per 4 halves
    folded = 2 * (VERTEX_CYCLES + 1 * 0.75)  # a binary op on each channel's values
    assert got.vertex == pytest.approx(local + broadcasts + stage1 + stage2 + inv_std
                                       + folded)
    # exchanged: the partials (4 B each) and 16 channels' operand per broadcast
    assert got.exchange == pytest.approx((2 * 20 * 4 + 19 * 4 + 2 * 16 * 4) / 4.0)


def test_stable_statistics_reduce_the_mean_then_the_centred_squares_by_hand() -> None:
    # poplin normStatisticsImpl with stableAlgo (TensorFlow's norms.use_stable_statistics):
    # the mean reduced on its own, subtracted from every value (a per-channel broadcast),
    # then the squares of that reduced; without it one reduceMany takes both sums
    elements = 20 * 64 * 56 * 56
    layout = norm_layout("aten.native_batch_norm.default", "[20,64,56,56]", elements, 1472)
    plain = norm_forward(layout, 1472, True, 4.0)
    stable = norm_forward(layout, 1472, True, 4.0, stable=True)
    # two local passes of one sum for one of two; their first stages keep one result a
    # tile each (64 x 19 over 1,472 tiles) where the joint one kept two; the second stage
    # (19 partials) runs twice; and the centring broadcast
    centring = VERTEX_CYCLES + 2727 * 0.25
    assert stable.vertex - plain.vertex == pytest.approx(
        VERTEX_CYCLES + VERTEX_CYCLES + (VERTEX_CYCLES + 19 * 0.5) + centring)
    assert (stable.sets - plain.sets, stable.exchanging - plain.exchanging) == (4, 3)
    # exchanged on top: the second stage's 19 float partials and 16 channels' means
    assert (stable.exchange - plain.exchange) * 4.0 == pytest.approx(19 * 4 + 16 * 4)


def test_stable_statistics_are_an_ipu_option() -> None:
    from popviz.compiler import compile
    from popviz.options import Options
    from tooling.testing.programs import synthetic_program

    program = synthetic_program(layers=2, batch=4, channels=16, hw=16)
    with pytest.raises(ValueError, match="stable norm statistics model TensorFlow's IPU"):
        compile(program, Options(target="h100").set_stable_norm_statistics())
    plain = compile(program, Options()).tables["ops"]
    stable = compile(program, Options().set_stable_norm_statistics()).tables["ops"]
    norm = (plain["op_class"] == "norm") & (plain["pass"] == "F")
    assert (stable.loc[norm, "cycles"] > plain.loc[norm, "cycles"]).all()
    assert (stable.loc[~norm, "cycles"] == plain.loc[~norm, "cycles"]).all()


def test_stable_statistics_cost_only_the_norms_forward() -> None:
    elements = 6 * 128 * 56 * 56
    rows = pd.concat([_row("aten.native_group_norm.default", "norm", "[6,128,56,56]",
                           elements),
                      _row("aten.native_group_norm_backward.default", "norm",
                           "[6,128,56,56]", elements),
                      _row("aten.relu.default", "elementwise", "[6,128,56,56]", elements)],
                     ignore_index=True)
    plain = op_costs(rows, MK2, HALF, np.array([0.6, 0.6, 0.6]))["cycles"].to_numpy()
    stable = op_costs(rows, MK2, Precision.parse("16.16", True, stable_norm_statistics=True),
                      np.array([0.6, 0.6, 0.6]))["cycles"].to_numpy()
    assert stable[0] > 1.2 * plain[0]  # a group norm's forward: one more pass of six
    assert (stable[1:] == plain[1:]).all()  # its backward and the relu: unchanged


def test_a_group_norm_forward_whitens_then_scales_four_passes() -> None:
    # popnn groupNormalise: subtract and scale per (sample, group), then gamma and beta
    # per channel; batch norm folds the first two into two ops over its channels
    elements = 6 * 128 * 56 * 56
    gn_layout = norm_layout("aten.native_group_norm.default", "[6,128,56,56]", elements,
                            1472)
    assert gn_layout.groups == 6 * 32 and not gn_layout.per_channel
    gn = norm_forward(gn_layout, 1472, True, 4.0)
    folded = norm_forward(replace(gn_layout, per_channel=True), 1472, True, 4.0)
    # two scalar broadcasts (2 cycles per 4 halves, each exchanging the tile's group
    # values) in place of two binary ops over the 192 statistics (one a tile)
    whiten = 2 * (VERTEX_CYCLES + gn_layout.per_tile * 0.5)
    assert gn.vertex - folded.vertex == pytest.approx(whiten - 2 * (VERTEX_CYCLES + 0.75))
    assert (gn.sets, gn.exchanging) == (folded.sets, folded.exchanging + 2)


def test_a_norm_backward_is_seventeen_compute_sets_with_its_parameter_gradients() -> None:
    elements = 20 * 64 * 56 * 56
    layout = norm_layout("aten.native_batch_norm.default", "[20,64,56,56]", elements, 1472)
    fwd = norm_forward(layout, 1472, True, 4.0)
    bwd = norm_backward(layout, 1472, True, 4.0)
    # 13 steps, two reductions (each its local pass and 2 stages) among them
    assert bwd.sets == 17
    per_element = (bwd.vertex - bwd.sets * VERTEX_CYCLES) / layout.per_tile
    # 6 broadcasts x 0.25, 3 binaries x 0.75, two reductions of two sums 2 x 1.0, the
    # copy 0.5 (+ small)
    assert per_element == pytest.approx(6 * 0.25 + 3 * 0.75 + 2 * 1.0 + 0.5, rel=0.02)
    assert bwd.vertex > 3 * fwd.vertex


def test_a_layer_norms_parameter_gradients_sum_each_column_over_the_rows() -> None:
    # BERT-Large [8, 128, 1024]: gamma's and beta's gradients are 1,024 sums over the 1,024
    # rows; a tile's 713 values are distinct columns of one or two rows, so each column's
    # 1,024 partials sit on 1,024 tiles: two cross-tile stages
    elements = 8 * 128 * 1024
    params = param_layout("aten.native_layer_norm_backward.default", "[8,128,1024]",
                          elements, 1472)
    assert (params.groups, params.groups_on_tile) == (1024, 713)
    assert params.sources == 1024
    rows = norm_layout("aten.native_layer_norm_backward.default", "[8,128,1024]", elements,
                       1472)
    with_params = norm_backward(rows, 1472, True, 4.0, params)
    alone = norm_backward(rows, 1472, True, 4.0)
    assert with_params.sets == alone.sets + 1  # two cross-tile stages, not one


def test_layer_norm_rows_spanning_two_tiles_reduce_in_one_stage() -> None:
    # BERT-Large [8, 128, 1024]: 713 elements a tile, a row of 1,024 on 2 tiles
    elements = 8 * 128 * 1024
    layout = norm_layout("aten.native_layer_norm.default", "[8,128,1024]", elements, 1472)
    assert (layout.groups, layout.groups_on_tile, layout.sources) == (1024, 1, 2)
    assert not layout.per_channel
    got = norm_forward(layout, 1472, True, 4.0)
    assert (got.sets, got.exchanging) == (7, 5)  # one cross-tile stage


def test_a_bias_gradient_sum_over_rows_keeps_distinct_outputs_on_a_tile() -> None:
    # [160, 6080] -> [1, 6080]: a tile's 661 inputs are 661 distinct outputs of one row;
    # each output's 160 partials sit on 160 tiles: two stages (13, 13)
    got = reduction("[160,6080]", "[1,6080]", 160 * 6080, 6080, 1472, True, 4.0)
    assert (got.sets, got.exchanging) == (3, 2)
    alone = cross_tile(6080, 160, 1472, True, 4.0)
    assert got.vertex == pytest.approx(VERTEX_CYCLES + 661 * 0.5 + alone.vertex)


def _row(op: str, op_class: str, out_shape: str, elements: int) -> pd.DataFrame:
    return pd.DataFrame([{"op": op, "op_class": op_class, "phase": "forward",
                          "flops": elements, "dtype": "float16", "shapes": out_shape,
                          "out_shape": out_shape, "bytes_read": 2 * elements,
                          "bytes_written": 2 * elements}])


def test_an_ops_cycles_are_its_vertex_scaled_plus_its_compute_sets_fixed_costs() -> None:
    cost = MK2.cost
    elements = 20 * 64 * 56 * 56
    got = op_costs(_row("aten.native_batch_norm.default", "norm", "[20,64,56,56]",
                        elements), MK2, HALF, np.array([0.6])).iloc[0]
    layout = norm_layout("aten.native_batch_norm.default", "[20,64,56,56]", elements, 1472)
    sets = norm_forward(layout, 1472, True, MK2.exchange_bytes_per_tile_cycle)
    want = (sets.vertex / cost.vector_efficiency + sets.exchange
            + sets.sets * cost.sync_cycles_internal
            + sets.exchanging * cost.exchange_fixed_cycles)
    assert got["cycles"] == math.ceil(want)
    assert got["compute_cycles"] == math.ceil(sets.vertex / cost.vector_efficiency)
    # the compute sets' costs are published figures, not scaled by the fitted factor
    slow = cost.with_values(sync_cycles_internal=1090)
    again = op_costs(_row("aten.native_batch_norm.default", "norm", "[20,64,56,56]",
                          elements), MK2, HALF, np.array([0.6]), slow).iloc[0]
    assert again["cycles"] - got["cycles"] == pytest.approx(8 * 1000, abs=1)


def test_inference_batch_norm_is_two_broadcasts_with_running_statistics() -> None:
    elements = 20 * 64 * 56 * 56
    name = "aten._native_batch_norm_legit_no_training.default"
    layout = norm_layout(name, "[20,64,56,56]", elements, 1472)
    got = norm_inference(layout, True, 4.0)
    assert (got.sets, got.exchanging) == (2, 2)  # no statistics, no reduction
    assert got.vertex == pytest.approx(2 * (VERTEX_CYCLES + 2727 * 0.25))
    assert kind_of(name, "norm").steps == "norm inference"


def test_an_inference_compile_runs_its_batch_norms_on_running_statistics() -> None:
    from popviz.compiler import compile
    from popviz.options import Options
    from tooling.testing.programs import synthetic_program

    program = synthetic_program(layers=2, batch=4, channels=16, hw=16)
    ops = program.ops
    assert (ops["op"].astype(str) == "aten.native_batch_norm.default").any()
    train = compile(program, Options())
    infer = compile(program, Options(training=False))
    t_ops, i_ops = train.tables["ops"], infer.tables["ops"]
    assert INFERENCE_BATCH_NORM in set(i_ops["op"].astype(str))
    assert "aten.native_batch_norm.default" not in set(i_ops["op"].astype(str))
    fwd = t_ops[(t_ops["op"] == "aten.native_batch_norm.default") & (t_ops["pass"] == "F")]
    inf = i_ops[i_ops["op"] == INFERENCE_BATCH_NORM]
    assert len(inf) == len(fwd) and (inf["cycles"].to_numpy() < fwd["cycles"].to_numpy()).all()


def test_a_recorded_resnext_with_group_norms_pays_their_whitening() -> None:
    # the same ResNeXt-50 (224 px, micro-batch 6 as the published ResNeXt-101 run)
    # recorded twice through train.py's model builder: batch norms,
    # then the group norms Graphcore's TensorFlow CNNs train with. Only the norms' costs
    # move: a group norm's forward whitens before it scales (four passes to two), its
    # backward is the same steps
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz import models
    from popviz.compiler import compile
    from popviz.models.training import train_step
    from popviz.options import Options
    from popviz.recorder import record_program

    def norm_cycles(variant: dict) -> pd.Series:
        with FakeTensorMode():
            model = models.build("resnext", 50, num_classes=10, variant=variant)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            program = record_program(train_step, model, opt, torch.randn(6, 3, 224, 224),
                                     torch.randint(0, 10, (6,)), model=model, mode="plan",
                                     progress=False)
        ops = compile(program, Options(target="mk2", precision="16.16")).tables["ops"]
        norms = ops[ops["op_class"] == "norm"]
        return norms.groupby("phase")["cycles"].sum()

    bn, gn = norm_cycles({}), norm_cycles({"group_norm": 32})
    assert gn["forward"] > 1.2 * bn["forward"]  # 1.32; 1.09 when both paid four passes
    assert gn["backward"] == pytest.approx(bn["backward"], rel=0.25)
