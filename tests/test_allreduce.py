"""The gradient all-reduce: a ring over IPU-Links in a rack, hierarchical across racks
(GW-Links), hand-worked from the published link figures."""

from __future__ import annotations

import pytest

from popviz.target.machines import BOW, MK1, MK2


def test_one_rack_is_a_ring_over_ipu_links() -> None:
    # Pod64, 51.2 MB of fp16 gradients: each IPU sends 2 x 63/64 of them while it takes
    # as many in, so over its ten links one way, 160 GB/s (the 320 GB/s quoted counts
    # them both ways), plus one transfer latency and 2 x 63 ring-step latencies of 1 us
    g = 51.2e6
    seconds = 2 * 63 / 64 * g / 160e9 + 1e-6 + 126 * 1e-6
    assert BOW.allreduce_cycles(g, 64) == pytest.approx(seconds * 1.85e9, rel=1e-9)
    assert BOW.racks(64) == 1 and MK2.racks(16) == 1


def test_two_racks_add_a_gateway_stage_on_each_ipus_shard() -> None:
    # Pod128 = two Pod64 racks: in-rack ring over the 64 replicas of a rack, then each
    # IPU's 1/64 shard (0.8 MB) is all-reduced across the 2 racks (2 x 1/2 of it) over
    # its IPU-Machine's GW-Links (25 GB/s shared by 4 IPUs = 6.25 GB/s an IPU): 128 us,
    # plus 2 ring-step latencies
    g = 51.2e6
    in_rack = (2 * 63 / 64 * g / 160e9 + 1e-6 + 126e-6) * 1.33e9
    across = (0.8e6 / 6.25e9 + 2e-6) * 1.33e9
    assert MK2.racks(128) == 2
    assert MK2.allreduce_cycles(g, 128) == pytest.approx(in_rack + across, rel=1e-9)
    assert across / 1.33e9 == pytest.approx(130e-6)


def test_replicas_of_several_ipus_count_every_ipu() -> None:
    # EfficientNet-B4 on a Pod256: 128 replicas x 2 IPUs = 256 IPUs = 4 racks of 32
    # replicas; the cross-rack ring moves 2 x 3/4 of each 1/32 shard
    g = 10e6
    in_rack = (2 * 31 / 32 * g / 160e9 + 1e-6 + 62e-6) * 1.85e9
    across = (1.5 * g / 32 / 6.25e9 + 6e-6) * 1.85e9
    assert BOW.racks(256) == 4
    assert BOW.allreduce_cycles(g, 128, 2) == pytest.approx(in_rack + across, rel=1e-9)
    # without gateway links (Mk1 C2 cards) replicas never span racks
    assert MK1.racks(256) == 1
    assert BOW.allreduce_cycles(g, 1) == 0.0


def test_the_mk1_bandwidth_microbenchmark_is_a_32_bit_loop_on_the_model_figures() -> None:
    # Jia et al. 2019: 31.1 TB/s theoretical aggregate read on Mk1 (16 bytes a cycle a
    # tile), compiler-generated loops reach about a quarter: one 32-bit word a cycle a tile
    from popviz.target.costmodel import DEFAULT_COST
    from tooling.calibration import bandwidth, load_points

    point = next(p for p in load_points()
                 if p["id"] == "mk1-vector-read-bandwidth")
    assert 16 * MK1.tiles_per_ipu * MK1.clock_hz == pytest.approx(31.1e12, rel=0.01)
    assert 4 * MK1.tiles_per_ipu * MK1.clock_hz == pytest.approx(point["value"], rel=0.01)
    # the model costs a popops reduction instead: a 64-bit path (8 bytes a cycle a tile,
    # less vertex overheads) scaled by the fitted vector_efficiency of whole models
    peak = bandwidth(point, DEFAULT_COST.with_values(vector_efficiency=1.0))
    assert peak == pytest.approx(8 * MK1.tiles_per_ipu * MK1.clock_hz, rel=0.03)
    assert point["use"] == "check" and point["known_miss"]


def test_a_compile_spanning_two_racks_pays_the_gateway_stage() -> None:
    from popviz.compiler import compile
    from popviz.options import Options
    from tooling.testing.programs import synthetic_program

    program = synthetic_program(layers=8, batch=4)
    runs = {r: compile(program, Options(target="bow", gradient_accumulation=2,
                                        replication_factor=r)) for r in (64, 128)}
    ar = {r: rep.tables["exchange"].query("kind == 'allreduce'") for r, rep in runs.items()}
    g = float(ar[64]["bytes"].iloc[0]) * 64 / (2 * 63)  # the ring bytes give the gradient
    # same in-rack ring (64 replicas a rack); the Pod128 adds the shard's GW-Link ring
    extra = (g / 64 / 6.25e9 + 2e-6) * BOW.clock_hz
    cycles = {r: float((a["end"] - a["start"]).iloc[0]) for r, a in ar.items()}
    assert cycles[128] - cycles[64] == pytest.approx(extra, abs=2)
    assert runs[128].summary["step_cycles"] > runs[64].summary["step_cycles"]
