"""Whole layers of ResNet-50 (Mk2) and BERT-Large (Bow) planned by hand, next to the planner.

docs/cost-model.md section 2, "Worked by hand: ResNet-50 and BERT-Large", gives each
example's table. For each one this module
- builds the pass from the recorded op through the public parsers (convparams.py) and
  checks its parameters against the hand derivation;
- checks the partition the planner picks (convplan.plan_conv), the one the docs show;
- recomputes that partition's busiest tile by hand in plain integer arithmetic (`by_hand`:
  no numpy, none of popviz's vertex functions) from the formulas of graphcore/poplibs at
  7eac0f266ced5b064b3284a3cd90d491745b387c, and asserts the planner's numbers equal it:
  * AMP vertex: lib/poplin/PerformanceEstimation.hpp getConvPartialnx1WorkerCycles (17 +
    per worklist entry 3 + 34 + 4 (n - 3) - 9 retained = 16 + 4 n), convNx1Overhead (109),
    getConvPartialnx1SupervisorOuterLoopCycleEstimateHalfFloat (16 per group, 14 per
    input block, 14 per output block), getConvPartialAmpSupervisorWeightLoadCycleEstimate
    (units x chain bytes / 8: ConvOptions use128BitConvUnitLoad is false by default);
  * zeroing: estimateZeroSupervisorCycles (its isFloat = true: 2 partials per 64 bits, +5);
  * reduction: getReduceCycleEstimate (20 + (2 x depth + 8) per loop of 8 half partials,
    x 6 workers, + 33), estimateConvReduceCycles;
  * exchange: bytes / exchange bytes per tile cycle (lib/poplin/ExchangeEstimator.hpp);
  * the search (lib/poplin/ConvPlan.cpp, ConvModel.cpp): the fastest plan whose temporary
    bytes per tile stay under availableMemoryProportion x tile bytes.
Then AMP 0.6 against 0.1 for two of them, and the fitted amp_efficiency's place (after the
plan, in popviz/target/cost.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import pytest

from popviz.target import get_target
from popviz.target.convparams import BWD, FWD, WU, ConvParams, op_passes
from popviz.target.convplan import Plan, compute_sets, plan_conv
from popviz.target.cost import Precision, op_costs, planned_op_cycles, tile_arch
from popviz.target.machines import Target

HALF = Precision.parse("16.16", half_partials=True)  # as Graphcore's published runs
MK2, BOW = get_target("mk2"), get_target("bow")


def ceil(a: float, b: float = 1) -> int:
    return math.ceil(a / b)


def by_hand(p: ConvParams, target: Target, method: str,
            part: tuple[int, int, int, int, int, int], serial: tuple[str, int]) -> dict:
    """The busiest tile of pass `p` under partition `part` (splits of batch, height,
    width, groups, input-channel blocks, output-channel blocks), worked from the
    formulas in plain integers. Mk2 / Bow, half inputs, half partials: 16 conv units of a
    16-weight chain, 4 worker cycles per output position, six workers."""
    units, chain, core, workers, eb, pb_ = 16, 16, 4, 6, 2, 2
    xbpc = target.exchange_bytes_per_s / (target.tiles_per_ipu * target.clock_hz)
    in_group = int(method.split("-")[0][3:])  # amp16 / amp4: input channels per block
    if method.endswith("-swapped"):  # PopLibs' swapOperands: rows <-> output channels
        p = replace(p, batch=p.out_chans, out_chans=p.batch)
    kind, s = serial
    if kind == "out":
        p = replace(p, out_chans=ceil(p.out_chans, s))
    elif kind == "in":
        p = replace(p, in_chans=ceil(p.in_chans, s))
    b, h, w, g, i, o = part
    kh, kw = p.kernel
    rows_per_block = chain // in_group  # kernel rows packed in one weight block
    icb, ocb = ceil(p.in_chans, in_group), ceil(p.out_chans, units)
    n_t, h_t, w_t = ceil(p.batch, b), ceil(p.field[0], h), ceil(p.field[1], w)
    g_t, icb_t, ocb_t = ceil(p.groups, g), ceil(icb, i), ceil(ocb, o)
    positions = n_t * h_t * w_t
    # worklist: one entry per output row; a 1x1 kernel at stride 1 is flattened, one
    # entry per worker
    one_by_one = (kh, kw, p.stride) == (1, 1, (1, 1))
    rows = min(n_t * h_t, workers) if one_by_one else n_t * h_t
    worker = 17 + ceil(rows, workers) * (3 + 34 - 9 - 3 * core) + ceil(positions, workers) * core
    weight_load = units * chain * eb // 8 + 18
    blocks = g_t * icb_t * ocb_t * ceil(kh, rows_per_block) * kw
    if one_by_one and rows_per_block == 1:  # PopLibs' 1x1 vertex (ConvPartial1x1Out)
        vertex = poplibs_1x1_vertex(g_t, icb_t, ocb_t, positions)
        worker = worker_1x1(ceil(positions, workers), zeroing=False)
    else:  # the nx1 vertex
        vertex = 109 + g_t * (16 + icb_t * (14 + 14 * ocb_t)) \
            + blocks * (weight_load + 30 + workers * worker)
    zero_each = 0 if (kh, kw, rows_per_block) == (1, 1, 1) else \
        workers * (ceil(ceil(positions * units, workers), 2) + 5)
    zero = zero_each * g_t * ocb_t
    ci_t, co_t = min(icb_t * in_group, p.in_chans), min(ocb_t * units, p.out_chans)
    in_field = n_t * ((h_t - 1) * p.stride[0] + kh) * ((w_t - 1) * p.stride[1] + kw)
    in_bytes = in_field * g_t * ci_t * eb
    w_bytes = g_t * ci_t * co_t * kh * kw * eb
    in_copy = in_bytes * (1 - 1 / o)  # the output split shares the inputs
    w_copy = w_bytes * (1 - 1 / (b * h * w))  # the batch / field split shares weights
    in_rate = 0.5 if o % 2 == 0 else 1.0  # IPU2: tile pairs share an exchange bus
    tiles = b * h * w * g * i * o
    exchange = math.ceil((in_copy * in_rate + w_copy) / xbpc)
    # rearranging copies before the pass (poplin addTransformCycleEstimate), spread over
    # the tiles used: a WU both operands, the expanded activations and the output gradient
    # (rearrangeInput / Weights); another pass its input and weights when its channels do
    # not fill the grouping (padInChannels), its weights and output when its output
    # channels do not fill the units (padPartialChannels)
    if p.kind == WU:
        rearranged = (p.batch + p.out_chans) * p.in_chans * p.groups * eb
    else:
        weights = p.in_chans * p.out_chans * kh * kw
        elements = 0
        if p.in_chans % in_group:
            elements += p.positions * p.stride[0] * p.stride[1] * p.in_chans + weights
        if p.out_chans % units:
            elements += weights + p.positions * p.out_chans
        rearranged = elements * p.groups * eb
    if rearranged:
        share = rearranged / tiles
        exchange += math.ceil(share * 5 / (eb * 4)) + math.ceil(share / xbpc)
    outputs = ceil(p.positions * p.groups * p.out_chans, tiles)  # spread over all tiles
    partials_in = outputs * i * pb_ if i > 1 else 0
    reduce = workers * (20 + (2 * (i - 1) + 8) * ceil(ceil(outputs, 8), workers)) + 33 \
        + math.ceil(partials_in / xbpc) if i > 1 else 0
    partial_bytes = positions * g_t * ocb_t * units * pb_
    temp = max(in_copy + w_copy + partial_bytes, partials_in)
    return {"tiles": tiles, "positions": positions, "rows": rows, "worker": worker,
            "blocks": blocks, "vertex": vertex * s, "zero": zero * s,
            "exchange": exchange * s, "reduce": reduce * s, "temp": temp,
            "in_copy": in_copy, "w_copy": w_copy, "partials": partial_bytes,
            "partials_in": partials_in, "total": (vertex + zero + exchange + reduce) * s}


@dataclass(frozen=True)
class Case:
    name: str
    target: Target
    op: str
    op_class: str
    shapes: str
    out_shape: str
    flops_passes: int  # recorded FLOPs = this many passes (a backward of both gradients: 2)
    index: int  # which pass of the op
    params: ConvParams  # derived by hand from the shapes
    amp: float
    method: str
    partition: tuple[int, int, int, int, int, int]
    serial: tuple[str, int]

    def conv(self) -> ConvParams:
        passes = op_passes(self.op, self.op_class, self.shapes, self.out_shape,
                           2.0 * self.params.macs * self.flops_passes)
        return passes[self.index]


CASES = [
    # ResNet-50, Mk2, micro-batch 16
    Case("rn50 stem 7x7/2 3->64 fwd", MK2, "aten.convolution.default", "conv",
         "[16,3,224,224];[64,3,7,7]", "[16,64,112,112]", 1, 0,
         ConvParams(16, 1, 3, 64, (112, 112), (7, 7), (2, 2), FWD),
         0.6, "amp4", (1, 112, 3, 1, 1, 4), ("", 1)),
    Case("rn50 layer3 3x3 256->256 fwd", MK2, "aten.convolution.default", "conv",
         "[16,256,14,14];[256,256,3,3]", "[16,256,14,14]", 1, 0,
         ConvParams(16, 1, 256, 256, (14, 14), (3, 3), (1, 1), FWD),
         0.6, "amp16", (1, 14, 1, 1, 6, 16), ("", 1)),
    Case("rn50 layer3 3x3 256->256 fwd, AMP 0.1", MK2, "aten.convolution.default", "conv",
         "[16,256,14,14];[256,256,3,3]", "[16,256,14,14]", 1, 0,
         ConvParams(16, 1, 256, 256, (14, 14), (3, 3), (1, 1), FWD),
         0.1, "amp16", (8, 1, 1, 1, 8, 16), ("", 1)),
    Case("rn50 layer3 3x3 256->256 wu", MK2, "aten.convolution_backward.default", "conv",
         "[16,256,14,14];[16,256,14,14];[256,256,3,3]", "[256,256,3,3]", 2, 1,
         ConvParams(256 * 9, 1, 16 * 14 * 14, 256, (1, 1), (1, 1), (1, 1), WU),
         0.6, "amp16-swapped", (1, 1, 1, 1, 24, 48), ("", 1)),
    Case("rn50 fc 2048->1000 fwd", MK2, "aten.addmm.default", "matmul",
         "[1000];[16,2048];[2048,1000]", "[16,1000]", 1, 0,
         ConvParams(16, 1, 2048, 1000, (1, 1), (1, 1), (1, 1), FWD),
         0.6, "amp16-swapped", (16, 1, 1, 1, 64, 1), ("", 1)),
    # BERT-Large, Bow, micro-batch 8, sequence 128: 1,024 tokens
    Case("bert qkv 1024->1024 fwd", BOW, "aten.linear.default", "matmul",
         "[8,128,1024];[1024,1024];[1024]", "[8,128,1024]", 1, 0,
         ConvParams(1024, 1, 1024, 1024, (1, 1), (1, 1), (1, 1), FWD),
         0.6, "amp16", (6, 1, 1, 1, 6, 32), ("", 1)),
    Case("bert ffn 1024->4096 fwd", BOW, "aten.linear.default", "matmul",
         "[8,128,1024];[4096,1024];[4096]", "[8,128,4096]", 1, 0,
         ConvParams(1024, 1, 1024, 4096, (1, 1), (1, 1), (1, 1), FWD),
         0.6, "amp16", (3, 1, 1, 1, 6, 64), ("", 1)),
    Case("bert ffn 1024->4096 fwd, AMP 0.1", BOW, "aten.linear.default", "matmul",
         "[8,128,1024];[4096,1024];[4096]", "[8,128,4096]", 1, 0,
         ConvParams(1024, 1, 1024, 4096, (1, 1), (1, 1), (1, 1), FWD),
         0.1, "amp16", (8, 1, 1, 1, 1, 128), ("in", 8)),
    Case("bert ffn grad-input 4096->1024", BOW, "aten.mm.default", "matmul",
         "[1024,4096];[4096,1024]", "[1024,1024]", 1, 0,
         ConvParams(1024, 1, 4096, 1024, (1, 1), (1, 1), (1, 1), FWD),
         0.6, "amp16", (3, 1, 1, 1, 24, 16), ("", 1)),
    Case("bert attention scores QK^T fwd", BOW, "aten.matmul.default", "matmul",
         "[8,16,128,64];[8,16,64,128]", "[8,16,128,128]", 1, 0,
         ConvParams(128, 128, 64, 128, (1, 1), (1, 1), (1, 1), FWD),
         0.6, "amp16", (1, 1, 1, 128, 1, 8), ("", 1)),
    Case("bert attention grad-Q dS K bwd", BOW, "aten.matmul.default", "matmul",
         "[8,16,128,128];[8,16,128,64]", "[8,16,128,64]", 1, 0,
         ConvParams(128, 128, 128, 64, (1, 1), (1, 1), (1, 1), FWD),
         0.6, "amp16-swapped", (1, 1, 1, 128, 1, 8), ("", 1)),
]


def _plan(case: Case) -> tuple[ConvParams, Plan]:
    p = case.conv()
    return p, plan_conv(p, tile_arch(case.target, HALF), case.amp)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_planner_matches_the_hand_worked_plan(case: Case) -> None:
    p, plan = _plan(case)
    assert p == case.params  # the pass read from the recorded shapes
    # the pick the docs show
    assert (plan.method, plan.partition, plan.serial) == (case.method, case.partition,
                                                          case.serial)
    hand = by_hand(p, case.target, plan.method, plan.partition, plan.serial)
    assert plan.tiles == hand["tiles"] <= case.target.tiles_per_ipu
    assert plan.compute_cycles == hand["vertex"] + hand["zero"]
    assert plan.exchange_cycles == hand["exchange"]
    assert plan.reduce_cycles == hand["reduce"]
    assert plan.temp_bytes == pytest.approx(hand["temp"], rel=1e-12)
    assert plan.estimate == hand["total"]
    # each compute set's start-up: the partials' and each reduction stage's (poplin
    # getNumReduceStages: 1 under 16 partials), per serial slice; half partials, no cast
    depth = plan.partition[4]
    stages = 0 if depth <= 1 else 1 if depth < 16 else 2 if depth < 125 else 3
    start = case.target.cost.plan_compute_set_cycles
    assert plan.start_cycles == start * (1 + stages) * plan.serial[1]
    # within the bound: AMP x 638,976 bytes per tile
    assert not plan.ignored and hand["temp"] <= case.amp * case.target.bytes_per_tile
    # no plan beats the AMP peak spread over the tiles used
    assert hand["total"] >= p.macs / (hand["tiles"] * 64)


def test_worked_vertex_figures_by_hand() -> None:
    """The layer3 forward's busiest tile, every step a number (docs' table): 16 images x
    1 row x 14 columns = 224 positions in 16 rows; 256 / 6 input-channel blocks -> 3
    blocks of 16 (48 channels), 16 / 16 output blocks -> 1 block (16 channels)."""
    hand = by_hand(CASES[1].params, MK2, "amp16", (1, 14, 1, 1, 6, 16), ("", 1))
    assert (hand["positions"], hand["rows"]) == (224, 16)
    assert hand["worker"] == 17 + 3 * 16 + 38 * 4 == 217  # ceil(16/6) = 3, ceil(224/6) = 38
    assert hand["blocks"] == 3 * 1 * 3 * 3 == 27  # in blocks x out blocks x 3 x 3 taps
    # 109 + 1 x (16 + 3 x (14 + 14)) + 27 x (82 + 30 + 6 x 217)
    assert hand["vertex"] == 109 + 100 + 27 * 1414 == 38387
    # zeroing 224 x 16 partials: ceil(ceil(3584 / 6) / 2) + 5 = 304, x 6 workers
    assert hand["zero"] == 6 * 304 == 1824
    # inputs: 16 x 3 x 16 halo positions x 48 channels x 2 B = 73,728 B, 15/16 copied at
    # half the cost (paired tiles); weights 48 x 16 x 9 x 2 = 13,824 B, 13/14 copied
    assert hand["in_copy"] == pytest.approx(73728 * 15 / 16)
    assert hand["w_copy"] == pytest.approx(13824 * 13 / 14)


def test_amp_01_rules_out_the_fast_plans() -> None:
    """AMP 0.6 -> 0.1 (63,898 bytes per tile): the 0.6 pick no longer fits, and the
    pick at 0.1 is slower and leaner (layer3 forward, BERT FFN)."""
    for fast_case, lean_case in ((CASES[1], CASES[2]), (CASES[6], CASES[7])):
        fast, lean = _plan(fast_case)[1], _plan(lean_case)[1]
        p = fast_case.params
        fast_hand = by_hand(p, fast_case.target, fast.method, fast.partition, fast.serial)
        lean_hand = by_hand(p, lean_case.target, lean.method, lean.partition, lean.serial)
        bound = 0.1 * fast_case.target.bytes_per_tile
        assert fast_hand["temp"] > bound >= lean_hand["temp"]
        assert lean_hand["total"] > fast_hand["total"]


def test_amp_efficiency_is_applied_after_the_plan() -> None:
    """An op's cycles = its plan's cycles (PopLibs' estimate, exchange included, and its
    compute sets' start-up, plan_compute_set_cycles) / conv_efficiency (a convolution;
    amp_efficiency for a matmul) + its compute sets' syncs and exchanges' fixed costs: the
    fitted factor scales the picked plan, never the pick."""
    case = CASES[1]
    row = pd.DataFrame([{"op": case.op, "op_class": case.op_class, "phase": "forward",
                         "flops": 2.0 * case.params.macs, "bytes_read": 1,
                         "bytes_written": 1, "shapes": case.shapes,
                         "out_shape": case.out_shape, "dtype": "float16"}])
    got = op_costs(row, MK2, HALF, np.array([case.amp])).iloc[0]
    hand = by_hand(case.params, MK2, case.method, case.partition, case.serial)
    cost = MK2.cost
    # the partials' compute set (after its exchange) and one reduction stage (depth 6)
    assert compute_sets(_plan(case)[1], tile_arch(MK2, HALF)) == (2, 2)
    fixed = 2 * cost.sync_cycles_internal + 2 * cost.exchange_fixed_cycles
    start = 2 * cost.plan_compute_set_cycles
    assert got["cycles"] == math.ceil((hand["total"] + start) / cost.conv_efficiency + fixed)
    assert got["exchange_cycles_internal"] == math.ceil(hand["exchange"]
                                                        / cost.conv_efficiency)
    assert got["tiles_used"] == hand["tiles"]
    assert "amp16: batch/1 height/14 width/1 groups/1 in/6 out/16 on 1344 tiles" \
        in got["plan"]


def test_backward_data_pass_keeps_the_forward_shape() -> None:
    """layer3's gradient of the input (a 3 x 3 stride-1 conv, 256 -> 256 swapped) is the
    forward's shape: the same plan and cycles (docs' table lists it once)."""
    op = CASES[3]
    bwd = op_passes(op.op, op.op_class, op.shapes, op.out_shape,
                    4.0 * op.params.macs)[0]
    assert bwd.kind == BWD
    arch = tile_arch(MK2, HALF)
    assert plan_conv(bwd, arch, 0.6).cycles == plan_conv(CASES[1].params, arch,
                                                         0.6).cycles


def worker_1x1(n: int, zeroing: bool) -> int:
    """One worker of PopLibs' 1x1 vertex over n contiguous positions (half inputs, the
    common path), less the 7 cycles of retained state."""
    base = {0: 20 + 1, 1: 31 + 1, 2: 40 + 1}.get(n, 37 + 4 * (n - 3))
    return base + (0 if zeroing else 1) - 7


def poplibs_1x1_vertex(groups: int, in_blocks: int, out_blocks: int, positions: int) -> int:
    """PopLibs' own estimate of the 1x1 AMP vertex (ConvPartial1x1Out) on one tile, half
    inputs and half partials, 16 units: getConvPartial1x1SupervisorCycleEstimate ->
    ...InnerLoopCycleEstimateHalfFloat (each worker one contiguous slice of n positions:
    `worker_1x1`; the slowest x 6, or the fastest x 6 + 14) and
    ...OuterLoopCycleEstimateHalfFloat (50 + 6 x (7 + 3 x (in x groups - 1)),
    per group 13, per further input block 15 + per output block 19 + 6 + load + inner, the
    first input block 11 + per output block 18 + 7 + load + inner with zeroing), weight
    load 16 x 32 B / 8 B per cycle = 64 (use128BitConvUnitLoad off)."""
    share = [positions // 6 + (k < positions % 6) for k in range(6)]

    def inner(zeroing: bool) -> int:
        cycles = [6 * worker_1x1(n, zeroing) if n else 0 for n in share]
        return max(max(cycles), min(cycles) + 14)

    load = 16 * 32 // 8
    return 50 + 6 * (7 + 3 * (in_blocks * groups - 1)) + groups * (
        13 + (in_blocks - 1) * (15 + out_blocks * (19 + 6 + load + inner(False)))
        + 11 + out_blocks * (18 + 7 + load + inner(True)))


def test_one_by_one_passes_run_on_poplibs_1x1_vertex() -> None:
    """A 1 x 1 pass (every matmul) is costed as PopLibs' 1x1 vertex, not the nx1 one:
    the BERT FFN's busiest tile (11 input blocks, 4 output blocks, 342 positions, 57 a
    worker): 50 + 6 x (7 + 3 x 10) + 13 + 10 x (15 + 4 x (25 + 64 + 1,496)) + 11
    + 4 x (25 + 64 + 1,490) = 70,162 cycles, where the nx1 formula gave 74,727."""
    ffn = _plan(CASES[6])[1]
    assert poplibs_1x1_vertex(1, 11, 4, 342) == 70162
    assert ffn.compute_cycles == 70162
    # the nx1 formula for the same tile: 109 + 16 + 11 x (14 + 56) + 44 x (82 + 30 + 6 x
    # (17 + 16 + 57 x 4))
    assert 109 + 16 + 11 * 70 + 44 * (82 + 30 + 6 * (17 + 16 + 57 * 4)) == 74727
    # a 3 x 3 kernel, a strided 1 x 1 or packed kernel rows keep the nx1 vertex
    assert _plan(CASES[1])[1].compute_cycles == 38387 + 1824


def test_the_docs_tables_are_the_planners() -> None:
    """docs/cost-model.md's worked tables ("Worked by hand: ResNet-50 and BERT-Large")
    show, per example, the pick, its tiles, the plan's cycles and the op's: they must be
    the planner's (regenerate the rows when the planner or the fit changes)."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "cost-model.md").read_text()
    section = text.split("### Worked by hand: ResNet-50 and BERT-Large", 1)[1]
    section = section.split("\n## ", 1)[0]
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in section.splitlines()
             if line.startswith("| ") and not line.startswith("| example")]
    picks = {r[0]: r for r in cells if len(r) == 4}
    cycles = {r[0]: r for r in cells if len(r) == 8}
    assert set(picks) == set(cycles) == {c.name for c in CASES}
    for case in CASES:
        plan = _plan(case)[1]
        pick = plan.describe().split(" on ")[0]
        serial = plan.describe().split(" tiles", 1)[1]
        assert picks[case.name][2] == f"{pick}{serial} ({case.amp})"
        assert picks[case.name][3] == f"{plan.tiles:,}"
        assert cycles[case.name][6] == f"{plan.estimate:,.0f}"
        op = planned_op_cycles([plan], tile_arch(case.target, HALF), case.target.cost,
                               case.op_class != "matmul")
        assert cycles[case.name][7].startswith(f"{math.ceil(op):,} (")
