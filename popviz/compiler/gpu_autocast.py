"""The dtype each op runs in under torch.autocast on CUDA (the `amp` recipe), from a CPU
recording that ran everything in fp32.

Autocast decides per op, not per model (PyTorch's autocast op lists, "CUDA Ops that can
autocast to float16 / float32", aten/src/ATen/autocast_mode.cpp):
- GEMMs, convolutions and fused attention run in half: their inputs are cast (weights once
  per forward, the cast cache) and their outputs are half;
- the ops on the fp32 list (layer and group norm, softmax and log-softmax, the losses, exp,
  log, pow, sum) cast half inputs up to fp32 and output fp32; batch norm is on no list and
  runs mixed (half activations, fp32 statistics, half output);
- every other op runs in its inputs' dtype, promoted: one fp32 input makes it fp32, the
  other inputs converted element by element inside its kernel (TensorIterator's unrolled
  path). A model's fp32 region therefore spreads from an fp32-list op through the
  element-wise ops after it until the next GEMM: GPT-2's embeddings and residual stream
  stay fp32 (embedding is on no list), and its MLP's tanh-GELU runs in fp32 after `pow`.
The backward runs in the dtypes of what the forward saved (GEMMs' gradients half, the rest
promoted), and the autograd engine casts each gradient to the dtype of the tensor it is the
gradient of: every cast of the forward has its mirror in the backward, and so has the
per-element conversion of each mixed-dtype op (its half operand's gradient comes back in
fp32 and is cast down). `autocast_types` propagates the dtypes through the program in order
and rewrites the ops' dtype and bytes, the activations' dtype and size, each mixed-dtype
element-wise op's kernel path, and the widening casts before each fp32-list op;
`autocast_casts` adds the narrowing casts before each GEMM (weights once per forward: the
cast cache) and every backward mirror. A narrowing cast (fp32 to half) has its own
vectorized kernel, memory-bound: columns `cast_kernels`, `cast_bytes`; a widening one runs
the unrolled kernel: `widen_kernels`, `widen_elements` (`gpu_op_costs` times both).
"""

from __future__ import annotations

import re

import numpy as np

from popviz.compiler.gpu_recipe import (
    AUTOCAST_FP32,
    COMPUTE_PHASES,
    ITEMSIZE,
    TENSOR_CLASSES,
    tensor_ids,
)
from popviz.recorder.program import Program

FLOATS = ("float32", "float16", "bfloat16")
SCALAR_SHAPES = ("[]", "()", "")
ATTENTION = re.compile(r"attention")
# batch norm runs mixed: half activations, fp32 weights and statistics, a half output
MIXED_NORM = re.compile(r"^aten\.(?:native_batch_norm|_native_batch_norm_legit"
                        r"|cudnn_batch_norm|batch_norm)")


def _with_cast(path: str) -> str:
    """A kernel path for the same op with an operand converted per element."""
    if path == "":
        return "cast"
    if path.startswith("strided:"):
        return "strided-cast:" + path.split(":", 1)[1]
    return path


