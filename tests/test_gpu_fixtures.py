"""The GPU model against the real H100 recordings (tests/fixtures, README in
../shared/fixtures/gpu): per op class kernel time of the ResNet-50 batch-64 trace (the fit's
run), peak memory against the trace's own memory events and against the batch-32 memory
snapshot, and the pipelining run kept out of the fit. The errors asserted here are the
ones docs/cost-model.md ("GPU targets") reports."""

from __future__ import annotations

from typing import Any

import pytest

from popviz.compiler import compile
from popviz.metrics import peak_liveness
from popviz.options import Options
from tests.import_fixtures import RESNET, imported_profile, snapshot_inside_trace
from tooling.gpu_fit import compare_classes, kernel_ns_total
from tooling.gpu_programs import gpu_program

pytest.importorskip("transformers")  # gpu_programs' transformer models share its import


@pytest.fixture(scope="module")
def rn50_plan() -> Any:
    """ResNet-50 at batch 64 with AdamW (as the fixture ran), planned for one H100."""
    return compile(gpu_program("resnet", 50, 64, "adamw"), Options(target="h100"))


def test_resnet50_kernel_time_per_op_class(resnet: Any, rn50_plan: Any) -> None:
    table = compare_classes(resnet.ops, rn50_plan.tables["ops"])
    big = table[table["measured_ns"] > 0.05 * table["measured_ns"].sum()]
    assert set(big.index) >= {("F", "conv"), ("B", "conv"), ("F", "norm"), ("B", "norm"),
                              ("F", "elementwise"), ("B", "elementwise")}
    assert (big["error"].abs() <= 0.15).all(), big
    # the convolutions and batch norms were fitted here (all kernels +0.9%); they now come
    # from their kernels measured on an H200 (gpu_conv.py, gpu_norm.py): +4.1%
    total = table["modelled_ns"].sum() / table["measured_ns"].sum() - 1
    assert abs(total) <= 0.05
    # the step: modelled kernels against the GPU's busy time; with the waits for the host
    # (host_launch_ns, fitted on another machine's host) it lies between the busy time and
    # the profiled step's kernel span (48.8 ms: 12 ms of GPU idle waiting on this host)
    ops = rn50_plan.tables["ops"]
    kernels = float((ops["cycles"] - ops["host_wait_ns"]).sum())
    busy = kernel_ns_total(resnet.ops)
    assert abs(kernels / busy - 1) <= 0.05
    step = rn50_plan.summary["step_ms"] * 1e6
    assert kernels < step <= 48.8e6 and ops["host_wait_ns"].sum() > 0


def test_resnet50_peak_memory_against_the_trace(resnet: Any, rn50_plan: Any) -> None:
    measured = int(peak_liveness(resnet.liveness).max())  # the trace's [memory] events
    predicted = int(rn50_plan.summary["max_memory_allocated"]["0"])
    assert abs(predicted / measured - 1) <= 0.03, (predicted, measured)
    reserved = int(rn50_plan.summary["max_memory_reserved"]["0"])
    assert predicted <= reserved and abs(reserved / 7_065_305_088 - 1) <= 0.06
    assert rn50_plan.summary["fits"] is True


def test_resnet50_b32_peak_against_the_memory_snapshot(tmp_path: Any) -> None:
    plan = compile(gpu_program("resnet", 50, 32, "sgd"), Options(target="h100"))
    snap = snapshot_inside_trace(tmp_path)  # the b32 snapshot's own curve, as imported
    for profile in imported_profile([RESNET], tmp_path / "snap", memory_snapshot=[snap]):
        measured = int(peak_liveness(profile.liveness).max())
    predicted = int(plan.summary["max_memory_allocated"]["0"])
    assert abs(predicted / measured - 1) <= 0.03, (predicted, measured)
    # the snapshot's segments: 3,514 MiB reserved at its end (never released)
    reserved = int(plan.summary["max_memory_reserved"]["0"])
    assert abs(reserved / (3514 << 20) - 1) <= 0.08


def test_pipelining_run_kept_out_of_the_fit(pipeline: Any) -> None:
    """Two stages of 4 x Linear(1024) + ReLU on one H100, 4 micro-batches of 8: tiny
    fp32 GEMMs (M = 8), kept out of every fit. With a fixed ramp per GEMM (before the wave
    model, popviz/target/gpu_gemm.py) the kernels were modelled at 2.35x the measured;
    asserted as it is now, so that a change shows here."""
    plan = compile(gpu_program("pipe", 1024, 8, "sgd"),  # one micro-batch of 8 rows
                   Options(target="h100", splits=["stage1"], stage_ipus=[0, 0],
                           gradient_accumulation=4, micro_batch_size=8,
                           schedule="Interleaved1F1B"))
    ops = plan.tables["ops"]
    modelled = ops.assign(cycles=ops["cycles"] * 4,  # ops are per micro-batch
                          host_wait_ns=ops["host_wait_ns"] * 4)
    measured = pipeline.ops[pipeline.ops["pass"].isin(["F", "B"])]
    table = compare_classes(measured, modelled[modelled["pass"].isin(["F", "B"])])
    ratio = table["modelled_ns"].sum() / table["measured_ns"].sum()
    assert 0.7 <= ratio <= 1.15, table
    gemms = table.xs("matmul", level="op_class")
    assert ((gemms["error"] > -0.5) & (gemms["error"] < 0.7)).all(), gemms
    # both stages on the one GPU, scheduled as pipelining's interleaved 1F1B
    assert plan.summary["num_gpus"] == 1 and len(plan.tables["stages"]) == 2
