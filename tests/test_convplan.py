"""The PopLibs-style planner (popviz/target/convplan.py), its vertex estimates worked by
hand from the formulas in docs/cost-model.md (PopLibs' PerformanceEstimation.hpp), and the
convolution passes read from recorded shapes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from popviz.target import get_target
from popviz.target.convparams import (
    BWD,
    FWD,
    WU,
    ConvParams,
    conv_passes,
    matmul_passes,
    op_passes,
)
from popviz.target.convplan import plan_conv
from popviz.target.cost import Precision, op_costs, tile_arch
from popviz.target.vertices import (
    amp_cycles,
    amp_worker_cycles,
    reduce_cycles,
    zero_cycles,
)

MK2 = get_target("mk2")
HALF = Precision.parse("16.16", half_partials=True)
FLOAT_PARTIALS = Precision.parse("16.16", half_partials=False)
ARCH = tile_arch(MK2, HALF)


def test_tile_figures_follow_the_published_peaks() -> None:
    # Mk2 half partials: 16 units x 16-weight chains / 4 cycles = 64 MACs = 128 FLOPs/cycle
    assert (ARCH.units, ARCH.weights_per_unit, ARCH.core) == (16, 16, 4)
    assert 2 * ARCH.amp_macs_per_cycle * MK2.tiles_per_ipu * MK2.clock_hz == \
        pytest.approx(MK2.peak_fp16_flops, rel=0.01)
    # float partials: the 8-unit vertices, half the rate; Mk1 has 8 units either way
    assert tile_arch(MK2, FLOAT_PARTIALS).units == 8
    assert tile_arch(get_target("mk1"), HALF).units == 8
    fp32 = tile_arch(MK2, Precision.parse("32.32", False))
    assert 2 * fp32.amp_macs_per_cycle * MK2.tiles_per_ipu * MK2.clock_hz == \
        pytest.approx(MK2.peak_fp32_flops, rel=0.01)
    assert ARCH.slic and not tile_arch(get_target("mk1"), HALF).slic
    # 8 TB/s over 1,472 tiles at 1.33 GHz: about 4 bytes per tile per cycle
    assert ARCH.exchange_bytes_per_cycle == pytest.approx(4.09, abs=0.01)


def test_amp_vertex_cycles_by_hand() -> None:
    # one tile: 2 groups, 4 input-channel blocks, 3 output blocks, 9 kernel positions;
    # 60 output rows of 56 positions (3,360). Worker: 17 + ceil(60/6) x (3+34-9-12)
    # + ceil(3360/6) x 4 = 17 + 160 + 2240 = 2417
    assert int(amp_worker_cycles(ARCH, 60, 3360)) == 2417
    # weight block: 16 units x 16 weights x 2 B / 8 B per cycle + 18 = 82
    blocks = 2 * 4 * 3 * 9
    loops = 2 * (16 + 4 * (14 + 14 * 3))
    expected = 109 + loops + blocks * (82 + 30 + 6 * 2417)
    assert int(amp_cycles(ARCH, 2, 4, 3, 9, 60, 3360)) == expected


def test_zeroing_and_reduction_by_hand() -> None:
    # 3 output blocks of 1,000 partials: per worker ceil(1000/6) = 167, /2 -> 84, + 5
    assert int(zero_cycles(ARCH, 3000, 3)) == 6 * (84 + 5) * 3
    # half partials: accumulators of 8; 1,000 outputs -> 125 vectors -> 21 per worker;
    # depth 4: 6 x (20 + (2 x 3 + 8) x 21) + 33
    assert int(reduce_cycles(ARCH, 1000, 4)) == 6 * (20 + 14 * 21) + 33
    assert int(reduce_cycles(ARCH, 1000, 1)) == 0


def test_conv_passes_from_recorded_shapes() -> None:
    fwd = conv_passes("aten.convolution.default", "[16,3,224,224];[64,3,7,7]",
                      "[16,64,112,112]", 0)
    assert fwd == [ConvParams(16, 1, 3, 64, (112, 112), (7, 7), (2, 2), FWD)]
    # a backward that computes both gradients (FLOPs = 2 passes)
    macs = 16 * 56 * 56 * 64 * 64 * 9
    both = conv_passes("aten.convolution_backward.default",
                       "[16,64,56,56];[16,64,56,56];[64,64,3,3]", "[16,64,56,56]",
                       2 * 2 * macs)
    assert [p.kind for p in both] == [BWD, WU]
    assert all(p.macs == macs for p in both)
    wu = both[1]
    assert (wu.batch, wu.in_chans, wu.out_chans) == (64 * 9, 16 * 56 * 56, 64)
    # the stem's backward computes only the weight gradient
    stem = conv_passes("aten.convolution_backward.default",
                       "[16,64,112,112];[16,3,224,224];[64,3,7,7]", "[64,3,7,7]",
                       2 * 16 * 112 * 112 * 64 * 3 * 49)
    assert [p.kind for p in stem] == [WU]
    depthwise = conv_passes("aten.convolution.default", "[5,48,190,190];[48,1,3,3]",
                            "[5,48,190,190]", 0)[0]
    assert (depthwise.groups, depthwise.in_chans, depthwise.out_chans) == (48, 1, 1)


def test_matmuls_are_one_by_one_convolutions() -> None:
    (p,) = matmul_passes("aten.addmm.default", "[1000];[16,2048];[2048,1000]", 0)
    assert (p.batch, p.groups, p.in_chans, p.out_chans, p.kernel) == (16, 1, 2048, 1000,
                                                                       (1, 1))
    (b,) = matmul_passes("aten.bmm.default", "[64,128,64];[64,64,128]", 0)
    assert (b.batch, b.groups, b.in_chans, b.out_chans) == (128, 64, 64, 128)


def test_a_plan_covers_the_convolution_within_the_tiles() -> None:
    p = conv_passes("aten.convolution.default", "[16,64,56,56];[64,64,3,3]",
                    "[16,64,56,56]", 0)[0]
    plan = plan_conv(p, ARCH, 0.6)
    b, h, w, g, i, o = plan.partition
    assert b * h * w * g * i * o == plan.tiles <= ARCH.tiles
    assert plan.temp_bytes <= 0.6 * ARCH.bytes_per_tile and not plan.ignored
    # the busiest tile cannot beat the AMP peak spread over the tiles used
    assert plan.cycles >= p.macs / (plan.tiles * ARCH.amp_macs_per_cycle)
    # ... and a real plan reaches a useful fraction of it
    assert p.macs / (plan.cycles * ARCH.tiles * ARCH.amp_macs_per_cycle) > 0.3


def test_a_three_channel_stem_packs_kernel_rows_into_the_amp_blocks() -> None:
    stem = conv_passes("aten.convolution.default", "[16,3,224,224];[64,3,7,7]",
                       "[16,64,112,112]", 0)[0]
    plan = plan_conv(stem, ARCH, 0.6)
    assert plan.method == "amp4"  # 4 channels x 4 kernel rows per weight block
    efficiency = stem.macs / (plan.cycles * ARCH.tiles * ARCH.amp_macs_per_cycle)
    assert 0.2 < efficiency < 0.75  # 3 of 4 channels, 7 of 8 rows at best


def test_lower_amp_never_speeds_up_and_bounds_the_temporaries() -> None:
    rng = np.random.default_rng(1)
    for _ in range(12):
        cin, cout = int(rng.choice([16, 64, 256, 512])), int(rng.choice([64, 256, 1024]))
        hw, batch = int(rng.choice([7, 14, 28, 56])), int(rng.choice([4, 16, 32]))
        p = ConvParams(batch, 1, cin, cout, (hw, hw), (3, 3), (1, 1), FWD)
        previous = None
        for amp in (0.6, 0.3, 0.15, 0.1, 0.05):
            plan = plan_conv(p, ARCH, amp)
            if not plan.ignored:
                assert plan.temp_bytes <= amp * ARCH.bytes_per_tile
            if previous is not None and not plan.ignored:
                assert plan.cycles >= previous.cycles - 1e-6
            previous = plan


def test_a_tight_bound_forces_serial_slices_and_costs_cycles() -> None:
    big = ConvParams(16, 1, 128, 128, (56, 56), (3, 3), (1, 1), FWD)
    free, tight = plan_conv(big, ARCH, 0.6), plan_conv(big, ARCH, 0.05)
    assert free.serial[1] == 1
    assert tight.serial[1] > 1 and not tight.ignored
    assert tight.temp_bytes < free.temp_bytes and tight.cycles > free.cycles


def test_an_op_that_cannot_fit_ignores_the_bound() -> None:
    # 3.3 G outputs: megabytes of partials on every tile, whatever the partition
    huge = ConvParams(64, 1, 16, 4096, (112, 112), (1, 1), (1, 1), FWD)
    plan = plan_conv(huge, ARCH, 0.05)
    assert plan.ignored and plan.temp_bytes > 0.05 * ARCH.bytes_per_tile
    # the leanest plan is taken: half partials take less room than float ones
    floats = plan_conv(huge, tile_arch(MK2, FLOAT_PARTIALS), 0.05)
    assert floats.ignored and plan.temp_bytes < floats.temp_bytes


def test_depthwise_convolutions_use_slic_on_mk2_and_hmac_on_mk1() -> None:
    dw = conv_passes("aten.convolution.default", "[5,48,190,190];[48,1,3,3]",
                     "[5,48,190,190]", 0)[0]
    assert plan_conv(dw, ARCH, 0.6).method == "slic"
    mk1 = tile_arch(get_target("mk1"), HALF)
    assert plan_conv(dw, mk1, 0.6).method == "hmac"


def test_half_partials_speed_up_convolutions_on_mk2() -> None:
    rows = pd.DataFrame([{"op": "aten.convolution.default", "op_class": "conv",
                          "phase": "forward", "flops": 2 * 16 * 56 * 56 * 256 * 64,
                          "bytes_read": 1, "bytes_written": 1,
                          "shapes": "[16,64,56,56];[256,64,1,1]",
                          "out_shape": "[16,256,56,56]", "dtype": "float16"}])
    half = op_costs(rows, MK2, HALF, np.array([0.6]))["cycles"].iloc[0]
    floats = op_costs(rows, MK2, FLOAT_PARTIALS, np.array([0.6]))["cycles"].iloc[0]
    assert floats > 1.4 * half


def test_a_rescaled_batch_scales_the_plan() -> None:
    row = {"op": "aten.convolution.default", "op_class": "conv", "phase": "forward",
           "bytes_read": 1, "bytes_written": 1, "shapes": "[16,64,56,56];[64,64,3,3]",
           "out_shape": "[16,64,56,56]", "dtype": "float16"}
    macs = 16 * 56 * 56 * 64 * 64 * 9
    table = pd.DataFrame([{**row, "flops": 2 * macs}, {**row, "flops": 4 * 2 * macs}])
    c = op_costs(table, MK2, HALF, np.array([0.6, 0.6]))["cycles"].to_numpy()
    # four times the batch: more cycles, a little under four times (overheads amortised)
    assert 2.0 < c[1] / c[0] < 4.5
    assert math.isclose(c[0], op_costs(table.iloc[:1], MK2, HALF,
                                       np.array([0.6]))["cycles"].iloc[0])


def test_weight_update_passes_reduce_over_the_batch() -> None:
    fwd = ConvParams(16, 1, 64, 64, (56, 56), (3, 3), (1, 1), FWD)
    from popviz.target.convparams import weight_update

    wu = weight_update(fwd)
    assert wu.kind == WU and wu.macs == fwd.macs
    plan = plan_conv(wu, ARCH, 0.6)
    assert plan.cycles >= wu.macs / (ARCH.tiles * ARCH.amp_macs_per_cycle)


def _parsed_flops(program) -> int:
    ops = program.ops[program.ops["op_class"].isin(["conv", "matmul"])]
    return sum(2 * sum(p.macs for p in op_passes(r.op, r.op_class, r.shapes, r.out_shape,
                                                 r.flops)) for r in ops.itertuples())


def test_passes_read_from_shapes_match_torch_flop_counter() -> None:
    """The planner's passes, read from the recorded shapes alone (not from the recorder's
    FLOPs), hold the MACs torch.utils.flop_counter counts for the same step: a ResNet and
    a HuggingFace GPT-2 called with keyword arguments (strided convs, bmm, addmm)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from popviz.models import build
    from popviz.models.training import train_step
    from popviz.recorder import record_program

    torch.manual_seed(0)
    net = build("resnet", 18, num_classes=10, image_size=32)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    with FlopCounterMode(display=False) as counter:
        train_step(net, opt, x, y)
    program = record_program(train_step, net, opt, x, y, model=net, progress=False)
    assert _parsed_flops(program) == counter.get_total_flops()

    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=32))
    ids = torch.randint(0, 500, (2, 32))

    def step(model, tokens):
        model(input_ids=tokens, labels=tokens).loss.backward()

    with FlopCounterMode(display=False) as counter:
        step(gpt2, ids)
    gpt2.zero_grad()
    program = record_program(step, gpt2, ids, model=gpt2, progress=False)
    assert _parsed_flops(program) == counter.get_total_flops()