def autocast_types(program: Program, half: str) -> Program:
    """`program` with every op and activation in the dtype autocast runs it in (module
    docstring). Parameters, gradients and optimiser state keep the recipe's dtypes."""
    ops, t = program.ops.copy(), program.tensors.copy()
    tids = t["tensor_id"].to_numpy(np.int64).tolist()
    dtype = dict(zip(tids, t["dtype"].astype(str).tolist(), strict=True))
    old_bytes = dict(zip(tids, t["bytes"].to_numpy(np.int64).tolist(), strict=True))
    # scalars do not promote (a 0-dim tensor yields to a dimensioned one), nor do empty
    # tensors (HF's cache starts from one made in the keys' own dtype, which the fp32
    # recording cannot show)
    scalar = {tid for tid, shape, size in zip(tids, t["shape"].astype(str),
                                              t["bytes"].to_numpy(np.int64), strict=True)
              if shape in SCALAR_SHAPES or size == 0}
    recorded = {tid: ITEMSIZE.get(d, 0) for tid, d in dtype.items()}  # 0: not floating
    category = t["category"].astype(str).to_numpy()
    typed = np.isin(category, ("activation", "temporary"))
    retypable = {tid for tid, ok in zip(tids, typed, strict=True) if ok}

    names = ops["op"].astype(str).tolist()
    classes = ops["op_class"].astype(str).tolist()
    phases = ops["phase"].astype(str).tolist()
    ins_of = [tensor_ids(x) for x in ops["inputs"].tolist()]
    outs_of = [tensor_ids(x) for x in ops["outputs"].tolist()]
    paths = ops["kernel_path"].astype(str).tolist() if "kernel_path" in ops else [""] * len(ops)
    op_dtype = ops["dtype"].astype(str).tolist()
    widen_kernels = np.zeros(len(ops))
    widen_elements = np.zeros(len(ops))
    order = np.argsort(ops["op_id"].to_numpy(np.int64), kind="stable")
    for i in order.tolist():
        if phases[i] not in COMPUTE_PHASES:
            continue
        ins, outs = ins_of[i], outs_of[i]
        floats = [dtype[x] for x in ins if dtype.get(x) in FLOATS and x not in scalar]
        lower = classes[i] in TENSOR_CLASSES or bool(ATTENTION.search(names[i]))
        fp32_op = bool(AUTOCAST_FP32.match(names[i]))
        if lower:
            runs = half
        elif fp32_op:
            runs = "float32"
            if phases[i] != "backward":  # autocast casts half inputs up before the op
                for x in ins:
                    if dtype.get(x) == half and x not in scalar:
                        widen_kernels[i] += 1
                        widen_elements[i] += old_bytes.get(x, 0) // max(recorded[x], 1)
        elif floats and MIXED_NORM.match(names[i]):
            runs = floats[0]  # the activation's (or its gradient's) dtype, fp32 statistics
        elif floats:
            runs = "float32" if "float32" in floats else half
            if len(set(floats)) > 1:
                paths[i] = _with_cast(paths[i])
        else:
            continue  # no floating input: made in the dtype it was recorded in
        op_dtype[i] = runs
        for x in outs:
            if x in retypable and x not in ins and dtype.get(x) in FLOATS:
                dtype[x] = runs

    # sizes follow the dtypes: activations, then the bytes each op moves
    itemsize = {tid: ITEMSIZE.get(dtype[tid], 0) for tid in tids}
    new_bytes = {tid: (old_bytes[tid] // recorded[tid] * itemsize[tid]
                       if tid in retypable and recorded[tid] and itemsize[tid]
                       else old_bytes[tid])
                 for tid in tids}
    t["dtype"] = [dtype[x] for x in tids]
    t["bytes"] = np.array([new_bytes[x] for x in tids], dtype=np.int64)
    for col, lists in (("bytes_read", ins_of), ("bytes_written", outs_of)):
        values = ops[col].to_numpy(np.int64).copy()
        for i, members in enumerate(lists):
            before = sum(old_bytes.get(x, 0) for x in members)
            if values[i] and before:
                after = sum(new_bytes.get(x, 0) for x in members)
                values[i] = int(values[i] * (after / before))
        ops[col] = values
    ops["dtype"] = op_dtype
    ops["kernel_path"] = paths
    ops["widen_kernels"] = widen_kernels
    ops["widen_elements"] = widen_elements
    return Program(ops, t, program.model, program.mode)


