"""GPU precision recipes: how training state is held on the GPU, and in which dtype the
recorded program's activations and GEMMs run (docs/notes/gpu-plans-v2-research.md, §1).

A CPU recording is fp32 throughout: fp32 weights, gradients and Adam m, v (16 B/param),
4 B activations, fp32 matmuls on CUDA cores. `as-recorded` keeps that (the default). The
other recipes re-type the recorded program as a GPU trainer would hold it:

recipe           persistent B/param (AdamW)                      in the step   activations
as-recorded      as recorded (fp32: 4 + 4 + 8 = 16)              -             as recorded
megatron-fp16    2 fp16 weights + 2 fp16 grad buffer             4 fp32 grads  fp16
                 + 4 fp32 master + 8 Adam m, v = 16
megatron-bf16    2 bf16 weights + 4 fp32 main grads + 4 + 8 = 18 -             bf16
megatron-*-      master and m, v sharded over d DP replicas:     4/d (fp16)    half
  distopt        4 + 12/d (fp16), 6 + 12/d (bf16)
amp              fp32 weights 4 + .grad 4 + m, v 8 = 16, and a   -             bf16; autocast's
                 half copy of each GEMM weight per micro-batch                 fp32 ops: fp32
                 in flight (the cast cache, saved for backward)

Megatron's optimizer is a fused multi-tensor Adam (apex / Transformer Engine FusedAdam,
in place), so its recipes hold none of torch's foreach temporaries; `amp` keeps them (torch
AdamW, foreach). Every GPU plan holds each dropout mask as CUDA's `native_dropout` does
(bool, 1 B) and runs Megatron's recipes with its fused masked softmax: gpu_lowering.py.

Sources: Megatron-LM `docs/user-guide/features/dist_optimizer.md` and
`megatron/training/theoretical_memory_usage.py` (18, 6 + 12/d); the fp16 grad buffer is the
param dtype unless `--accumulate-allreduce-grads-in-fp32` (Megatron
`core/distributed/distributed_data_parallel.py`); the fp16 optimizer's fp32 copies of the
grads exist only in `optimizer.step()` (`_copy_model_grads_to_main_grads`), after the
pipeline has freed its activations, so they add to the step's peak, not the pipeline's.
Megatron's grad buffer is allocated once and kept (one contiguous buffer), so its gradients
are persistent here; autocast's are made by the backward (`zero_grad(set_to_none=True)`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.options import GPU_PRECISIONS
from popviz.recorder.program import Program

AS_RECORDED_NAME = "as-recorded"
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
HALF_DTYPES = ("float16", "bfloat16")
COMPUTE_PHASES = ("forward", "backward", "recompute")
TENSOR_CLASSES = ("conv", "grouped_conv", "depthwise_conv", "matmul")
# torch.autocast's CUDA ops that run (and output) in fp32 (PyTorch AMP docs, "CUDA Ops that
# can autocast to float32", as the aten ops a recording names; batch norm is not among
# them: cuDNN's takes half activations with fp32 statistics and answers in half)
AUTOCAST_FP32 = re.compile(
    r"^aten\.(?:native_layer_norm|layer_norm|native_group_norm|group_norm"
    r"|_softmax|softmax|_log_softmax|log_softmax|nll_loss|nll_loss_forward|nll_loss2d_forward"
    r"|cross_entropy|exp|expm1|log|log1p|log2|log10|pow|sum|prod|cumsum|cumprod|rsqrt"
    r"|reciprocal|softplus|erfinv|mse_loss|l1_loss|smooth_l1_loss|kl_div"
    r"|binary_cross_entropy_with_logits|norm|linalg_vector_norm)(?:_backward(?:_data)?)?\.")


def tensor_ids(cell: object) -> list[int]:
    """The tensor ids of an ops-table `inputs` / `outputs` cell ("12;3")."""
    return [int(x) for x in str(cell).split(";") if x.strip().lstrip("-").isdigit()]


@dataclass(frozen=True)
class GpuRecipe:
    """One way of holding training state on a GPU. Bytes are per parameter."""

    name: str
    description: str  # one line, for --help and the summary
    half: str | None  # dtype activations and GEMMs run in; None: as recorded
    weight_bytes: int = 4  # the model's own weights
    grad_bytes: int = 4  # gradients (Megatron: its grad buffer)
    master_bytes: int = 0  # an fp32 master copy of the weights
    state_bytes: int = 4  # each optimiser state tensor (Adam m, v; SGD momentum), fp32
    step_bytes: int = 0  # extra, only during the optimiser step (fp16: fp32 grad copies)
    persistent_grads: bool = False  # allocated before the step and kept (a grad buffer)
    cast_cache: bool = False  # autocast: a half copy of each GEMM weight per micro-batch
    sharded: bool = False  # distributed optimizer: master, states, step copies / DP
    fused_optimiser: bool = False  # one in-place multi-tensor Adam kernel: no temporaries
    fused_softmax: bool = False  # Megatron's masked_softmax_fusion (gpu_lowering.py)
    # Megatron's gradient_accumulation_fusion (on by default): each weight-gradient GEMM
    # accumulates into the grad buffer in its epilogue (fused_weight_gradient_mlp_cuda's
    # wgrad_gemm_accum_fp16 / _fp32), no add kernel per micro-batch
    fused_wgrad: bool = False
    # Megatron-LM's pipeline p2p (batch_p2p_comm, batch_p2p_sync by default): each send /
    # recv is waited for and followed by torch.cuda.synchronize() (p2p_communication.py
    # `_communicate`), so a stage's next action starts after its send has finished
    blocking_p2p: bool = False

    def bytes_per_param(self, replicas: int = 1, states: int = 2) -> float:
        """Persistent bytes per parameter with `states` optimiser states (Adam: 2)."""
        d = replicas if self.sharded else 1
        return self.weight_bytes + self.grad_bytes + (self.master_bytes
                                                      + states * self.state_bytes) / d

    def step_bytes_per_param(self, replicas: int = 1) -> float:
        return self.step_bytes / (replicas if self.sharded else 1)


_MEGATRON = "Megatron-LM mixed precision"
RECIPES: dict[str, GpuRecipe] = {r.name: r for r in (
    GpuRecipe(AS_RECORDED_NAME, "the recording's own dtypes (a CPU recording: fp32 weights, "
              "grads, Adam m, v = 16 B/param, 4 B activations, fp32 matmuls)", None),
    GpuRecipe("megatron-fp16", f"{_MEGATRON} --fp16: fp16 weights and grad buffer, fp32 "
              "master and Adam m, v = 16 B/param (+4 fp32 grads in the step), fp16 "
              "activations and GEMMs", "float16", weight_bytes=2, grad_bytes=2,
              master_bytes=4, step_bytes=4, persistent_grads=True, fused_optimiser=True,
              fused_softmax=True, fused_wgrad=True, blocking_p2p=True),
    GpuRecipe("megatron-bf16", f"{_MEGATRON} --bf16: bf16 weights, fp32 main grads, fp32 "
              "master and Adam m, v = 18 B/param, bf16 activations and GEMMs", "bfloat16",
              weight_bytes=2, grad_bytes=4, master_bytes=4, persistent_grads=True,
              fused_optimiser=True, fused_softmax=True, fused_wgrad=True, blocking_p2p=True),
    GpuRecipe("megatron-fp16-distopt", f"{_MEGATRON} --fp16 --use-distributed-optimizer: "
              "4 + 12/d B/param over d data-parallel replicas (+4/d in the step)", "float16",
              weight_bytes=2, grad_bytes=2, master_bytes=4, step_bytes=4,
              persistent_grads=True, sharded=True, fused_optimiser=True, fused_softmax=True,
              fused_wgrad=True, blocking_p2p=True),
    GpuRecipe("megatron-bf16-distopt", f"{_MEGATRON} --bf16 --use-distributed-optimizer: "
              "6 + 12/d B/param over d data-parallel replicas", "bfloat16", weight_bytes=2,
              grad_bytes=4, master_bytes=4, persistent_grads=True, sharded=True,
              fused_optimiser=True, fused_softmax=True, fused_wgrad=True, blocking_p2p=True),
    GpuRecipe("amp", "plain torch.autocast (bf16; fp16 holds the same bytes): fp32 weights, "
              ".grad, Adam m, v = 16 B/param, plus a half copy of each GEMM weight per "
              "micro-batch in flight; half activations and GEMMs, autocast's fp32 ops in "
              "fp32", "bfloat16", cast_cache=True),
)}


if tuple(RECIPES) != GPU_PRECISIONS:  # the names Options accepts are these recipes
    raise ImportError("popviz.options.GPU_PRECISIONS and gpu_recipe.RECIPES differ")


def recipe_named(name: str) -> GpuRecipe:
    """The recipe called `name`; a ValueError naming the valid ones otherwise."""
    try:
        return RECIPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"GPU precision {name!r} is not one of "
                         f"{', '.join(RECIPES)}") from None


def apply_recipe(program: Program, recipe: GpuRecipe, replicas: int = 1,
                 training: bool = True) -> Program:
    """`program` re-typed as `recipe` holds it (inference: weights and activations only).
    The result's model dict says which recipe it holds (`gpu_precision`), so a program
    rebuilt from a profile (tune) is not re-typed twice."""
    done = program.model.get("gpu_precision")
    if done == recipe.name or (recipe.half is None and done in (None, AS_RECORDED_NAME)):
        return program
    if done not in (None, AS_RECORDED_NAME):
        raise ValueError(f"this program is already held as GPU precision {done!r}; "
                         f"re-plan it as {done!r} or record it again for {recipe.name!r}")
    half = recipe.half
    assert half is not None  # as-recorded returned (or was refused) above
    t = program.tensors.copy()
    ops = program.ops.copy()
    dtype = t["dtype"].astype(str).to_numpy()
    size = np.array([ITEMSIZE.get(d, 0) for d in dtype], dtype=np.int64)
    floating = size > 0
    numel = np.where(floating, t["bytes"].to_numpy(np.int64) // np.maximum(size, 1), 0)
    cat = t["category"].astype(str).to_numpy()
    d = replicas if recipe.sharded else 1
    param = (cat == "parameter") & floating
    grad = (cat == "gradient") & floating
    scalar = t["shape"].astype(str).isin(["[]", "()", ""]).to_numpy()
    state = (cat == "optimiser_state") & floating & ~scalar  # Adam's `step` is on the host
    weights_dtype = recipe.half if recipe.weight_bytes == 2 else "float32"
    grads_dtype = recipe.half if recipe.grad_bytes == 2 else "float32"
    nbytes = t["bytes"].to_numpy(np.int64).copy()
    nbytes[param] = numel[param] * recipe.weight_bytes
    nbytes[grad] = numel[grad] * recipe.grad_bytes
    nbytes[state] = -(-numel[state] * recipe.state_bytes // d)
    new_dtype = dtype.astype(object)
    new_dtype[param], new_dtype[grad], new_dtype[state] = weights_dtype, grads_dtype, "float32"

    # activations and temporaries the forward / backward make: half (under autocast, the
    # dtype each op runs in is gpu_autocast.autocast_types's, applied after this)
    phase = ops["phase"].astype(str).to_numpy()
    half_op = np.isin(phase, COMPUTE_PHASES) & (ops["dtype"].astype(str).to_numpy()
                                                 == "float32") & (not recipe.cast_cache)
    half_ids = set(ops["op_id"].to_numpy(np.int64)[half_op].tolist())
    made_half = t["producer"].isin(half_ids).to_numpy()
    act = np.isin(cat, ("activation", "temporary")) & (dtype == "float32") & made_half
    nbytes[act] = numel[act] * 2
    new_dtype[act] = recipe.half
    for col in ("bytes_read", "bytes_written"):
        ops.loc[half_op, col] = ops.loc[half_op, col].to_numpy(np.int64) // 2
    ops.loc[half_op, "dtype"] = recipe.half
    t["bytes"], t["dtype"] = nbytes, new_dtype
    params, params_numel = t[param], numel[param]

    if recipe.fused_optimiser:  # Megatron's Adam (apex / TE FusedAdam) updates in place:
        # none of torch's foreach temporaries (sqrt(v), the bias-corrected step) exist
        wu_ids = ops.loc[phase == "optimiser", "op_id"]
        t = t[~((t["category"] == "temporary") & t["producer"].isin(wu_ids))] \
            .reset_index(drop=True)
    extra: list[pd.DataFrame] = []
    # new tensors numbered on from the program's own (ids stay dense: the reader bounds
    # them by the profile's rows, popviz.format.bounds)
    next_id = int(t["tensor_id"].max()) + 1 if len(t) else 0
    if recipe.master_bytes and training:
        extra.append(_master_copies(params, params_numel, recipe.master_bytes, d, next_id))
        next_id += len(extra[-1])
    if recipe.cast_cache and training:
        extra.append(_cast_copies(params, params_numel, ops, half, next_id))
    if extra:
        t = pd.concat([t, *extra], ignore_index=True)
    model = dict(program.model, gpu_precision=recipe.name)
    return Program(ops, t, model, program.mode)


def _synthetic(params: pd.DataFrame, suffix: str, nbytes: np.ndarray, dtype: str,
               category: str, first_id: int) -> pd.DataFrame:
    rows = params.copy()
    rows["tensor_id"] = np.arange(first_id, first_id + len(rows), dtype=np.int64)
    rows["name"] = rows["name"].astype(str) + suffix
    rows["bytes"] = nbytes.astype(np.int64)
    rows["dtype"] = dtype
    rows["category"] = category
    return rows


def _master_copies(params: pd.DataFrame, numel: np.ndarray, per: int, d: int,
                   first: int) -> pd.DataFrame:
    """Megatron's fp32 master weights: one per parameter (sharded over d with dist-opt),
    there before the step like the optimiser state."""
    rows = _synthetic(params, ".main_param", -(-numel * per // d), "float32",
                      "optimiser_state", first)
    rows["producer"] = -1
    rows["last_use"] = -1
    return rows


def _cast_copies(params: pd.DataFrame, numel: np.ndarray, ops: pd.DataFrame, half: str,
                 first: int) -> pd.DataFrame:
    """autocast's cast of each fp32 weight a GEMM reads: made by its first forward reader,
    saved for the backward (the input gradient reads it) and freed after its last backward
    reader, one per micro-batch (each micro-batch's forward is its own autocast region)."""
    ids = params["tensor_id"].to_numpy(np.int64)
    first_f: dict[int, int] = {}
    last_b: dict[int, int] = {}
    tensor_op = ops["op_class"].astype(str).isin(TENSOR_CLASSES).to_numpy()
    wanted = set(ids.tolist())
    for op_id, inputs, phase, gemm in zip(ops["op_id"].to_numpy(np.int64),
                                          ops["inputs"].astype(str), ops["phase"].astype(str),
                                          tensor_op, strict=True):
        if not gemm or not inputs:
            continue
        for tid in tensor_ids(inputs):
            if tid not in wanted:
                continue
            if phase == "forward":
                first_f.setdefault(tid, int(op_id))
            elif phase == "backward":
                last_b[tid] = int(op_id)
    keep = np.array([i in first_f and i in last_b for i in ids.tolist()], dtype=bool)
    rows = _synthetic(params[keep], f".{half}_cast", numel[keep] * 2, half, "activation",
                      first)
    rows["producer"] = [first_f[i] for i in ids[keep].tolist()]
    rows["last_use"] = [last_b[i] for i in ids[keep].tolist()]
    return rows


def state_bytes_per_param(tensors: pd.DataFrame) -> float | None:
    """Weights, gradients and optimiser state (master copies included) per parameter, as
    the program holds them (AdamW: 16 / 18 / 6 + 12/d; SGD with momentum: 4 fewer)."""
    cat = tensors["category"].astype(str)
    size = tensors["dtype"].astype(str).map(ITEMSIZE).fillna(0).to_numpy()
    param = (cat == "parameter").to_numpy() & (size > 0)
    numel = float((tensors["bytes"].to_numpy(np.float64)[param] / size[param]).sum())
    scalar = tensors["shape"].astype(str).isin(["[]", "()", ""]).to_numpy()
    state = cat.isin(["parameter", "gradient", "optimiser_state"]).to_numpy() & ~scalar
    return round(float(tensors["bytes"].to_numpy(np.float64)[state].sum()) / numel, 2) \
        if numel else None


def step_bytes_per_stage(tensors: pd.DataFrame, tensor_stage: np.ndarray, num_stages: int,
                         recipe: GpuRecipe, replicas: int = 1) -> np.ndarray:
    """Bytes each stage's optimiser step adds only while it runs (megatron-fp16: the fp32
    copies of the fp16 grads, 4 B/param): from the stage's parameters (already re-typed)."""
    out = np.zeros(num_stages, dtype=np.int64)
    per = recipe.step_bytes_per_param(replicas)
    if not per:
        return out
    param = (tensors["category"] == "parameter").to_numpy()
    numel = tensors["bytes"].to_numpy(np.int64)[param] // recipe.weight_bytes
    stage = np.minimum(tensor_stage[param], num_stages - 1)
    np.add.at(out, stage, np.ceil(numel * per).astype(np.int64))
    return out
