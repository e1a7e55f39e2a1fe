"""What inference runs differently (issue #29): batch norms folded into their
convolutions (an ONNX export in eval mode, PopRT), tiles kept for host streams with the
next iteration's copies overlapping this one's compute, and the C600 card PopRT's
published inference figures ran on."""

from __future__ import annotations

import numpy as np
import pytest

from popviz.compiler import compile
from popviz.options import Options
from popviz.target.machines import get_target
from tooling.calibration import plan_program


@pytest.fixture(scope="module")
def resnet18():  # plan mode: fake tensors, no compute
    return plan_program("resnet", 18, 8)


def _inference(**changes: object) -> Options:
    base = dict(target="c600", training=False, precision="16.16", half_partials=True,
                device_iterations=16)
    return Options(**{**base, **changes}).validate()  # type: ignore[arg-type]


def test_options_refuse_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="io tiles must be a whole number >= 0"):
        Options(io_tiles=-1).validate()
    with pytest.raises(ValueError, match="io tiles must be a whole number"):
        Options(io_tiles=True).validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="for inference"):
        Options(fold_batch_norms=True).validate()  # training by default
    assert Options(training=False).set_fold_batch_norms().fold_batch_norms


def test_folded_norms_are_one_bias_add_each(resnet18) -> None:
    plain = compile(resnet18, _inference()).tables["ops"]
    folded = compile(resnet18, _inference(fold_batch_norms=True)).tables["ops"]
    stats = plain["op"].str.contains("batch_norm_legit_no_training")
    bias = folded["op"] == "popviz.folded_batch_norm"
    assert stats.sum() == bias.sum() == 20  # ResNet-18's batch norms, one for one
    assert not folded["op"].str.contains("batch_norm_legit_no_training").any()
    # one per-channel broadcast add where running statistics take two (scale, shift)
    a = plain.loc[stats, "cycles"].to_numpy(np.float64)
    b = folded.loc[bias, "cycles"].to_numpy(np.float64)
    assert np.all(b < a) and b.sum() < 0.7 * a.sum()
    others = ~plain["op"].str.contains("batch_norm")
    assert plain.loc[others, "cycles"].sum() == folded.loc[~bias, "cycles"].sum()


def test_io_tiles_take_tiles_from_the_program_and_hide_host_copies(resnet18) -> None:
    none = compile(resnet18, _inference())
    io = compile(resnet18, _inference(io_tiles=32))
    assert none.meta["target"]["tiles_per_ipu"] == 1472
    assert io.meta["target"]["tiles_per_ipu"] == 1440
    # the tiles left run as fast as before: per-tile rates do not take the I/O tiles' share
    from popviz.compiler.plan_common import compute_target

    c600 = get_target("c600")
    left = compute_target(c600, 32)
    for rate in ("flops_per_tile_cycle_fp16", "memory_bytes_per_tile_cycle",
                 "exchange_bytes_per_tile_cycle"):
        assert getattr(left, rate) == pytest.approx(getattr(c600, rate))
    assert io.meta["options"]["io_tiles"] == 32

    def host(report) -> int:
        t = report.tables["trace"]
        h = t[t["kind"] == "host_io"]
        return int((h["end"] - h["start"]).sum())

    # the 16 iterations' input copies sit beside the compute: what is left is the host
    # call's own fixed cost (host_call_s) and the first iteration's copy, which no
    # compute precedes
    call = int(np.ceil(get_target("c600").host_call_cycles))
    copies = host(none) - call
    assert call < host(io) <= call + copies / 16 + 16
    assert io.summary["throughput"] > none.summary["throughput"]


def test_io_tiles_must_leave_tiles_and_are_ipu_only(resnet18) -> None:
    with pytest.raises(ValueError, match="leave no tiles"):
        compile(resnet18, _inference(io_tiles=1472))
    with pytest.raises(ValueError, match="is a GPU"):
        compile(resnet18, _inference(target="h100", io_tiles=32))
    with pytest.raises(ValueError, match="is a GPU"):
        compile(resnet18, _inference(target="h100", fold_batch_norms=True))


def test_the_c600_is_a_mk2_ipu_at_its_own_clock() -> None:
    c600, mk2 = get_target("c600"), get_target("mk2")
    assert (c600.tiles_per_ipu, c600.bytes_per_tile) == (mk2.tiles_per_ipu, mk2.bytes_per_tile)
    assert c600.clock_hz == 1.5e9
    # 280 TFLOPS over 1,472 tiles at 1.5 GHz: Mk2's 128 FLOPs a tile cycle, within 1%
    per_cycle = c600.peak_fp16_flops / (c600.tiles_per_ipu * c600.clock_hz)
    assert abs(per_cycle / 128 - 1) < 0.01
    assert c600.ipus_per_machine == 1
