"""compile(program, options) -> Report: place a recorded program on a target and model it.

Pure and deterministic: the model is never run, so re-planning with other splits, AMP,
schedule or target is just another call. The steps and the cost model are described in
docs/cost-model.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from popviz.compiler.bsp import StageCosts, Timing, time_schedule
from popviz.compiler.gpu_compile import compile_gpu
from popviz.compiler.memory import Memory, analyse_memory
from popviz.compiler.order import program_order
from popviz.compiler.plan_common import (
    _forward_only,
    _rescale,
    _stage_costs,
    compute_target,
    inference_norms,
    step_rates,
    with_gradient_accumulation,
)
from popviz.compiler.report import Report
from popviz.compiler.schedule import Schedule, build_schedule
from popviz.compiler.schedule_zb import ZERO_BUBBLE
from popviz.compiler.shared import (
    add_copies,
    drop_copies,
    find_shared,
    gradient_exchange,
    summary_rows,
)
from popviz.compiler.stages import StagePlan, plan_stages
from popviz.jsonsafe import jsonable as _py
from popviz.metrics import fits, idle_fraction, oom_tiles, peak_liveness, stage_columns, stage_time
from popviz.options import Options
from popviz.recorder.program import Program
from popviz.target.cost import Precision, op_costs
from popviz.target.gpu import GpuTarget
from popviz.target.machines import Target, get_target
from popviz.vocab import MODELLED_KIND


def compile(program: Program, options: Options | None = None) -> Report:
    """Model `program` on `options.target` with `options`' stages, schedule and AMP."""
    options = (options or Options()).copy()
    target = get_target(options.target)
    if isinstance(target, GpuTarget):  # the GPU family: kernels on streams, no tiles
        if options.io_tiles:
            raise ValueError(f"io tiles are an IPU's tiles kept for host streams; "
                             f"{options.target} is a GPU")
        if options.fold_batch_norms:
            raise ValueError(f"folded batch norms are modelled as PopRT runs an ONNX "
                             f"export on an IPU; {options.target} is a GPU")
        if options.stable_norm_statistics:
            raise ValueError(f"stable norm statistics model TensorFlow's IPU norms; "
                             f"{options.target} is a GPU")
        return compile_gpu(program, options, target)
    target = compute_target(target, options.io_tiles)
    if options.gpu_precision != "as-recorded":
        raise ValueError(f"GPU precision {options.gpu_precision!r} is for GPU targets; "
                         f"{options.target} takes precision (16.16, 16.32, 32.32) instead")
    if options.recomputation and options.recompute_granularity == "selective":
        raise ValueError(f"selective recomputation (the attention cores only) is modelled "
                         f"on GPU targets; {options.target} recomputes whole sections "
                         f"(recompute granularity full)")
    if options.schedule in ZERO_BUBBLE:
        raise ValueError(f"schedule {options.schedule} splits the backward into input and "
                         f"weight gradients, which PopART does not: GPU targets only "
                         f"({options.target} takes Grouped, Interleaved, Sequential, GPipe "
                         f"or 1F1B)")
    precision = Precision.of(options)
    # a program rebuilt from a profile (tune) holds the tied-weight copies compile made:
    # drop them so that they are made (and counted) once, as when it was recorded
    tensors = drop_copies(program.tensors)
    if tensors is not program.tensors:
        program = Program(program.ops, tensors, program.model, program.mode)
    program, micro_batch, plan, ops, _ = costed_plan(program, options, target, precision)

    n_stages = len(plan.stages)
    stage_costs = _stage_costs(ops, program, plan, options, precision, n_stages)
    kind = "Sequential" if options.strategy == "sharded" else options.schedule
    microbatches = options.gradient_accumulation
    iterations = options.device_iterations
    if not options.training:  # inference pipelines across all batches of a host call
        microbatches, iterations = microbatches * iterations, 1
    has_wu = options.training and bool((ops["pass"] == "WU").any())
    schedule = build_schedule(n_stages, microbatches, iterations, options.training, kind,
                              options.replication_factor, has_wu, stage_costs.recompute > 0)
    timing = time_schedule(schedule, stage_costs, target, plan.num_ipus,
                           options.replication_factor, overlap_host=options.io_tiles > 0)
    # tied weights read on several IPUs: a copy on each, their gradients exchanged
    shared = find_shared(ops, program.tensors, plan) if options.training else None
    exchange = timing.exchange if shared is None else gradient_exchange(
        timing.exchange, timing.trace, shared, target, precision.weight_bytes)
    memory = analyse_memory(ops, program.tensors if shared is None
                            else add_copies(program.tensors, shared), options, precision, target,
                            plan.module_stage, plan.stages["ipu"].to_numpy(np.int64),
                            schedule.stash_depth, plan.num_ipus)

    stages = _stages_table(plan, ops, schedule, timing, memory, stage_costs, options)
    out_ops = ops.sort_values("op_id", kind="stable").reset_index(drop=True)
    meta: dict[str, Any] = {"target": target.to_meta(plan.num_ipus),
                            "options": options.to_meta(),
                            "model": dict(program.model), "kind": MODELLED_KIND}
    if shared is not None and not shared.empty:  # only then: other profiles stay as they were
        meta["shared_parameters"] = summary_rows(shared)
    summary = _summary(plan, schedule, timing, memory, stages, out_ops, options, target,
                       micro_batch, microbatches * iterations)
    if "shared_parameters" in meta:
        summary["shared_parameters"] = meta["shared_parameters"]
    tables = {"stages": stages, "trace": timing.trace, "liveness": memory.liveness,
              "tile_memory": memory.tile_memory, "exchange": exchange,
              "ops": out_ops, "tensors": memory.tensors, "variables": memory.variables,
              "always_live_variables": memory.always_live, "oom": memory.oom}
    return Report(meta=meta, tables=tables, arrays={"tile_liveness": memory.tile_liveness},
                  summary=summary)


