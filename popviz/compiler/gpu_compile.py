"""compile for a GPU target: the recorded program placed on GPUs -> Report (times in ns).

Shared with the IPU targets: rescaling to the micro-batch, inference's forward-only
program, stages and recomputation (`plan_stages`), program order, per-stage costs and
boundary bytes (`_stage_costs`) and the schedule IR (`build_schedule`). GPU-specific: per-op
time (`popviz.target.gpu_cost`), asynchronous timing with NCCL transfers (`gpu_timing`)
and the caching allocator's memory (`gpu_memory`). No tiles: `tile_memory` and `oom` are
empty and fit is the peak reserved memory against the device's (`popviz.metrics`'
device_fit over the `liveness` table, whose `reserved_bytes` column it reads).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from popviz.compiler.gpu_fabric import Fabric
from popviz.compiler.gpu_lowering import lower_for_cuda
from popviz.compiler.gpu_memory import GpuMemory, replay_memory
from popviz.compiler.gpu_recipe import (
    GpuRecipe,
    apply_recipe,
    recipe_named,
    state_bytes_per_param,
    step_bytes_per_stage,
)
from popviz.compiler.gpu_timing import GpuTiming, time_gpu_schedule
from popviz.compiler.grad_parts import WEIGHT, grad_parts, split_conv_backward, weight_share
from popviz.compiler.order import program_order
from popviz.compiler.plan_common import (
    _forward_only,
    _rescale,
    _stage_costs,
    plan_tensor_stage,
    step_rates,
)
from popviz.compiler.report import Report
from popviz.compiler.schedule import build_schedule
from popviz.compiler.schedule_zb import ZERO_BUBBLE, PassTimes, stage_gpus
from popviz.compiler.shared import find_shared
from popviz.compiler.stages import StagePlan, plan_stages
from popviz.jsonsafe import jsonable as _py
from popviz.metrics import device_fits, idle_fraction, stage_columns, stage_time
from popviz.options import SEVERAL_STAGES_PER_GPU, Options
from popviz.recorder.program import Program
from popviz.target.cost import Precision
from popviz.target.gpu import GPU_FAMILY, LINKS, GpuTarget
from popviz.target.gpu_cost import gpu_op_costs, host_bound
from popviz.vocab import MODELLED_KIND

# optimiser ops that only run in the first step (state made) or on the host (a 0-dim step
# count's `.item()`): no GPU time in a steady-state step
FIRST_STEP_OPS = ("aten.zeros_like", "aten.clone", "aten._local_scalar_dense",
                  "aten.lift_fresh", "aten.empty", "aten.copy_")
OOM_COLUMNS = ("ipu", "tile", "bytes_over", "variables")
TILE_COLUMNS = ("ipu", "tile", "capacity_bytes", "total_bytes", "code", "always_live",
                "not_always_live_peak", "exchange", "vertex_state")


AS_RECORDED = Precision(4, 4, False)  # with dtypes hidden below: every byte as recorded


def as_recorded(program: Program) -> Program:
    """The program as the shared per-stage costs should read it on a GPU: the dtypes run as
    recorded (fp32, or bf16 / fp16 where the user recorded under autocast), so the IPU
    `precision` option must not rescale them: `dtype_scale` leaves a non-float label at 1."""
    return Program(program.ops, program.tensors.assign(dtype="as-recorded"), program.model,
                   program.mode)


def costed_gpu_plan(program: Program, options: Options, target: GpuTarget
                    ) -> tuple[Program, int, StagePlan, pd.DataFrame]:
    """The front half of `compile_gpu` (the fit's too): the program at the micro-batch,
    its stages (looped round the GPUs for Interleaved1F1B and InterleavedZB, in a V for
    ZBV) and each op's ns, in program
    order. The program is held as `options.gpu_precision` says (`gpu_recipe.py`)."""
    program, micro_batch = _rescale(program, options)
    if not options.training:
        program = _forward_only(program)
    recipe = recipe_named(options.gpu_precision)
    program = apply_recipe(program, recipe, options.replication_factor, options.training)
    program = lower_for_cuda(program, recipe)  # what CUDA runs: gpu_lowering.py
    if options.training and options.schedule in ZERO_BUBBLE:  # dgrad in I, wgrad in W
        program = split_conv_backward(program)
    several = options.schedule in SEVERAL_STAGES_PER_GPU
    looped = several and len(options.splits) + 1 > \
        (options.num_ipus or 1) > 1  # more stages than GPUs: placed round them below
    plan = plan_stages(program, options.copy(num_ipus=None) if looped else options,
                       checkpoint_blocks=True)
    if several and len(plan.stages) > 1:
        gpus = options.num_ipus or max(1, len(plan.stages) // 2)
        ipus = stage_gpus(options.schedule, len(plan.stages), gpus)
        plan.stages["ipu"] = ipus
        plan.ops["ipu"] = ipus[plan.ops["stage"].to_numpy(np.int64)]
        plan.num_ipus = gpus
    ops = plan.ops
    ops = pd.concat([ops, gpu_op_costs(ops, target)], axis=1)
    first = (ops["phase"] == "optimiser") & ops["op"].astype(str).str.startswith(FIRST_STEP_OPS)
    ops.loc[first | (ops["phase"] == "host_io"), ["cycles", "kernels"]] = 0
    if options.training and options.gradient_accumulation > 1:
        ops["cycles"] = ops["cycles"] + _accumulation_ns(ops, program, options, target,
                                                         recipe.fused_wgrad)
    for col in ("amp_used", "amp_ignored", "temp_bytes"):  # contract columns; no AMP
        ops[col] = False if col == "amp_ignored" else 0
    ops = program_order(ops)
    # the GPU idles where eager PyTorch's host thread has not yet issued the next kernel
    wait = np.ceil(host_bound(ops, target.cost)).astype(np.int64)
    ops["host_wait_ns"] = wait
    ops["cycles"] = ops["cycles"].to_numpy(np.int64) + wait
    # which backward ops a zero-bubble schedule may defer (W) and which it may not (B)
    ops["grad_part"] = grad_parts(ops)
    return program, micro_batch, plan, ops


def _accumulation_ns(ops: pd.DataFrame, program: Program, options: Options,
                     target: GpuTarget, fused_wgrad: bool = False) -> np.ndarray:
    """Gradient accumulation: after the first micro-batch, autograd adds each new weight
    gradient into `.grad` (one add kernel: read both, write one). Spread as a mean per
    micro-batch over the ops that make the gradients. `fused_wgrad` (Megatron's
    gradient_accumulation_fusion): a weight GEMM accumulates into the grad buffer itself,
    its epilogue reading the buffer as well as writing it, which costs time only where the
    GEMM is bound by memory rather than by its FLOPs."""
    t = program.tensors
    grad = t[(t["category"] == "gradient") & (t["producer"] >= 0)]
    share = (options.gradient_accumulation - 1) / options.gradient_accumulation
    bandwidth = target.hbm_bytes_per_s * target.cost.memory_efficiency
    nbytes = grad["bytes"].to_numpy(np.float64)
    per = (target.cost.kernel_ns + 3 * nbytes / bandwidth * 1e9) * share
    if fused_wgrad:
        by_id = ops.drop_duplicates("op_id").set_index("op_id")
        producer = by_id.reindex(grad["producer"].to_numpy())
        gemm = (producer["op_class"].astype(str) == "matmul").to_numpy()
        compute = producer["compute_ns"].fillna(0.0).to_numpy(np.float64)
        memory = producer["memory_ns"].fillna(0.0).to_numpy(np.float64)
        epilogue = np.maximum(memory + nbytes / bandwidth * 1e9 - compute, 0.0) - \
            np.maximum(memory - compute, 0.0)
        per = np.where(gemm, epilogue * share, per)
    extra = pd.Series(per).groupby(grad["producer"].to_numpy()).sum()
    return np.ceil(extra.reindex(ops["op_id"].to_numpy()).fillna(0.0).to_numpy()
                   * (ops["source_op"].to_numpy() < 0)).astype(np.int64)


def _lifetimes(program: Program, options: Options) -> pd.DataFrame:
    """The tensors as the replay reads them. Inference (no_grad) frees an activation after
    its last forward reader: the recorded `last_use` of one the backward read was cut to
    the forward's last op, which would hold it to the end, so it is dropped and the
    dataflow decides."""
    t = program.tensors
    if options.training or not len(program.ops):
        return t
    last = int(program.ops["op_id"].max())
    cut = (t["last_use"].to_numpy() >= last) & \
        t["category"].isin(["activation", "temporary", "input"]).to_numpy()
    return t.assign(last_use=np.where(cut, -1, t["last_use"].to_numpy()))


def compile_gpu(program: Program, options: Options, target: GpuTarget) -> Report:
    program, micro_batch, plan, ops = costed_gpu_plan(program, options, target)
    n = len(plan.stages)
    costs = _stage_costs(ops, as_recorded(program), plan, options, AS_RECORDED, n)
    real = ops[ops["source_op"] < 0]
    op_stage = pd.Series(real["stage"].to_numpy(), index=real["op_id"].to_numpy())
    t_stage = plan_tensor_stage(program.tensors, op_stage, plan)
    weight = (ops["grad_part"] == WEIGHT).to_numpy()
    copies = tied_copies(ops, program.tensors, plan)
    # which link each transfer crosses: NVLink, PCIe, or the network between servers
    fabric = Fabric(target, plan.num_ipus, options.replication_factor)
    optimiser = optimiser_by_stage(ops, program.tensors, t_stage, n, copies) + \
        _tied_grad_allreduce(program.tensors, copies, plan, target, fabric)
    costs = replace(costs, optimiser=optimiser,
                    weight_grad=np.bincount(ops["stage"].to_numpy(np.int64)[weight],
                                            weights=ops["cycles"].to_numpy(np.float64)[weight],
                                            minlength=n)[:n].astype(np.int64))
    kind = "Sequential" if options.strategy == "sharded" else options.schedule
    microbatches = options.gradient_accumulation
    iterations = options.device_iterations
    if not options.training:
        microbatches, iterations = microbatches * iterations, 1
    has_wu = options.training and bool((ops["pass"] == "WU").any())
    assert costs.weight_grad is not None
    pass_ns = PassTimes(
        forward=costs.forward.astype(np.float64),
        input_grad=(costs.backward - costs.weight_grad).astype(np.float64),
        weight_grad=costs.weight_grad.astype(np.float64),
        p2p=np.array([target.p2p_ns(int(b), fabric.p2p_link(int(costs.ipu[s - 1]),
                                                             int(costs.ipu[s])))
                      if b > 0 and s > 0 else 0.0
                      for s, b in enumerate(costs.boundary_bytes.tolist())]),
        weight_share=weight_share(ops, program.tensors, ops["grad_part"].to_numpy(), n))
    schedule = build_schedule(n, microbatches, iterations, options.training, kind,
                              options.replication_factor, has_wu, costs.recompute > 0,
                              ranks=plan.num_ipus, pass_ns=pass_ns)
    recipe = recipe_named(options.gpu_precision)
    timing = time_gpu_schedule(schedule, costs, target, plan.num_ipus,
                               options.replication_factor, fabric,
                               blocking_sends=recipe.blocking_p2p)
    stage_gpu = plan.stages["ipu"].to_numpy(np.int64)
    step_bytes = step_bytes_per_stage(program.tensors, t_stage, n, recipe,
                                      options.replication_factor) if has_wu else None
    memory = replay_memory(ops, _lifetimes(program, options), t_stage, timing.actions,
                           stage_gpu, plan.num_ipus, recipe.persistent_grads and has_wu,
                           step_bytes, split_weight=schedule.split_backward,
                           copies={t: sorted(g) for t, g in copies.items()})
    stages = _stages_table(plan, ops, timing, memory, costs, schedule.stash_depth, n)
    tensors = program.tensors.assign(stage=t_stage, ipu=stage_gpu[t_stage])
    out_ops = ops.sort_values("op_id", kind="stable").reset_index(drop=True)
    precision = _precision_meta(recipe, options.replication_factor, program)
    meta = {"target": target.to_meta(plan.num_ipus), "options": options.to_meta(),
            "model": dict(program.model), "kind": MODELLED_KIND,
            "gpu": {"max_memory_allocated": memory.peak_allocated.tolist(),
                    "max_memory_reserved": memory.peak_reserved.tolist(),
                    "device_memory_bytes": target.memory_bytes,
                    "usable_bytes": target.usable_bytes,
                    "link": fabric.slowest(),
                    "precision": precision}}
    summary = _summary(plan, timing, memory, stages, options, target, micro_batch,
                       microbatches * iterations, schedule.name, schedule.stash_depth)
    summary["gpu_precision_bytes_per_param"] = precision["bytes_per_param"]
    tables = {"stages": stages, "trace": timing.trace, "liveness": memory.liveness,
              "tile_memory": _empty(TILE_COLUMNS), "exchange": timing.exchange,
              "ops": out_ops, "tensors": tensors, "variables": memory.variables,
              "oom": _empty(OOM_COLUMNS)}
    return Report(meta=meta, tables=tables, arrays={}, summary=summary)


def tied_copies(ops: pd.DataFrame, tensors: pd.DataFrame, plan: StagePlan
                ) -> dict[int, set[int]]:
    """A parameter read by forward ops on several GPUs (a tied embedding read by the first
    stage and the LM head) is held on each: Megatron-LM's last stage keeps its own copy of
    the word embedding with its gradients and optimiser state, all-reducing the two
    gradients at every step (`_allreduce_word_embedding_grads`), and a module of
    torch.distributed.pipelining owns its parameters, so a weight tied across stages is
    one per stage. Per tensor row of `tensors` (the parameter, its gradient and optimiser
    state), the GPUs other than its home that hold a copy."""
    shared = find_shared(ops, tensors, plan)
    if shared.empty:
        return {}
    names = tensors["name"].astype(str).to_numpy()
    cats = tensors["category"].astype(str).to_numpy()
    ids = tensors["tensor_id"].to_numpy(np.int64)
    out: dict[int, set[int]] = {}
    for tid, name, gpu in zip(shared["tensor_id"].tolist(), shared["name"].tolist(),
                              shared["ipu"].tolist(), strict=True):
        family = (ids == tid) | (np.char.startswith(names.astype(str), f"{name}.")
                                 & np.isin(cats, ["gradient", "optimiser_state"]))
        for row in np.flatnonzero(family).tolist():
            out.setdefault(int(row), set()).add(int(gpu))
    return out


def _tied_grad_allreduce(tensors: pd.DataFrame, copies: dict[int, set[int]],
                         plan: StagePlan, target: GpuTarget, fabric: Fabric) -> np.ndarray:
    """Per stage, the all-reduce of each tied weight's gradients over the GPUs holding a
    copy, once per step before the update, added to the first stage on each such GPU."""
    out = np.zeros(len(plan.stages), dtype=np.int64)
    cats = tensors["category"].astype(str).to_numpy()
    nbytes = tensors["bytes"].to_numpy(np.int64)
    stage_of = {int(g): int(s) for s, g in reversed(list(enumerate(
        plan.stages["ipu"].to_numpy(np.int64).tolist())))}
    for row, gpus in copies.items():
        if cats[row] != "gradient":
            continue
        link = max((fabric.p2p_link(0, g) for g in gpus), key=LINKS.index)
        ns = int(np.ceil(target.allreduce_ns(float(nbytes[row]), len(gpus) + 1, link)))
        for g in gpus:
            out[stage_of.get(g, 0)] += ns
    return out


def optimiser_by_stage(ops: pd.DataFrame, tensors: pd.DataFrame, tensor_stage: np.ndarray,
                       num_stages: int, copies: dict[int, set[int]] | None = None
                       ) -> np.ndarray:
    """Each stage's weight-update ns. A foreach optimiser op (torch's multi-tensor AdamW /
    SGD, recorded once over the whole model's lists) lands on one stage of the plan, but in
    a pipeline each GPU updates its own parameters: its time is shared out over the stages
    by their parameters' bytes, a tied parameter's copies (`copies`) counted on every GPU
    that holds one (each updates its own). Per-parameter update ops keep their own stage."""
    wu = (ops["pass"].astype(str) == "WU").to_numpy()
    foreach = wu & ops["op"].astype(str).str.contains("_foreach_").to_numpy()
    cycles = ops["cycles"].to_numpy(np.float64)
    stage = ops["stage"].to_numpy(np.int64)
    out = np.bincount(stage[wu & ~foreach], weights=cycles[wu & ~foreach],
                      minlength=num_stages)[:num_stages]
    params = (tensors["category"].astype(str) == "parameter").to_numpy()
    held = np.bincount(np.minimum(tensor_stage[params], num_stages - 1),
                       weights=tensors["bytes"].to_numpy(np.float64)[params],
                       minlength=num_stages)[:num_stages]
    total = float(cycles[foreach].sum())
    extra = np.zeros(num_stages)
    cats = tensors["category"].astype(str).to_numpy()
    nbytes = tensors["bytes"].to_numpy(np.float64)
    for row, gpus in (copies or {}).items():
        if cats[row] == "parameter":
            for g in gpus:  # GPU g's first stage is stage g (one per GPU, or looped)
                extra[min(g, num_stages - 1)] += nbytes[row]
    if total and held.sum() > 0:
        out = out + total * (held + extra) / held.sum()
    elif total:
        out = out + np.bincount(stage[foreach], weights=cycles[foreach],
                                minlength=num_stages)[:num_stages]
    return np.ceil(out).astype(np.int64)


def _precision_meta(recipe: GpuRecipe, replicas: int, program: Program) -> dict[str, Any]:
    """How the plan holds its training state (profile meta `gpu.precision`): bytes per
    parameter as the (re-typed) program holds them, whatever its optimiser."""
    return {"name": recipe.name, "description": recipe.description,
            "activations": recipe.half or "as recorded",
            "bytes_per_param": state_bytes_per_param(program.tensors),
            "step_bytes_per_param": recipe.step_bytes_per_param(replicas)}


def _empty(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c == "variables" else np.int64)
                         for c in columns})


def _stages_table(plan: StagePlan, ops: pd.DataFrame, timing: GpuTiming, memory: GpuMemory,
                  costs: Any, depth: np.ndarray, n: int) -> pd.DataFrame:
    times = stage_columns(stage_time(timing.trace, n)).round().astype(np.int64)
    gpu = plan.stages["ipu"].to_numpy(np.int64)
    out = plan.stages[["stage", "ipu"]].copy()
    for col in ("forward_cycles", "backward_cycles", "recompute_cycles", "exchange_cycles",
                "idle_cycles"):
        out[col] = times[col].to_numpy()
    out["stash_bytes"] = memory.stash_per_microbatch * depth
    out["peak_bytes"] = memory.peak_allocated[gpu]
    out["peak_reserved_bytes"] = memory.peak_reserved[gpu]
    out["optimiser_cycles"] = times["optimiser_cycles"].to_numpy()
    out["first_layer"] = plan.stages["first_layer"].astype(str)
    out["last_layer"] = plan.stages["last_layer"].astype(str)
    out["num_ops"] = np.bincount(ops["stage"].to_numpy(np.int64), minlength=n)[:n]
    out["kernels"] = np.bincount(ops["stage"].to_numpy(np.int64),
                                 weights=ops["kernels"].to_numpy(np.float64), minlength=n)[:n]
    out["sync_cycles"] = times["sync_cycles"].to_numpy()
    out["forward_cycles_per_microbatch"] = costs.forward
    out["recompute_cycles_per_microbatch"] = costs.recompute
    out["backward_cycles_per_microbatch"] = costs.backward
    # of which the weight gradient (what a zero-bubble schedule runs apart as W)
    out["weight_grad_cycles_per_microbatch"] = costs.weight_grad
    out["stash_depth"] = depth
    out["stash_bytes_per_microbatch"] = memory.stash_per_microbatch
    out["boundary_bytes"] = costs.boundary_bytes
    return out


def _summary(plan: StagePlan, timing: GpuTiming, memory: GpuMemory, stages: pd.DataFrame,
             options: Options, target: GpuTarget, micro_batch: int, microbatches: int,
             schedule: str, depth: np.ndarray) -> dict[str, Any]:
    ns = timing.total_ns
    seconds = ns / 1e9
    replicas = options.replication_factor
    rates = step_rates(seconds, micro_batch, microbatches, replicas, plan.num_ipus, stages)
    total = rates.devices
    reserved = memory.peak_reserved
    # fit as the metrics core judges it from the tables (allocated peak against the GPU's
    # usable memory); `reserved_fits` adds the allocator's cached segments
    fits = device_fits(memory.liveness, {g: target.usable_bytes for g in range(plan.num_ipus)})
    summary = {
        "family": GPU_FAMILY, "fits": fits, "oom_tiles": 0,
        "reserved_fits": bool((reserved <= target.usable_bytes).all()),
        "oom_ipus": [int(i) for i in np.flatnonzero(reserved > target.usable_bytes)],
        "num_ipus": plan.num_ipus, "num_gpus": plan.num_ipus, "replicas": replicas,
        "total_ipus": total, "total_gpus": total,
        "step_cycles": ns, "step_seconds": seconds, "step_ms": seconds * 1e3,
        "samples_per_step": rates.samples, "throughput": rates.throughput,
        "throughput_per_ipu": rates.per_device,
        "latency_ms": timing.latency_ns / 1e6 if not options.training else None,
        "bottleneck_stage": rates.bottleneck_stage,
        "idle_fraction": idle_fraction(timing.trace, plan.num_ipus),
        **{f"{phase}_cycles": v for phase, v in timing.phase_ns.items()},
        "peak_liveness_bytes": {str(i): int(memory.peak_allocated[i])
                                for i in range(plan.num_ipus)},
        "max_memory_allocated": {str(i): int(v) for i, v in enumerate(memory.peak_allocated)},
        "max_memory_reserved": {str(i): int(v) for i, v in enumerate(reserved)},
        "device_memory_bytes": target.memory_bytes,
        "amp_ignored": 0, "amp_ignored_ops": [],
        "gpu_precision": options.gpu_precision,
        "schedule": schedule, "strategy": options.strategy,
        "micro_batch_size": micro_batch, "microbatches": microbatches,
        "training": options.training, "stage_mode": plan.split_mode,
        "stash_depth": depth.tolist(),
        "liveness_steps": memory.liveness.groupby("ipu")["step"].max().add(1).tolist(),
        "max_tile_bytes": 0,
        "stages": stages.drop(columns=["first_layer", "last_layer"]).to_dict("records"),
    }
    for row, (_, s) in zip(summary["stages"], stages.iterrows(), strict=True):
        row["first_layer"], row["last_layer"] = str(s["first_layer"]), str(s["last_layer"])
    return _py(summary)
