"""The compiler's memory side: AMP, partials, recomputation, stash and out-of-memory tiles."""

from __future__ import annotations

import numpy as np
import pytest

from popviz.compiler import compile
from popviz.options import Options
from popviz.target import register_target
from tooling.testing.programs import synthetic_program

AMPS = [0.6, 0.4, 0.2, 0.1, 0.05, 0.02, 0.01]


@pytest.fixture(scope="module")
def small_tiles() -> str:
    # 64 tiles x 64 KiB: small enough that AMP binds on a tiny program
    register_target({"name": "test64", "base": "mk2", "tiles_per_ipu": 64,
                     "bytes_per_tile": 64 * 1024}, replace=True)
    return "test64"


@pytest.fixture(scope="module")
def convs():
    return synthetic_program(layers=8, batch=8, channels=16, hw=32)


def conv_ops(report):
    ops = report.tables["ops"]
    return ops[ops["op_class"] == "conv"].set_index("op_id")


def test_lowering_amp_never_lowers_cycles_nor_raises_temp_memory(convs, small_tiles) -> None:
    reports = [compile(convs, Options(target=small_tiles, available_memory_proportion=a))
               for a in AMPS]
    prev = None
    for amp, r in zip(AMPS, reports, strict=True):
        c = conv_ops(r)
        assert (c["amp_used"] == amp).all()
        if prev is not None:
            assert (c["cycles"] >= prev["cycles"]).all()
            assert (c["temp_bytes"] <= prev["temp_bytes"]).all()
            bound_ok = ~c["amp_ignored"]
            assert (c.loc[bound_ok, "temp_bytes"] <= amp * 64 * 1024).all()
        prev = c
    first, last = conv_ops(reports[0]), conv_ops(reports[-1])
    assert (last["cycles"] > first["cycles"]).any()
    assert (last["temp_bytes"] < first["temp_bytes"]).any()
    assert reports[-1].summary["step_cycles"] > reports[0].summary["step_cycles"]
    # below what a small conv can be split into, the planner ignores the bound
    assert reports[0].summary["amp_ignored"] == 0
    ignored = last[last["amp_ignored"]]
    all_ops = reports[-1].tables["ops"]
    assert len(ignored) > 0
    assert all_ops["amp_ignored"].sum() == reports[-1].summary["amp_ignored"]
    assert (ignored["temp_bytes"] > 0.01 * 64 * 1024).all()
    assert reports[-1].tables["stages"]["amp_ignored_ops"].sum() == \
        reports[-1].summary["amp_ignored"]


def test_amp_per_ipu_and_per_kind(convs, small_tiles) -> None:
    r = compile(convs, Options(target=small_tiles, splits=["l4"],
                               available_memory_proportion={"IPU0": 0.05, "IPU1": (0.3, 0.2)}))
    ops = r.tables["ops"]
    conv = ops["op_class"] == "conv"
    assert set(ops.loc[conv & (ops["ipu"] == 0), "amp_used"]) == {0.05}
    assert set(ops.loc[conv & (ops["ipu"] == 1), "amp_used"]) == {0.3}
    assert set(ops.loc[(ops["op_class"] == "matmul"), "amp_used"]) == {0.2}
    assert ops.loc[ops["op_class"] == "elementwise", "amp_used"].isna().all()
    assert r.tables["stages"]["amp"].tolist() == [0.05, 0.3]


def test_half_partials_are_faster_and_need_less_temporary_memory(convs, small_tiles) -> None:
    fp32 = conv_ops(compile(convs, Options(target=small_tiles, precision="16.32")))
    half = conv_ops(compile(convs, Options(target=small_tiles, precision="16.32",
                                           half_partials=True)))
    # faster wherever the AMP pipeline bounds the op (a memory-bound op gains nothing)
    assert (half["cycles"] <= fp32["cycles"]).all()
    assert (half["cycles"] < fp32["cycles"]).mean() > 0.8
    # at AMP 0.6 the planner spends the room half partials free on faster plans; the
    # leanest plans (an AMP nothing meets) show what the partials themselves take
    lean32, lean16 = (conv_ops(compile(convs, Options(
        target=small_tiles, precision="16.32", half_partials=h,
        available_memory_proportion=0.01))) for h in (False, True))
    assert (lean16["temp_bytes"] <= lean32["temp_bytes"]).all()


