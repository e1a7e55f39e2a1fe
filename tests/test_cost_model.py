"""The CostModel's constants, its fixed costs and the tile mapping they feed (small programs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from popviz.compiler import compile
from popviz.options import Options
from popviz.target import get_target, register_target
from popviz.target.cost import Precision, op_costs
from popviz.target.costmodel import DEFAULT_COST, KINDS, PROVENANCE, CostModel
from tooling.calibration import BOUNDS, FITTED
from tooling.testing.programs import synthetic_program

MK2 = get_target("mk2")


def test_every_constant_has_a_known_kind_and_a_reason() -> None:
    for name, p in PROVENANCE.items():
        assert p.kind in KINDS and len(p.note) > 20, name
    fitted = {n for n, p in PROVENANCE.items() if p.kind == "fitted"}
    # the three efficiencies are fitted to the published hardware points (tooling's FITTED);
    # the compute sets' start-up to PopLibs' own simulation of its layers, and says so
    assert fitted - {"plan_compute_set_cycles"} \
        == {"amp_efficiency", "conv_efficiency", "vector_efficiency"} \
        == set(FITTED) == set(BOUNDS)
    assert "bench/bench_poplibs_layers.py --fit" in PROVENANCE["plan_compute_set_cycles"].note
    assert "not to the hardware points" in PROVENANCE["plan_compute_set_cycles"].note


def test_no_fitted_factor_contradicts_its_source() -> None:
    """Each fitted factor is a fraction of PopLibs' own estimate (a plan's, a vertex's):
    bounded to [0.7, 1] (issue #29; docs/cost-model.md says why), its provenance says
    so, and the committed fit lies inside."""
    for name in FITTED:
        low, high = BOUNDS[name]
        assert 0.7 <= low < high <= 1.0, name
        assert "[0.7, 1]" in PROVENANCE[name].note, name
        assert low <= getattr(DEFAULT_COST, name) <= high, name
    for t in ("mk1", "mk2", "bow"):
        assert get_target(t).cost == get_target("mk2").cost


def test_host_call_cost_sets_a_floor_under_small_batch_latency() -> None:
    prog = synthetic_program(layers=2, batch=1, channels=8, hw=8)
    fast = compile(prog, Options(training=False))
    register_target({"name": "mk2-slow-call", "base": "mk2", "host_call_s": 1e-3},
                    replace=True)
    slow = compile(prog, Options(training=False, target="mk2-slow-call"))
    assert slow.summary["latency_ms"] >= 1.0
    extra = slow.summary["step_cycles"] - fast.summary["step_cycles"]
    assert extra == math.ceil(1e-3 * MK2.clock_hz) - math.ceil(MK2.host_call_cycles)
    io = slow.tables["trace"].query("kind == 'host_io'")
    assert io["end"].sub(io["start"]).max() >= 1e-3 * MK2.clock_hz


def test_op_and_sync_fixed_costs_add_per_op_and_per_superstep() -> None:
    prog = synthetic_program(layers=4, batch=2, channels=8, hw=8)
    base = compile(prog, Options(splits=["l2"], gradient_accumulation=4))
    register_target({"name": "mk2-slow-sync", "base": "mk2", "sync_cycles": 10600},
                    replace=True)
    slow = compile(prog, Options(splits=["l2"], gradient_accumulation=4,
                                 target="mk2-slow-sync"))
    trace = base.tables["trace"]
    supersteps = trace["superstep"].nunique()
    # a Grouped clock syncs twice: after its forwards and at its end
    compute = trace[trace["kind"] == "compute"]
    passes = compute.groupby("superstep")["pass"].agg(set)
    grouped = sum(1 for p in passes if "F" in p and p & {"R", "B"})
    assert grouped == 4  # 2 stages, 4 micro-batches: clocks 1-4 run both
    assert slow.summary["step_cycles"] - base.summary["step_cycles"] == \
        10000 * (supersteps + grouped)
    busy = op_costs(prog.ops.assign(op_class="elementwise", flops=1, bytes_read=2,
                                    bytes_written=2), MK2, Precision.parse("16.16", True),
                    np.full(len(prog.ops), 0.6))
    assert (busy["cycles"] >= MK2.cost.sync_cycles_internal).all()


@pytest.fixture(scope="module")
def mapped():
    register_target({"name": "test256", "base": "mk2", "tiles_per_ipu": 256,
                     "bytes_per_tile": 256 * 1024}, replace=True)
    prog = synthetic_program(layers=6, batch=2, channels=16, hw=16)
    return prog, compile(prog, Options(target="test256"))


def test_tile_memory_is_uneven_and_state_sits_where_ops_run(mapped) -> None:
    _, report = mapped
    tm = report.tables["tile_memory"]
    assert tm["total_bytes"].max() > 1.05 * tm["total_bytes"].min()
    ops = report.tables["ops"]
    assert (ops["tiles_used"] < 256).any()  # small ops leave tiles free
    # vertex state per op per tile, summed over ops, is what the column holds in all
    assert tm["vertex_state"].sum() == pytest.approx(
        (ops.loc[ops["source_op"] < 0, "tiles_used"]
         * MK2.cost.vertex_state_bytes_per_op_per_tile).sum(), rel=1e-3)
    names = report.tables["variables"]["category"]
    assert (names == "exchange_buffer").any() and (names == "temporary").any()


def test_an_oom_just_over_the_limit_names_a_subset_of_tiles(mapped) -> None:
    prog, report = mapped
    totals = report.tables["tile_memory"]["total_bytes"]
    capacity = int(totals.quantile(0.9))
    register_target({"name": "test256-tight", "base": "mk2", "tiles_per_ipu": 256,
                     "bytes_per_tile": capacity}, replace=True)
    tight = compile(prog, Options(target="test256-tight"))
    oom = tight.tables["oom"]
    assert 0 < len(oom) < 256 * 0.2
    assert set(oom["tile"]) == set(np.flatnonzero(totals.to_numpy() > capacity))
    assert oom["variables"].str.len().gt(0).all()
    assert not tight.summary["fits"]


def test_cost_model_rejects_unknown_constants() -> None:
    with pytest.raises(ValueError, match="unknown cost model constants"):
        CostModel().with_values(flux=1.0)
