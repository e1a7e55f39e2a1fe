"""How CUDA runs what a CPU recording saw: kernels the recorded ops become on a GPU.

A recorded program is what PyTorch ran on the CPU. Some of it runs differently on CUDA,
whatever the precision recipe, and some differently under a recipe's framework:

- **Dropout** (every GPU plan). The CPU draws a float mask (`bernoulli_` into an
  `empty_like`, scaled by `div_`) and multiplies; CUDA's `native_dropout` is one kernel
  (`fused_dropout_kernel_vec` in a CUDA trace) that reads the input once and writes the
  output and a bool mask (1 B per element), which is what the backward keeps. The mask's
  draw and scale become part of that kernel (no bytes, no launch of their own); the
  kernel's path is `dropout`, timed by its Philox draws where they outlast its bytes
  (`GpuCost.dropout_cycles`).
- **Megatron's fused masked softmax** (the `megatron-*` recipes: `masked_softmax_fusion`,
  on by default; Megatron-LM `megatron/model/fused_softmax.py`,
  `ScaledUpperTriangMaskedSoftmax`). The scale and the causal mask before the attention's
  softmax run inside the softmax kernel, as does the scale's gradient after the softmax's
  backward. Plain PyTorch (eager attention) runs each as its own kernel.

Ops absorbed into a fused kernel keep their rows (the ops table still lists what the
program did) with no bytes, FLOPs or kernels of their own; the fused kernel's op carries
the bytes it moves.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.compiler.gpu_autocast import autocast_casts, autocast_types
from popviz.compiler.gpu_recipe import COMPUTE_PHASES, ITEMSIZE, GpuRecipe, tensor_ids
from popviz.recorder.program import Program

ELEMENTWISE_CHAIN = ("aten.mul.", "aten.div.", "aten.add.", "aten.sub.", "aten.where.",
                     "aten.masked_fill.")
VIEWS = ("aten._unsafe_view.", "aten.view.", "aten.reshape.", "aten.expand.")


def lower_for_cuda(program: Program, recipe: GpuRecipe) -> Program:
    """`program` (already held as `recipe`) as CUDA runs it: autocast's per-op dtypes
    (gpu_autocast.py) under `amp`, each dropout one kernel, Megatron's fused softmax under
    its recipes, and autocast's casts."""
    if recipe.cast_cache and recipe.half and "widen_kernels" not in program.ops:
        program = autocast_types(program, recipe.half)
    program = cuda_dropout(program)
    if recipe.fused_softmax:
        program = megatron_fused_softmax(program)
    if recipe.cast_cache:
        program = autocast_casts(program)
    return program


def cuda_dropout(program: Program) -> Program:
    """Each dropout as CUDA runs it (module docstring): a bool mask and one kernel."""
    ops, t = program.ops, program.tensors
    name = ops["op"].astype(str)
    phase = ops["phase"].astype(str).to_numpy()
    compute = np.isin(phase, COMPUTE_PHASES)
    draws = np.flatnonzero(name.str.startswith("aten.bernoulli_").to_numpy() & compute)
    if not len(draws):
        return program
    inputs = [tensor_ids(x) for x in ops["inputs"].to_numpy()]
    mask_of = {inputs[i][0]: i for i in draws if inputs[i]}
    names: list[str] = name.tolist()
    ops = ops.copy()
    read = ops["bytes_read"].to_numpy(np.int64).copy()
    written = ops["bytes_written"].to_numpy(np.int64).copy()
    flops = ops["flops"].to_numpy(np.int64).copy()
    op_dtype = ops["dtype"].astype(str).to_numpy()
    paths = ops["kernel_path"].astype(str).to_numpy(object).copy() if "kernel_path" in ops \
        else np.full(len(ops), "", dtype=object)
    absorbed = np.zeros(len(ops), dtype=bool)
    absorbed[draws] = True
    for i, ins in enumerate(inputs):
        if not compute[i] or phase[i] == "backward":
            continue  # the backward's mask multiply is native_dropout_backward: one kernel
        masks = [m for m in ins if m in mask_of]
        if not masks or absorbed[i]:
            continue
        if names[i].startswith("aten.div_.") and len(ins) == 1:
            absorbed[i] = True  # the mask's scale, drawn inside the kernel
        elif names[i].startswith("aten.mul.") and len(ins) == 2:
            size = max(ITEMSIZE.get(op_dtype[i], 4), 1)
            read[i] = written[i]  # the input, once
            written[i] = written[i] + written[i] // size  # the output and a bool mask
            paths[i] = "dropout"
    read[absorbed] = written[absorbed] = flops[absorbed] = 0
    ops["bytes_read"], ops["bytes_written"], ops["flops"] = read, written, flops
    ops["kernel_path"] = paths
    return Program(ops, _bool_masks(t, set(mask_of)), program.model, program.mode)