def test_recomputation_lowers_peak_liveness_and_raises_cycles() -> None:
    # activations large enough to matter beside the conv plans' temporaries (on a 32 x 32
    # batch-8 program one backward conv's temporaries are the peak either way)
    prog = synthetic_program(layers=8, batch=16, channels=16, hw=64)
    splits = ["l2", "l4", "l6"]  # one IPU: the splits are recomputation sections
    plain = compile(prog, Options(splits=splits, num_ipus=1))
    recomp = compile(prog, Options(splits=splits, num_ipus=1, recomputation=True))
    assert plain.summary["num_ipus"] == recomp.summary["num_ipus"] == 1
    assert recomp.summary["stage_mode"] == "sections"

    def peak_nal(r):
        return r.tables["liveness"]["not_always_live_bytes"].max()

    assert peak_nal(recomp) < 0.9 * peak_nal(plain)
    assert recomp.summary["step_cycles"] > plain.summary["step_cycles"]
    ops = recomp.tables["ops"]
    rec = ops[ops["phase"] == "recompute"]
    fwd = ops[ops["phase"] == "forward"]
    # every section but the last is recomputed, op for op
    assert sorted(rec["source_op"]) == sorted(fwd.loc[fwd["section"] < 3, "op_id"])
    assert recomp.tables["stages"]["recompute_cycles"].iloc[0] == rec["cycles"].sum()
    # each section's recompute runs right before that section's backward
    bwd = ops[ops["phase"] == "backward"]
    for sec, grp in rec.groupby("section"):
        first_b = bwd.loc[bwd["section"] == sec, "step"].min()
        later_b = bwd.loc[bwd["section"] > sec, "step"].max()
        assert later_b < grp["step"].min() and grp["step"].max() < first_b


def test_recomputation_in_a_pipeline_stashes_only_stage_inputs() -> None:
    prog = synthetic_program(layers=8, batch=4, channels=16, hw=16)
    opts = Options(splits=["l2", "l4", "l6"], gradient_accumulation=8)
    plain = compile(prog, opts)
    recomp = compile(prog, opts.copy(recomputation=True))
    p, r = plain.tables["stages"], recomp.tables["stages"]
    assert (r["stash_bytes"].iloc[:3] < p["stash_bytes"].iloc[:3]).all()
    assert (r["recompute_cycles"].iloc[:3] > 0).all() and r["recompute_cycles"].iloc[3] == 0
    # stage 1..2 stash exactly their input activation per micro-batch
    assert (r["stash_bytes_per_microbatch"].iloc[1:3] == r["boundary_bytes"].iloc[1:3]).all()
    for ipu in "012":  # the last stage is not recomputed
        assert recomp.summary["peak_liveness_bytes"][ipu] < \
            plain.summary["peak_liveness_bytes"][ipu]


def test_checkpoints_delimit_recomputation_sections() -> None:
    prog = synthetic_program(layers=6, batch=4, channels=8, hw=16, checkpoints=(1, 3))
    r = compile(prog, Options(recomputation=True))
    fwd = r.tables["ops"].query("phase == 'forward'")
    assert fwd["section"].nunique() == 3
    assert fwd.groupby("section")["layer"].last().tolist()[:2] == ["l1", "l3"]


def test_a_model_too_big_for_one_ipu_reports_oom_tiles() -> None:
    big = synthetic_program(layers=8, batch=64, channels=64, hw=64)
    r = compile(big, Options(target="mk1"))
    s = r.summary
    assert s["fits"] is False and s["oom_tiles"] > 0 and s["oom_ipus"] == [0]
    oom = r.tables["oom"]
    assert len(oom) == s["oom_tiles"] and (oom["bytes_over"] > 0).all()
    assert oom["variables"].str.contains("KiB").all()
    tm = r.tables["tile_memory"].set_index(["ipu", "tile"])
    over = tm.loc[list(zip(oom["ipu"], oom["tile"], strict=True))]
    np.testing.assert_array_equal(over["total_bytes"] - over["capacity_bytes"],
                                  oom["bytes_over"])
    # the same model over four Mk2 IPUs has room to spare
    fits = compile(big, Options(target="mk2", splits=["l2", "l4", "l6"]))
    assert fits.summary["fits"] is True and fits.tables["oom"].empty


def test_optimiser_offload_frees_always_live_memory_and_streams_state(convs) -> None:
    on = compile(convs, Options(gradient_accumulation=2))
    off = compile(convs, Options(gradient_accumulation=2, optimiser_offload=True))
    assert off.tables["tile_memory"]["always_live"].sum() < \
        on.tables["tile_memory"]["always_live"].sum()
    ex = off.tables["exchange"]
    assert {"host_in", "host_out"} <= set(ex.loc[ex["microbatch"] == -1, "kind"])


def test_liveness_steps_stay_bounded_for_long_programs(monkeypatch) -> None:
    import popviz.compiler.memory as memory

    monkeypatch.setattr(memory, "MAX_STEPS", 20)
    prog = synthetic_program(layers=8)
    r = compile(prog, Options())
    live = r.tables["liveness"]
    assert live["step"].max() < 20 and r.arrays["tile_liveness"].shape[1] < 20
    monkeypatch.setattr(memory, "MAX_STEPS", 4000)
    unbinned = compile(prog, Options())
    # a bin holds the union of its steps: never below the true peak
    assert live["not_always_live_bytes"].max() >= \
        unbinned.tables["liveness"]["not_always_live_bytes"].max()
