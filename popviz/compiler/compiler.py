"""compile(program, options) -> Report: place a recorded program on a target and model it.

Pure and deterministic: the model is never run, so re-planning with other splits, AMP,
schedule or target is just another call. The steps and the cost model are described in
docs/cost-model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from popviz.compiler.bsp import StageCosts, Timing, time_schedule
from popviz.compiler.memory import Memory, analyse_memory, consumers
from popviz.compiler.order import program_order
from popviz.compiler.report import Report
from popviz.compiler.schedule import Schedule, build_schedule
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
from popviz.target.cost import Precision, dtype_scale, op_costs
from popviz.target.gpu import GpuTarget
from popviz.target.machines import Target, get_target
from popviz.vocab import MODELLED_KIND

PER_SAMPLE_PHASES = ("forward", "backward", "recompute", "host_io")
PER_SAMPLE_CATEGORIES = ("activation", "temporary", "input")


def compile(program: Program, options: Options | None = None) -> Report:
    """Model `program` on `options.target` with `options`' stages, schedule and AMP."""
    options = (options or Options()).copy()
    target = get_target(options.target)
    if isinstance(target, GpuTarget):  # the GPU family: kernels on streams, no tiles
        from popviz.compiler.gpu_compile import compile_gpu

        return compile_gpu(program, options, target)
    if options.gpu_precision != "as-recorded":
        raise ValueError(f"GPU precision {options.gpu_precision!r} is for GPU targets; "
                         f"{options.target} takes precision (16.16, 16.32, 32.32) instead")
    precision = Precision.parse(options.precision, options.half_partials)
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
                           options.replication_factor)
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
              "oom": memory.oom}
    return Report(meta=meta, tables=tables, arrays={"tile_liveness": memory.tile_liveness},
                  summary=summary)



def costed_plan(program: Program, options: Options, target: Target, precision: Precision
                ) -> tuple[Program, int, StagePlan, pd.DataFrame, np.ndarray]:
    """The front half of `compile` (also the calibration's): the program rescaled to the
    micro-batch (forward only for inference), its stages, and every op's cost in program
    order. Returns (program, micro_batch, plan, costed ops, each op's requested AMP)."""
    program, micro_batch = _rescale(program, options)
    if not options.training:
        program = _forward_only(program)
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

def _rescale(program: Program, options: Options) -> tuple[Program, int]:
    """Scale per-sample work when options.micro_batch_size (if not the default 1) differs
    from the recorded batch; returns the program and the micro-batch size."""
    recorded = int(program.model.get("batch_size") or 0)
    wanted = options.micro_batch_size
    if not recorded or wanted in (1, recorded):
        return program, recorded or wanted
    ratio = wanted / recorded
    ops, tensors = program.ops.copy(), program.tensors.copy()
    m = ops["phase"].isin(PER_SAMPLE_PHASES)
    for col in ("flops", "bytes_read", "bytes_written"):
        ops.loc[m, col] = np.round(ops.loc[m, col].to_numpy(np.float64) * ratio).astype(np.int64)
    t = tensors["category"].isin(PER_SAMPLE_CATEGORIES)
    tensors.loc[t, "bytes"] = np.round(tensors.loc[t, "bytes"].to_numpy(np.float64) * ratio
                                       ).astype(np.int64)
    model = dict(program.model, batch_size=wanted)
    return Program(ops, tensors, model, program.mode), wanted


def _forward_only(program: Program) -> Program:
    """Inference: drop backward / recompute / optimiser ops and what only they made."""
    ops = program.ops
    keep = ops["phase"].isin(["forward", "host_io"])
    kept = ops[keep]
    t = program.tensors
    alive = (t["producer"] < 0) | t["producer"].isin(kept["op_id"])
    t = t[alive & ~t["category"].isin(["gradient", "optimiser_state"])].copy()
    last = int(kept["op_id"].max()) if len(kept) else 0
    t["last_use"] = np.minimum(t["last_use"].to_numpy(np.int64), last)
    return Program(kept.reset_index(drop=True), t.reset_index(drop=True), program.model,
                   program.mode)