def costed_plan(program: Program, options: Options, target: Target, precision: Precision
                ) -> tuple[Program, int, StagePlan, pd.DataFrame, np.ndarray]:
    """The front half of `compile` (also the calibration's): the program rescaled to the
    micro-batch (forward only for inference), its stages, and every op's cost in program
    order. Returns (program, micro_batch, plan, costed ops, each op's requested AMP)."""
    program, micro_batch = _rescale(program, options)
    program = with_gradient_accumulation(program, options)
    if not options.training:
        program = inference_norms(_forward_only(program), fold=options.fold_batch_norms)
    plan = plan_stages(program, options)
    ops = plan.ops
    # the AMP of each op: one look-up per (IPU, conv or matmul), spread over the ops
    key = ops["ipu"].to_numpy(np.int64) * 2 + (ops["op_class"].to_numpy(str) == "matmul")
    keys, inverse = np.unique(key, return_inverse=True)
    amp = np.array([options.amp_for(int(k) // 2, "matmul" if k % 2 else "conv")
                    for k in keys.tolist()])[inverse.reshape(-1)] if len(key) else np.array([])
    ops = pd.concat([ops, op_costs(ops, target, precision, amp)], axis=1)
    ops.loc[ops["phase"] == "host_io", "cycles"] = 0  # stream copies are exchange, not compute
    return program, micro_batch, plan, program_order(ops), amp


def _stages_table(plan: StagePlan, ops: pd.DataFrame, schedule: Schedule, timing: Timing,
                  memory: Memory, costs: StageCosts, options: Options) -> pd.DataFrame:
    n = len(plan.stages)
    # time per stage by category: the metrics core, as every view reads it
    times = stage_columns(stage_time(timing.trace, n)).round().astype(np.int64)

    ipu = plan.stages["ipu"].to_numpy(np.int64)
    peaks = peak_liveness(memory.liveness)
    out = plan.stages[["stage", "ipu"]].copy()
    for col in ("forward_cycles", "backward_cycles", "recompute_cycles", "exchange_cycles",
                "idle_cycles"):
        out[col] = times[col].to_numpy()
    out["stash_bytes"] = memory.stash_bytes
    out["peak_bytes"] = peaks.reindex(ipu).fillna(0).astype(np.int64).to_numpy()
    out["optimiser_cycles"] = times["optimiser_cycles"].to_numpy()
    out["amp"] = [options.amp_for(int(i), "conv") for i in ipu]
    out["first_layer"] = plan.stages["first_layer"].astype(str)
    out["last_layer"] = plan.stages["last_layer"].astype(str)
    out["num_ops"] = np.bincount(ops["stage"].to_numpy(np.int64), minlength=n)[:n]
    out["sync_cycles"] = times["sync_cycles"].to_numpy()
    out["forward_cycles_per_microbatch"] = costs.forward
    out["recompute_cycles_per_microbatch"] = costs.recompute
    out["backward_cycles_per_microbatch"] = costs.backward
    out["stash_depth"] = schedule.stash_depth
    out["stash_bytes_per_microbatch"] = memory.stash_per_microbatch
    out["boundary_bytes"] = costs.boundary_bytes
    out["amp_ignored_ops"] = np.bincount(
        ops.loc[ops["amp_ignored"], "stage"].to_numpy(np.int64), minlength=n)[:n]
    return out


def _summary(plan: StagePlan, schedule: Schedule, timing: Timing, memory: Memory,
             stages: pd.DataFrame, ops: pd.DataFrame, options: Options, target: Target,
             micro_batch: int, microbatches_per_replica: int) -> dict[str, Any]:
    step_cycles = timing.total_cycles
    seconds = step_cycles / target.clock_hz if step_cycles else 0.0
    replicas = options.replication_factor
    rates = step_rates(seconds, micro_batch, microbatches_per_replica, replicas, plan.num_ipus,
                       stages)
    ignored = ops[ops["amp_ignored"]]
    over = oom_tiles(memory.tile_memory)
    peaks = peak_liveness(memory.liveness)
    summary = {
        "fits": fits(memory.tile_memory), "oom_tiles": len(over),
        "oom_ipus": sorted({int(i) for i in over["ipu"]}),
        "num_ipus": plan.num_ipus, "replicas": replicas, "total_ipus": rates.devices,
        "step_cycles": step_cycles, "step_seconds": seconds, "step_ms": seconds * 1e3,
        "samples_per_step": rates.samples, "throughput": rates.throughput,
        "throughput_per_ipu": rates.per_device,
        "latency_ms": (timing.latency_cycles / target.clock_hz * 1e3
                       if not options.training else None),
        "bottleneck_stage": rates.bottleneck_stage,
        "idle_fraction": idle_fraction(timing.trace, plan.num_ipus),
        **{f"{phase}_cycles": cycles for phase, cycles in timing.phase_cycles.items()},
        "peak_liveness_bytes": {str(i): int(peaks.get(i, 0)) for i in range(plan.num_ipus)},
        "amp_ignored": len(ignored),
        "amp_ignored_ops": [f"{o}#{i}" for o, i in zip(ignored["op"].head(50),
                                                      ignored["op_id"].head(50), strict=True)],
        "schedule": schedule.name, "strategy": options.strategy,
        "micro_batch_size": micro_batch, "microbatches": microbatches_per_replica,
        "training": options.training, "stage_mode": plan.split_mode,
        "stash_depth": schedule.stash_depth.tolist(),
        "liveness_steps": memory.liveness.groupby("ipu")["step"].max().add(1).tolist(),
        "max_tile_bytes": int(memory.tile_memory["total_bytes"].max())
        if len(memory.tile_memory) else 0,
        "stages": stages.drop(columns=["first_layer", "last_layer"]).to_dict("records"),
    }
    for row, (_, s) in zip(summary["stages"], stages.iterrows(), strict=True):
        row["first_layer"], row["last_layer"] = str(s["first_layer"]), str(s["last_layer"])
    return _py(summary)
