"""What compiling a program for either target family shares: the program rescaled to the
micro-batch or cut to the forward (inference), each stage's costs and boundary bytes, each
tensor's stage, and a step's rates. `compiler.py` (IPUs) and `gpu_compile.py` (GPUs) both
build on these; neither imports the other for them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from popviz.compiler.bsp import StageCosts
from popviz.compiler.memory import consumers
from popviz.compiler.stages import StagePlan
from popviz.options import Options
from popviz.recorder.program import Program
from popviz.target.cost import Precision, dtype_scale, element_bytes
from popviz.target.machines import Target

PER_SAMPLE_PHASES = ("forward", "backward", "recompute", "host_io")
PER_SAMPLE_CATEGORIES = ("activation", "temporary", "input")


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


# a batch norm in inference uses its running statistics: torch records it as this op (eval
# mode), PopLibs runs it as batchNormalise with the folded scale and shift (popnn BatchNorm)
INFERENCE_BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"
# folded into the convolution before it (Options.fold_batch_norms): the bias it leaves,
# costed as popops' per-channel broadcast add (popops.BIAS_ADD)
FOLDED_BATCH_NORM = "popviz.folded_batch_norm"


def inference_norms(program: Program, fold: bool = False) -> Program:
    """An inference program's batch norms as inference runs them: with running statistics
    (a step recorded in training mode computes batch statistics), or, `fold`, folded into
    their convolutions as an ONNX export in eval mode leaves them for PopRT: the
    convolution's bias, added to its output per channel (poplin addBias, a broadcast
    add), named FOLDED_BATCH_NORM."""
    ops = program.ops
    names = ops["op"].astype(str)
    bn = names.isin(["aten.native_batch_norm.default",
                     "aten._native_batch_norm_legit.default",
                     "aten._native_batch_norm_legit_functional.default",
                     "aten.cudnn_batch_norm.default"])
    if fold:
        bn |= names == INFERENCE_BATCH_NORM
    if not bn.any():
        return program
    ops = ops.copy()
    ops.loc[bn, "op"] = FOLDED_BATCH_NORM if fold else INFERENCE_BATCH_NORM
    if fold:  # one add an output element, not the norm's FLOPs
        written = ops.loc[bn, "bytes_written"].to_numpy(np.float64)
        ops.loc[bn, "flops"] = np.round(written / element_bytes(ops.loc[bn, "dtype"])
                                        ).astype(np.int64)
    return Program(ops, program.tensors, program.model, program.mode)


# Gradient accumulation on an IPU: every micro-batch adds each weight's gradient into its
# accumulator in place, a popops add over the whole weight (TensorFlow's pipelined
# GradientAccumulatorAdd and StatefulGradientAccumulate: popops::addInPlace, graphcore/
# tensorflow poplar/driver/ops/custom_ops/poputil/stateful_gradient_accumulate.cc; PopART's
# AccumulateOp), so each stage pays a pass over its own weights a micro-batch, after its
# backward (costed as popops.FAST_BINARY). The recorded step has none: its autograd stores
# the first gradient.
ACCUMULATE_GRADIENT = "popviz.accumulate_gradient"


def with_gradient_accumulation(program: Program, options: Options) -> Program:
    """`program` with an ACCUMULATE_GRADIENT op after the backward for each weight's
    gradient when a step accumulates micro-batches (training, gradient_accumulation > 1),
    in the module and layer of the op that makes the gradient; a program rebuilt from a
    profile (tune) has its old ones replaced. The ops read no recorded tensor: the
    accumulators' bytes are memory.py's."""
    ops, t = program.ops, program.tensors
    old = ops["op"].astype(str).to_numpy() == ACCUMULATE_GRADIENT
    if old.any():
        ops = ops[~old].reset_index(drop=True)
        program = Program(ops, t, program.model, program.mode)
    if not (options.training and options.gradient_accumulation > 1):
        return program  # most compiles: nothing more to look at
    grads = t[(t["category"] == "gradient") & (t["producer"] >= 0)
              & t["producer"].isin(ops["op_id"])]
    if grads.empty:
        return program
    maker = ops.set_index("op_id").loc[grads["producer"].to_numpy(np.int64)]
    nbytes = grads["bytes"].to_numpy(np.int64)
    shape = grads["shape"].astype(str).to_numpy()
    first = int(ops["op_id"].max()) + 1
    rows = pd.DataFrame({
        "op_id": np.arange(first, first + len(grads), dtype=np.int64),
        "op": ACCUMULATE_GRADIENT, "op_class": "elementwise", "phase": "backward",
        "module": maker["module"].astype(str).to_numpy(),
        "layer": maker["layer"].astype(str).to_numpy(),
        "block": maker["block"].astype(str).to_numpy(), "checkpoint": False,
        "flops": np.round(nbytes / element_bytes(grads["dtype"])).astype(np.int64),
        "bytes_read": 2 * nbytes, "bytes_written": nbytes,
        "shapes": [f"{s};{s}" for s in shape], "out_shape": shape,
        "dtype": grads["dtype"].astype(str).to_numpy(), "host_ns": np.int64(0),
        "inputs": "", "outputs": "", "kernel_path": ""})
    for c in ops.columns.difference(rows.columns):  # a column this row has no say in
        rows[c] = 0 if ops[c].dtype.kind in "iufb" else ""
    merged = pd.concat([ops, rows[ops.columns]], ignore_index=True)
    return Program(merged, t, program.model, program.mode)


def compute_target(target: Target, io_tiles: int) -> Target:
    """The IPU a program runs on when `io_tiles` of each IPU's tiles serve host streams:
    the rest, each tile as fast as before (the IPU-wide compute, memory and exchange rates
    shrink with the tiles; the links to the host and other IPUs do not). A one-line
    ValueError when no tile would be left."""
    if io_tiles <= 0:
        return target
    tiles = target.tiles_per_ipu
    if io_tiles >= tiles:
        raise ValueError(f"io tiles {io_tiles:,} leave no tiles for the program on "
                         f"{target.name} ({tiles:,} tiles an IPU)")
    share = (tiles - io_tiles) / tiles
    return replace(target, tiles_per_ipu=tiles - io_tiles,
                   peak_fp16_flops=target.peak_fp16_flops * share,
                   peak_fp32_flops=target.peak_fp32_flops * share,
                   memory_bytes_per_s=target.memory_bytes_per_s * share,
                   exchange_bytes_per_s=target.exchange_bytes_per_s * share)


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