def _stage_costs(ops: pd.DataFrame, program: Program, plan: StagePlan, options: Options,
                 precision: Precision, n: int) -> StageCosts:
    def per_stage(mask: pd.Series) -> np.ndarray:
        return np.bincount(ops.loc[mask, "stage"].to_numpy(np.int64),
                           weights=ops.loc[mask, "cycles"].to_numpy(np.float64),
                           minlength=n)[:n].astype(np.int64)

    t = program.tensors
    scale = dtype_scale(t["dtype"], precision.compute_bytes)
    wscale = dtype_scale(t["dtype"], precision.weight_bytes)
    nbytes = t["bytes"].to_numpy(np.float64)
    real = ops[ops["source_op"] < 0]
    op_stage = pd.Series(real["stage"].to_numpy(), index=real["op_id"].to_numpy())
    ps = op_stage.reindex(t["producer"].to_numpy()).to_numpy()
    # the furthest stage whose forward reads each tensor (recorded dataflow, else last_use)
    pairs = consumers(ops.reset_index(drop=True), t, pd.Series(
        np.flatnonzero(ops["source_op"].to_numpy() < 0), index=real["op_id"].to_numpy()))
    fwd_read = pairs[ops["pass"].to_numpy(str)[pairs["row"].to_numpy()] == "F"]
    reader_stage = fwd_read.assign(stage=ops["stage"].to_numpy()[fwd_read["row"].to_numpy()]) \
        .groupby("tensor_id")["stage"].max()
    us = reader_stage.reindex(t["tensor_id"].to_numpy()).to_numpy()
    act = t["category"].isin(["activation", "input"]).to_numpy() & ~np.isnan(ps) & \
        ~np.isnan(us) & (us > ps)
    # bytes crossing into stage s: activations made before s and read at s or later
    diff = np.zeros(n + 1)
    np.add.at(diff, ps[act].astype(np.int64) + 1, nbytes[act] * scale[act])
    np.add.at(diff, us[act].astype(np.int64) + 1, -nbytes[act] * scale[act])
    boundary = np.cumsum(diff)[:n]
    fwd = real[real["pass"] == "F"]
    if not fwd_read.size:  # no dataflow at all: the previous stage's last output
        last_out = fwd.groupby("stage")["bytes_written"].last() * precision.compute_bytes / 4
        for s in range(1, n):
            boundary[s] = max(boundary[s], float(last_out.get(s - 1, 0)))
    boundary[0] = 0
    tensor_stage = plan_tensor_stage(t, op_stage, plan)
    grad = (t["category"] == "gradient").to_numpy()
    grad_bytes = np.bincount(tensor_stage[grad], weights=nbytes[grad] * wscale[grad],
                             minlength=n)[:n]
    state = (t["category"] == "optimiser_state").to_numpy() & options.optimiser_offload
    # with replicated tensor sharding each replica streams its shard only
    shards = options.replication_factor if options.replicated_tensor_sharding else 1
    offload = np.bincount(tensor_stage[state], weights=nbytes[state] * wscale[state] / shards,
                          minlength=n)[:n]
    inp = (t["category"] == "input").to_numpy() & (t["last_use"] >= 0).to_numpy()
    last_fwd = fwd[fwd["stage"] == n - 1]
    out_bytes = int(last_fwd["bytes_written"].iloc[-1] * precision.compute_bytes / 4) \
        if len(last_fwd) else 0
    return StageCosts(
        ipu=plan.stages["ipu"].to_numpy(np.int64),
        forward=per_stage(ops["pass"] == "F"), recompute=per_stage(ops["pass"] == "R"),
        backward=per_stage(ops["pass"] == "B"), optimiser=per_stage(ops["pass"] == "WU"),
        boundary_bytes=np.ceil(boundary).astype(np.int64),
        grad_bytes=np.ceil(grad_bytes).astype(np.int64),
        offload_bytes=np.ceil(offload).astype(np.int64),
        input_bytes=math.ceil(float((nbytes[inp] * scale[inp]).sum())),
        output_bytes=max(out_bytes, 0))


def plan_tensor_stage(t: pd.DataFrame, op_stage: pd.Series, plan: StagePlan) -> np.ndarray:
    """Stage of each tensor: its producer's, else its module's (parents too), else 0."""
    ps = op_stage.reindex(t["producer"].to_numpy()).to_numpy()
    made = ~np.isnan(ps)
    out = np.where(made, np.nan_to_num(ps), 0).astype(np.int64)
    modules = t["module"].astype(str).to_numpy()
    found: dict[str, int] = {}
    for i in np.flatnonzero(~made).tolist():
        module = start = modules[i]
        stage = found.get(start)
        if stage is None:
            while module and module not in plan.module_stage and "." in module:
                module = module.rsplit(".", 1)[0]
            stage = found[start] = plan.module_stage.get(module, 0)
        out[i] = stage
    return out


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


@dataclass(frozen=True)
class StepRates:
    """What a step's time and size give, the same on every target."""

    samples: int  # per step, all replicas
    devices: int  # IPUs (GPUs) per replica x replicas
    throughput: float  # samples/s
    per_device: float
    bottleneck_stage: int  # busiest stage by forward + recompute + backward per micro-batch


def step_rates(seconds: float, micro_batch: int, microbatches: int, replicas: int,
               devices_per_replica: int, stages: pd.DataFrame) -> StepRates:
    samples = micro_batch * microbatches * replicas
    devices = devices_per_replica * replicas
    throughput = samples / seconds if seconds else 0.0
    per_mb = (stages["forward_cycles_per_microbatch"] + stages["recompute_cycles_per_microbatch"]
              + stages["backward_cycles_per_microbatch"])
    return StepRates(samples, devices, throughput, throughput / devices if devices else 0.0,
                     int(per_mb.idxmax()) if len(per_mb) else 0)  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable


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
