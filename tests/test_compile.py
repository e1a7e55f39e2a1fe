"""The compiler on small hand-built programs: contract, cycles, schedules, memory."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from popviz.compiler import compile
from popviz.options import Options
from popviz.recorder.program import OP_COLUMNS, TENSOR_COLUMNS
from popviz.target import get_target
from tooling.testing.programs import synthetic_program

CONTRACT = {
    "stages": ["stage", "ipu", "forward_cycles", "backward_cycles", "recompute_cycles",
               "exchange_cycles", "idle_cycles", "stash_bytes", "peak_bytes"],
    "trace": ["ipu", "start", "end", "kind", "stage", "microbatch", "pass", "op"],
    "liveness": ["ipu", "step", "phase", "always_live_bytes", "not_always_live_bytes"],
    "tile_memory": ["ipu", "tile", "capacity_bytes", "total_bytes", "code", "always_live",
                    "not_always_live_peak", "exchange"],
    "exchange": ["src", "dst", "bytes", "start", "end", "kind", "stage", "microbatch"],
    # ops and tensors: the program's columns first (OP_COLUMNS / TENSOR_COLUMNS), then these
    "ops": ["stage", "ipu", "cycles", "temp_bytes", "amp_used", "amp_ignored"],
    "tensors": ["stage", "ipu"],
    "variables": ["ipu", "name", "category", "bytes", "first_step", "last_step"],
    "oom": ["ipu", "tile", "bytes_over", "variables"],
}
SPLITS = ["l2", "l4", "l6"]


@pytest.fixture(scope="module")
def program():
    return synthetic_program(layers=8, batch=4, channels=16, hw=16)


@pytest.fixture(scope="module")
def pipelined(program):
    return compile(program, Options(splits=SPLITS, gradient_accumulation=8))


def busy_by_superstep(trace: pd.DataFrame) -> list[tuple[int, int]]:
    comp = trace[trace["kind"] == "compute"]
    return list(zip(comp["start"], comp["end"], strict=True))


def test_report_follows_the_contract(pipelined) -> None:
    for name, columns in CONTRACT.items():
        table = pipelined.tables[name]
        first = {"ops": OP_COLUMNS, "tensors": TENSOR_COLUMNS}.get(name, [])
        cols = list(table.columns)
        assert cols[:len(first)] == list(first), name  # the program's columns, in order
        rest = cols[len(first):]
        if name == "ops":  # compile's own columns sit between the contract's, in order
            assert [c for c in rest if c in columns] == columns, name
        else:  # the contract columns, in order, before any extra one
            assert rest[:len(columns)] == columns, name
    live = pipelined.arrays["tile_liveness"]
    assert live.dtype == np.uint32 and live.shape[0] == 4 and live.shape[2] == 1472
    assert pipelined.meta["target"]["num_ipus"] == 4
    assert pipelined.meta["target"]["tiles_per_ipu"] == 1472
    assert pipelined.meta["kind"] == "modelled"
    assert pipelined.meta["options"]["splits"] == SPLITS
    json.dumps(pipelined.summary)  # JSON-safe
    s = pipelined.summary
    assert s["fits"] is True and s["oom_tiles"] == 0 and s["total_ipus"] == 4
    assert s["samples_per_step"] == 4 * 8
    assert s["throughput"] == pytest.approx(32 / s["step_seconds"])
    tm = pipelined.tables["tile_memory"]
    cats = tm[["code", "always_live", "not_always_live_peak", "exchange",
               "vertex_state"]].sum(axis=1)
    assert (tm["total_bytes"] == cats).all()
    trace = pipelined.tables["trace"]
    assert trace.equals(trace.sort_values(["ipu", "start"], kind="stable"))
    assert set(trace["kind"]) <= {"compute", "exchange", "sync", "host_io", "idle"}


def test_trace_covers_each_ipu_without_gaps_or_overlaps(pipelined) -> None:
    step = pipelined.summary["step_cycles"]
    for _, ev in pipelined.tables["trace"].groupby("ipu"):
        assert ev["start"].iloc[0] == 0 and ev["end"].iloc[-1] == step
        assert (ev["start"].to_numpy()[1:] == ev["end"].to_numpy()[:-1]).all()


def test_cycles_add_up_per_stage(pipelined) -> None:
    ops, stages = pipelined.tables["ops"], pipelined.tables["stages"]
    m = 8
    for (stage, phase), cyc in ops.groupby(["stage", "phase"])["cycles"].sum().items():
        row = stages.loc[stages["stage"] == stage].iloc[0]
        col = {"forward": "forward_cycles", "backward": "backward_cycles",
               "optimiser": "optimiser_cycles"}[phase]
        assert row[col] == cyc * (1 if phase == "optimiser" else m), (stage, phase)
    trace = pipelined.tables["trace"]
    comp = trace[trace["kind"] == "compute"]
    per_ipu = (comp["end"] - comp["start"]).groupby(comp["ipu"]).sum()
    expected = stages.groupby("ipu")[["forward_cycles", "backward_cycles", "recompute_cycles",
                                      "optimiser_cycles"]].sum().sum(axis=1)
    pd.testing.assert_series_equal(per_ipu, expected, check_names=False)
    # per IPU, compute + exchange + idle (with sync) is the whole step
    totals = stages[["forward_cycles", "backward_cycles", "recompute_cycles",
                     "optimiser_cycles", "exchange_cycles", "idle_cycles"]].sum(axis=1)
    assert (totals == pipelined.summary["step_cycles"]).all()


@pytest.mark.parametrize(("schedule", "strategy", "depth"), [
    ("Grouped", "pipelined", [7, 5, 3, 0]),  # PopART: 2 x (IPUs after this one) + 1
    ("Interleaved", "pipelined", [4, 3, 2, 0]),
    ("Sequential", "pipelined", [1, 1, 1, 0]),
    ("Grouped", "sharded", [1, 1, 1, 0]),
])
def test_stash_depth_per_stage_matches_the_schedule(program, schedule, strategy,
                                                     depth) -> None:
    r = compile(program, Options(splits=SPLITS, gradient_accumulation=16, schedule=schedule,
                                 strategy=strategy))
    assert r.tables["stages"]["stash_depth"].tolist() == depth
    per_mb = r.tables["stages"]["stash_bytes_per_microbatch"].to_numpy()
    assert (r.tables["stages"]["stash_bytes"].to_numpy() == per_mb * np.array(depth)).all()
    assert (per_mb[:3] > 0).all()


def test_grouped_stashes_more_and_runs_faster_than_interleaved_when_uneven() -> None:
    prog = synthetic_program(layers=8, batch=4, channels=16, hw=16)
    opts = Options(splits=["l1", "l2", "l3"], gradient_accumulation=16)  # uneven stages
    grouped = compile(prog, opts)
    inter = compile(prog, opts.copy(schedule="Interleaved"))
    assert grouped.tables["stages"]["stash_bytes"].sum() > \
        inter.tables["stages"]["stash_bytes"].sum()
    assert grouped.summary["step_cycles"] < inter.summary["step_cycles"]


def _busiest(compute: pd.DataFrame) -> int:
    return int((compute["end"] - compute["start"]).groupby(compute["ipu"]).sum().max())


def test_a_grouped_clock_runs_every_forward_then_every_backward(pipelined) -> None:
    # TensorFlow's Grouped schedule: "the pipelined stages are either all running their
    # forward pass or all running their backward pass" (graphcore/tutorials, pipelining):
    # in each clock every recompute and backward starts after the slowest forward and a
    # sync, and the clock is the slowest forward plus the slowest recompute + backward
    trace = pipelined.tables["trace"]
    sync = get_target("mk2").sync_cycles
    checked = 0
    for _, step in trace.groupby("superstep"):
        comp = step[step["kind"] == "compute"]
        fwd, back = comp[comp["pass"] == "F"], comp[comp["pass"].isin(["R", "B"])]
        if fwd.empty or back.empty:
            continue
        f_end = fwd["end"].max()
        assert back["start"].min() == f_end + sync
        mid = step[(step["kind"] == "sync") & (step["start"] == f_end)]
        assert sorted(mid["ipu"]) == [0, 1, 2, 3]
        assert f_end - comp["start"].min() == _busiest(fwd)
        assert back["end"].max() - back["start"].min() == _busiest(back)
        checked += 1
    assert checked >= 8  # every clock of the main phase
    inter = compile(synthetic_program(layers=8, batch=4, channels=16, hw=16),
                    Options(splits=SPLITS, gradient_accumulation=8, schedule="Interleaved"))
    assert (inter.tables["trace"]["kind"] == "sync").sum() < (trace["kind"] == "sync").sum()


def test_sharded_never_overlaps_compute_across_ipus(program) -> None:
    r = compile(program, Options(splits=SPLITS, gradient_accumulation=4, strategy="sharded"))
    spans = sorted(busy_by_superstep(r.tables["trace"]))
    assert len({ipu for ipu in r.tables["trace"]["ipu"]}) == 4
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end


def test_pipeline_overlaps_compute_after_ramp_up(pipelined) -> None:
    trace = pipelined.tables["trace"]
    comp = trace[trace["kind"] == "compute"]
    t = np.sort(np.unique(np.r_[comp["start"], comp["end"]]))
    mid = (t[:-1] + t[1:]) / 2
    active = ((comp["start"].to_numpy()[None, :] <= mid[:, None]) &
              (mid[:, None] < comp["end"].to_numpy()[None, :]))
    ipus = comp["ipu"].to_numpy()
    n_busy = np.array([len(set(ipus[row])) for row in active])
    assert n_busy.max() == 4  # all four IPUs compute at once in the main phase
    first_all = mid[np.argmax(n_busy == 4)]
    first_f3 = comp[(comp["ipu"] == 3)]["start"].min()
    assert first_all >= first_f3  # ... but only once the ramp-up reached the last IPU


def test_idle_at_sync_is_the_gap_to_the_slowest_ipu(pipelined) -> None:
    trace = pipelined.tables["trace"]
    syncs = trace[trace["kind"] == "sync"]
    checked = 0
    for sync_start in sorted(set(syncs["start"])):
        prev = syncs[syncs["end"] <= sync_start]["end"].max()
        lo = 0 if pd.isna(prev) else prev
        window = trace[(trace["start"] >= lo) & (trace["end"] <= sync_start)]
        # the superstep's compute starts after the previous exchange: take the last phase
        comp = window[window["kind"] == "compute"]
        if comp.empty:
            continue
        phase_start = comp["start"].min()
        busy = (comp["end"] - comp["start"]).groupby(comp["ipu"]).sum().reindex(range(4),
                                                                               fill_value=0)
        idle = window[(window["kind"] == "idle") & (window["start"] >= phase_start)]
        idle = (idle["end"] - idle["start"]).groupby(idle["ipu"]).sum().reindex(
            range(4), fill_value=0)
        assert ((busy + idle) == busy.max()).all()
        assert sync_start - phase_start == busy.max()
        checked += 1
    assert checked > 8


def test_unknown_split_names_raise_listing_the_valid_names(program) -> None:
    with pytest.raises(ValueError, match=r"unknown pipeline split name\(s\) l99; valid: l0, l1"):
        compile(program, Options(splits=["l2", "l99"]))
    with pytest.raises(ValueError, match="4 IPUs need 3 pipeline split names, got 1"):
        compile(program, Options(splits=["l2"], num_ipus=4))
    with pytest.raises(ValueError, match="not in forward order"):
        compile(program, Options(splits=["l4", "l2"]))


def test_determinism_two_compiles_give_identical_tables(program) -> None:
    opts = Options(splits=SPLITS, gradient_accumulation=4, recomputation=True,
                   available_memory_proportion={"IPU0": 0.1})
    a, b = compile(program, opts), compile(program, opts)
    for name in a.tables:
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name])
    np.testing.assert_array_equal(a.arrays["tile_liveness"], b.arrays["tile_liveness"])
    assert a.summary == b.summary


def test_fp32_costs_more_than_fp16(program) -> None:
    half = compile(program, Options(splits=SPLITS, precision="16.16"))
    full = compile(program, Options(splits=SPLITS, precision="32.32"))
    assert full.summary["step_cycles"] > half.summary["step_cycles"]
    h, f = half.tables["ops"], full.tables["ops"]
    conv = h["op_class"] == "conv"
    # each conv is planned anew: a tiny, overhead-bound one may find an fp32 partition a
    # hair quicker (wider output blocks); together the convs cost clearly more
    assert (f.loc[conv, "cycles"] >= 0.95 * h.loc[conv, "cycles"]).all()
    assert f.loc[conv, "cycles"].sum() > 1.2 * h.loc[conv, "cycles"].sum()
    assert full.summary["peak_liveness_bytes"]["0"] > half.summary["peak_liveness_bytes"]["0"]


def test_inference_is_forward_only_with_latency(program) -> None:
    r = compile(program, Options(splits=SPLITS, training=False, device_iterations=4))
    trace = r.tables["trace"]
    assert set(trace.loc[trace["kind"] == "compute", "pass"]) == {"F"}
    assert r.summary["latency_ms"] > 0
    assert r.summary["samples_per_step"] == 16
    assert (r.tables["stages"]["backward_cycles"] == 0).all()
    assert (r.tables["stages"]["stash_bytes"] == 0).all()


def test_replicas_all_reduce_gradients_before_the_weight_update(program) -> None:
    one = compile(program, Options(splits=SPLITS, gradient_accumulation=4))
    two = compile(program, Options(splits=SPLITS, gradient_accumulation=4,
                                   replication_factor=2))
    ex = two.tables["exchange"]
    ar = ex[ex["kind"] == "allreduce"]
    assert len(ar) == 4 and (ar["bytes"] > 0).all()
    tr = two.tables["trace"]
    wu_start = tr.loc[tr["pass"] == "WU", "start"].min()
    assert (ar["end"] <= wu_start).all()
    assert two.summary["total_ipus"] == 8
    assert two.summary["samples_per_step"] == 2 * one.summary["samples_per_step"]
    assert two.summary["step_cycles"] > one.summary["step_cycles"]
    assert one.tables["exchange"].query("kind == 'allreduce'").empty


def test_exchange_crosses_each_stage_boundary(pipelined) -> None:
    ex = pipelined.tables["exchange"]
    act = ex[ex["kind"] == "activation"]
    grad = ex[ex["kind"] == "gradient"]
    assert sorted({(int(s), int(d)) for s, d in zip(act["src"], act["dst"], strict=True)}) == \
        [(0, 1), (1, 2), (2, 3)]
    assert sorted({(int(s), int(d)) for s, d in zip(grad["src"], grad["dst"], strict=True)}) \
        == [(1, 0), (2, 1), (3, 2)]
    assert len(act) == 3 * 8 and len(ex[ex["kind"] == "host_in"]) == 8
    assert (ex["end"] > ex["start"]).all()


def test_tile_liveness_sums_to_the_liveness_curve(pipelined) -> None:
    live = pipelined.tables["liveness"]
    arr = pipelined.arrays["tile_liveness"]
    for ipu, grp in live.groupby("ipu"):
        per_step = arr[ipu, grp["step"].to_numpy()].sum(axis=1, dtype=np.int64)
        np.testing.assert_allclose(per_step, grp["not_always_live_bytes"], rtol=1e-3, atol=2000)
    tm = pipelined.tables["tile_memory"]
    np.testing.assert_array_equal(tm["not_always_live_peak"].to_numpy().reshape(4, -1),
                                  arr.max(axis=1))


def test_stages_from_blocks_and_from_explicit_stage_lists() -> None:
    prog = synthetic_program(layers=8, blocks=4)
    per_block = compile(prog, Options())
    assert per_block.summary["num_ipus"] == 4 and per_block.summary["stage_mode"] == "blocks"
    explicit = compile(prog, Options(stages=[["B0", "B1"], ["B2", "B3"]]))
    assert explicit.tables["stages"]["ipu"].tolist() == [0, 1]
    assert explicit.tables["stages"]["first_layer"].tolist() == ["l0", "l4"]
    with pytest.raises(ValueError, match="not in the program"):
        compile(prog, Options(stages=[["B0"], ["B9"]]))
    single = compile(synthetic_program(layers=4), Options())
    assert single.summary["num_ipus"] == 1 and single.summary["stage_mode"] == "single"


def test_device_iterations_repeat_the_weight_update(program) -> None:
    one = compile(program, Options(splits=SPLITS, gradient_accumulation=4))
    three = compile(program, Options(splits=SPLITS, gradient_accumulation=4,
                                     device_iterations=3))
    assert three.summary["samples_per_step"] == 3 * one.summary["samples_per_step"]
    wu = three.tables["trace"].query("kind == 'compute'")
    assert (wu["pass"] == "WU").sum() == 3 * 4
    assert set(wu["microbatch"]) >= set(range(12))
    # the host call's fixed cost and the first iteration's prelude come once per call
    call = math.ceil(get_target("mk2").host_call_cycles)
    assert 2.9 * (one.summary["step_cycles"] - call) < three.summary["step_cycles"] - call < \
        3 * (one.summary["step_cycles"] - call)


def test_other_micro_batches_stash_is_live_at_every_step(pipelined) -> None:
    live, st = pipelined.tables["liveness"], pipelined.tables["stages"]
    for _, row in st.iterrows():
        extra = (row["stash_depth"] - 1) * row["stash_bytes_per_microbatch"]
        lowest = live.loc[live["ipu"] == row["ipu"], "not_always_live_bytes"].min()
        assert lowest >= max(extra, 0)
    assert st["stash_bytes"].iloc[0] > st["stash_bytes"].iloc[1] > st["stash_bytes"].iloc[2]


def test_popviz_compile_stays_a_function_after_a_submodule_import() -> None:
    import popviz
    import popviz.compiler.report  # the package is popviz.compiler: nothing is hidden

    r = popviz.compile(synthetic_program(layers=2), Options())
    assert r.summary["fits"] is True


def test_ramp_up_main_ramp_down_and_update_phases(program) -> None:
    r = compile(program, Options(splits=SPLITS, gradient_accumulation=8, replication_factor=2))
    s = r.summary
    phases = ("ramp_up", "main", "ramp_down", "update")
    assert sum(s[f"{p}_cycles"] for p in phases) == s["step_cycles"]
    trace = r.tables["trace"]
    per_step = trace[trace["ipu"] == 0].groupby("superstep")["schedule_phase"].first()
    # N = 4 stages, M = 8: 3 clocks fill the pipe (+ the host prelude), 8 run all stages,
    # 3 drain it, then all-reduce and weight update
    assert per_step.tolist() == ["ramp_up"] * 4 + ["main"] * 8 + ["ramp_down"] * 3 + \
        ["update"] * 2
    main = trace[(trace["schedule_phase"] == "main") & (trace["kind"] == "compute")]
    assert set(main["ipu"]) == {0, 1, 2, 3}


def test_schedule_ir_has_f_r_b_wu_actions_per_stage_and_microbatch() -> None:
    from popviz.compiler.schedule import build_schedule

    sch = build_schedule(3, 4, 1, True, "Grouped", 1, True, np.array([True, True, False]))
    a = sch.actions
    counts = a.groupby(["stage", "pass"]).size().unstack(fill_value=0)
    assert counts.loc[0].to_dict() == {"B": 4, "F": 4, "R": 4, "WU": 1}
    assert counts.loc[2, "R"] == 0
    # R runs in the same superstep as its B, right before it
    r = a[a["pass"] == "R"].set_index(["stage", "microbatch"])
    b = a[a["pass"] == "B"].set_index(["stage", "microbatch"]).loc[r.index]
    assert (r["superstep"] == b["superstep"]).all()
    pos = {(st, mb, p): i for i, (st, mb, p) in enumerate(zip(a["stage"], a["microbatch"],
                                                               a["pass"], strict=True))}
    assert all(pos[(st, mb, "R")] + 1 == pos[(st, mb, "B")] for st, mb in r.index)
    assert sch.stash_depth.tolist() == [4, 3, 0]  # 2 x 2 + 1 = 5, but only 4 micro-batches