def autocast_casts(program: Program) -> Program:
    """The casts autocast and the autograd engine launch (module docstring), on the op
    that needs each: forward, a GEMM's fp32 inputs cast down (each weight once: the cast
    cache); backward, each such weight's gradient cast up for `.grad` (on the op that makes
    it), each activation's cast's mirror and each forward widening's and mixed-dtype op's
    mirror (on the first backward op of the forward op's module). In the H200 bf16 GPT-2
    small step: 134 narrowing and 13 widening casts forward, 134 widening and 61 narrowing
    backward, as the trace shows them."""
    ops, t = program.ops, program.tensors
    tids = t["tensor_id"].to_numpy(np.int64).tolist()
    dtype = dict(zip(tids, t["dtype"].astype(str).tolist(), strict=True))
    nbytes = dict(zip(tids, t["bytes"].to_numpy(np.int64).tolist(), strict=True))
    category = dict(zip(tids, t["category"].astype(str).tolist(), strict=True))
    names = ops["op"].astype(str)
    # GEMMs and convolutions (autocast's lower-precision list; fused attention takes half
    # inputs from GEMMs already)
    gemm = ops["op_class"].astype(str).isin(TENSOR_CLASSES).to_numpy() & \
        ~names.str.contains("attention").to_numpy()
    phase = ops["phase"].astype(str).to_numpy()
    modules = ops["module"].astype(str).tolist()
    kernels = np.zeros(len(ops))
    moved = np.zeros(len(ops), dtype=np.int64)
    widen_k = ops["widen_kernels"].to_numpy(np.float64).copy() if "widen_kernels" in ops \
        else np.zeros(len(ops))
    widen_e = ops["widen_elements"].to_numpy(np.float64).copy() if "widen_elements" in ops \
        else np.zeros(len(ops))
    first_backward: dict[str, int] = {}
    for i in np.flatnonzero(phase == "backward").tolist():
        first_backward.setdefault(modules[i], i)
    op_inputs = [tensor_ids(x) for x in ops["inputs"].tolist()]

    def numel(tid: int) -> int:
        return nbytes.get(tid, 0) // max(ITEMSIZE.get(dtype.get(tid, ""), 4), 1)

    def backward_of(module: str) -> int | None:
        """The first backward op of `module`, else of a module inside it (a block's own
        residual add has no backward kernel of its own)."""
        if module not in first_backward:
            inside = [i for m, i in first_backward.items() if m.startswith(module + ".")]
            first_backward[module] = min(inside) if inside else -1
        found = first_backward[module]
        return None if found < 0 else found

    def mirror(i: int, elements: int, widen: bool) -> None:
        j = backward_of(modules[i])
        if j is None or elements <= 0:
            return
        if widen:
            widen_k[j] += 1
            widen_e[j] += elements
        else:
            kernels[j] += 1
            moved[j] += elements * 6  # read fp32, write half

    cached: set[int] = set()
    forward = np.isin(phase, ("forward", "recompute"))
    for i in np.flatnonzero(gemm & forward).tolist():
        for tid in op_inputs[i]:
            if dtype.get(tid) != "float32" or tid in cached:
                continue
            if category.get(tid) == "parameter":
                cached.add(tid)  # the cast cache: once per forward; its mirror is below
            elif phase[i] == "forward" and category.get(tid) in ("activation", "temporary"):
                mirror(i, numel(tid), widen=True)  # the activation's gradient, cast up
            kernels[i] += 1
            moved[i] += nbytes[tid] + nbytes[tid] // 2  # read fp32, write half
    paths = ops["kernel_path"].astype(str).tolist() if "kernel_path" in ops \
        else [""] * len(ops)
    for i in np.flatnonzero(phase == "forward").tolist():
        if widen_k[i] > 0:  # an fp32-list op's input cast up: its gradient cast down
            mirror(i, int(widen_e[i]), widen=False)
        if paths[i] == "cast" or paths[i].startswith("strided-cast"):
            for tid in op_inputs[i]:  # a mixed op's half operands: gradients cast down
                if dtype.get(tid) in ("float16", "bfloat16") and \
                        category.get(tid) in ("activation", "temporary"):
                    mirror(i, numel(tid), widen=False)
    # the gradient of each cast weight comes back in half: its op's output is cast up to
    # fp32 for `.grad` (AccumulateGrad); gradients are named after their parameter
    cast_names = set(t.loc[t["tensor_id"].isin(cached), "name"].astype(str))
    row_of = {int(op): i for i, op in enumerate(ops["op_id"].to_numpy(np.int64).tolist())}
    grads = t[(t["category"].astype(str) == "gradient").to_numpy()
              & (t["dtype"].astype(str) == "float32").to_numpy()]
    for name, producer, size in zip(grads["name"].astype(str), grads["producer"],
                                    grads["bytes"].to_numpy(np.int64), strict=True):
        i = row_of.get(int(producer), -1)
        if name.removesuffix(".grad") in cast_names and i >= 0 and phase[i] == "backward":
            widen_k[i] += 1
            widen_e[i] += int(size) // 4
    ops = ops.assign(cast_kernels=kernels, cast_bytes=moved, widen_kernels=widen_k,
                     widen_elements=widen_e)
    return Program(ops, t, program.model, program.mode)