def test_slic_cycles_are_poplibs_estimate_by_hand() -> None:
    """graphcore/poplibs 7eac0f2 PerformanceEstimation.hpp, half inputs and partials, four
    conv chains: one block of 4 one-channel groups, one 1 x 4 window, 6 rows of 20."""
    from popviz.target.vertices import slic_cycles

    # worker: preamble 17 + one row (10 + 1 zeroing + 15 + (20 - 5)) = 58, x 6 workers
    inner = 6 * (17 + (10 + 1 + 15 + 15))
    weight_load = 9 + 6 + 10 * 6 + 6 + 16  # one-channel groups rearranged by the workers
    supervisor = 28 + 15 + 1 + (weight_load + 20) + 1  # preamble, group block, window
    assert int(slic_cycles(ARCH, 1, 4, 1, 6, 120)) == supervisor + inner == 510
    # 16 groups a block: the non-zeroing windows run once per 4 groups
    one = slic_cycles(ARCH, 1, 16, 3, 6, 120)
    per_window = 6 * (21 + (10 + 15 + 15)) * 4
    assert one > 2 * per_window
    # about one tile cycle per output per 4 groups per window: 16 groups x 3 x 3 taps
    # over 16 x 48 outputs reach 6-12 MACs a cycle (12: three of four taps used)
    big = slic_cycles(ARCH, 1, 16, 3, 16, 16 * 48)
    assert 6 < 16 * 9 * 16 * 48 / big < 12