def _bool_masks(t: pd.DataFrame, mask_ids: set[int]) -> pd.DataFrame:
    dtype = t["dtype"].astype(str).to_numpy()
    size = np.array([ITEMSIZE.get(d, 0) for d in dtype], dtype=np.int64)
    mask = t["tensor_id"].isin(mask_ids).to_numpy() & (size > 1) & \
        t["category"].astype(str).isin(("activation", "temporary")).to_numpy()
    if not mask.any():
        return t
    t = t.copy()
    nbytes = t["bytes"].to_numpy(np.int64).copy()
    nbytes[mask] = nbytes[mask] // size[mask]
    new_dtype = t["dtype"].to_numpy(object).copy()
    new_dtype[mask] = "bool"
    t["bytes"], t["dtype"] = nbytes, new_dtype
    return t


def megatron_fused_softmax(program: Program) -> Program:
    """The scale and mask before each forward softmax, and the scale's gradient after each
    softmax backward, run inside the softmax kernel (module docstring)."""
    ops = program.ops
    name = ops["op"].astype(str)
    phase = ops["phase"].astype(str).to_numpy()
    inputs = [tensor_ids(x) for x in ops["inputs"].to_numpy()]
    outputs = [tensor_ids(x) for x in ops["outputs"].to_numpy()]
    producer: dict[int, int] = {}
    consumers: dict[int, list[int]] = {}
    for i, (ins, outs) in enumerate(zip(inputs, outputs, strict=True)):
        for tid in outs:
            if tid not in ins:  # an in-place op's output is its input: keep the maker
                producer.setdefault(tid, i)
        for tid in ins:
            consumers.setdefault(tid, []).append(i)
    nbytes = dict(zip(program.tensors["tensor_id"].to_numpy(np.int64).tolist(),
                      program.tensors["bytes"].to_numpy(np.int64).tolist(), strict=True))
    names: list[str] = name.tolist()
    written: list[int] = ops["bytes_written"].to_numpy(np.int64).tolist()
    absorbed = np.zeros(len(ops), dtype=bool)
    forward = np.flatnonzero(name.str.startswith(("aten._softmax.", "aten._safe_softmax."))
                             .to_numpy() & np.isin(phase, ("forward", "recompute")))
    for s in forward:
        size = written[s]
        tid = inputs[s][0] if inputs[s] else -1
        for _ in range(6):  # the scale, the mask and the views between them
            p = producer.get(tid)
            if p is None or phase[p] != phase[s] or len(consumers.get(tid, ())) != 1:
                break
            if names[p].startswith(VIEWS):
                tid = inputs[p][0] if inputs[p] else -1
                continue
            if not names[p].startswith(ELEMENTWISE_CHAIN) or written[p] != size:
                break
            absorbed[p] = True
            tid = max(inputs[p], key=lambda x: nbytes.get(x, 0)) if inputs[p] else -1
    backward = np.flatnonzero(name.str.startswith("aten._softmax_backward_data.").to_numpy()
                              & (phase == "backward"))
    for s in backward:
        users = [c for tid in outputs[s] for c in consumers.get(tid, ())]
        if len(users) == 1 and names[users[0]].startswith(ELEMENTWISE_CHAIN[:2]) and \
                written[users[0]] == written[s]:
            absorbed[users[0]] = True
    if not absorbed.any():
        return program
    ops = ops.copy()
    for col in ("bytes_read", "bytes_written", "flops"):
        values = ops[col].to_numpy(np.int64).copy()
        values[absorbed] = 0
        ops[col] = values
    return Program(ops, program.tensors, program.model, program.mode)
